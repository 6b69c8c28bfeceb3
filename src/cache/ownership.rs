//! Who owns the values a cache holds, as a type: [`CallerValues`] (the
//! caller allocates KV slots and inserts their indices, as SGLang's
//! `RadixCache` over its own allocator) or [`OwnedPages`] (the cache owns a
//! page allocator per tier: requests allocate [`PageSpan`]s, eviction
//! returns pages). A [`RadixCache`](super::RadixCache) is generic over it,
//! so inserting plain values into a cache that owns its pages, or
//! allocating from one that does not, does not compile.
//!
//! [`PageSpan`]: crate::alloc::PageSpan

use crate::alloc::PageAllocator;
use crate::sync::{Arc, AtomicU64, Ordering};

/// How a cache's values are owned: [`CallerValues`] or [`OwnedPages`]
/// (sealed: no other kind exists). What every cache does (match, pin,
/// peek, evict, sizes) is on `RadixCache<P>` for any `P`; what only one
/// kind can do is on that kind's cache alone.
///
/// ```
/// use radixkv::{DeviceId, Ownership, RadixCache, TokenKey};
/// // Works on either kind of cache.
/// fn cached<P: Ownership>(c: &RadixCache<P>, tokens: &[u32]) -> usize {
///     c.match_prefix(TokenKey::new(tokens), DeviceId(0)).unwrap().len
/// }
/// let plain = RadixCache::builder().build().unwrap();
/// plain.insert(TokenKey::new(&[1, 2]), DeviceId(0), &[8, 9], 0).unwrap();
/// let paged = RadixCache::builder().pages_per_device(8).build().unwrap();
/// let span = paged.alloc(DeviceId(0), 2).unwrap();
/// paged.insert_pages(TokenKey::new(&[1, 2]), span, 0).unwrap();
/// assert_eq!((cached(&plain, &[1, 2]), cached(&paged, &[1, 2])), (2, 2));
/// ```
///
/// A cache that owns its pages takes spans (`insert_pages`), not values:
///
/// ```compile_fail,E0599
/// use radixkv::{DeviceId, RadixCache, TokenKey};
/// let paged = RadixCache::builder().pages_per_device(64).build().unwrap();
/// paged.insert(TokenKey::new(&[1, 2]), DeviceId(0), &[5, 6], 0);
/// ```
///
/// and a cache whose values come from the caller has no pages to hand out:
///
/// ```compile_fail,E0599
/// use radixkv::{DeviceId, RadixCache};
/// let plain = RadixCache::builder().build().unwrap();
/// plain.alloc(DeviceId(0), 16);
/// ```
pub trait Ownership: sealed::Sealed + Send + Sync + std::fmt::Debug + 'static {}

/// The values of a cache come from the caller (KV slot indices of the
/// caller's own allocator): [`RadixCache::insert`](super::RadixCache::insert)
/// takes them, and eviction returns them ([`Evicted::values`](super::Evicted::values)).
/// The default kind of [`RadixCache`](super::RadixCache).
#[derive(Debug, Default)]
pub struct CallerValues {
    _private: (),
}

/// The cache owns its pages: a page allocator per tier
/// ([`RadixCacheBuilder::pages_per_device`](super::RadixCacheBuilder::pages_per_device)),
/// requests ([`Request`](super::Request)), copies between tiers
/// ([`PrefixCopy`](super::PrefixCopy)), the background evictor. Eviction
/// returns pages to the allocators.
#[derive(Debug)]
pub struct OwnedPages {
    /// One per tier: the devices, then the host tier if any.
    pub(super) allocators: Box<[Arc<PageAllocator>]>,
    /// The watermarks the cache was built with, if any.
    #[cfg_attr(loom, allow(dead_code))] // read only by the evictor, absent under loom
    pub(super) watermarks: Option<(usize, usize)>,
    /// The watermarks now (low, high), moved by `set_watermarks`; the
    /// evictor reads them on every pass.
    pub(super) levels: (AtomicU64, AtomicU64),
    /// The allocators' low-watermark signal, until an evictor takes it. A
    /// std mutex (not the shim's): touched once, by `start_evictor`.
    #[cfg_attr(loom, allow(dead_code))] // read only by the evictor, absent under loom
    pub(super) evictor_signal: std::sync::Mutex<Option<std::sync::mpsc::Receiver<usize>>>,
}

impl OwnedPages {
    /// The watermarks now, if the cache has them.
    pub(super) fn levels(&self) -> Option<(usize, usize)> {
        self.watermarks.map(|_| {
            // SeqCst: read once per evictor pass; a pair of stores in the
            // order `set_watermarks` chooses never shows low >= high.
            (
                self.levels.0.load(Ordering::SeqCst) as usize,
                self.levels.1.load(Ordering::SeqCst) as usize,
            )
        })
    }
}

impl Ownership for CallerValues {}
impl Ownership for OwnedPages {}

pub(super) mod sealed {
    use crate::alloc::PageAllocator;
    use crate::sync::Arc;

    /// What the cache's shared code asks of its kind of ownership.
    pub trait Sealed {
        /// The page allocator of tier slot `t`, when the cache owns pages.
        fn allocator_of(&self, t: usize) -> Option<&Arc<PageAllocator>>;
    }

    impl Sealed for super::CallerValues {
        fn allocator_of(&self, _t: usize) -> Option<&Arc<PageAllocator>> {
            None
        }
    }

    impl Sealed for super::OwnedPages {
        fn allocator_of(&self, t: usize) -> Option<&Arc<PageAllocator>> {
            self.allocators.get(t)
        }
    }
}
