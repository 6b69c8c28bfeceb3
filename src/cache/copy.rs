//! Copies between tiers: a cached prefix's KV moved from the tier that
//! holds it (the host tier, or another device) into pages of the tier that
//! wants it, instead of being recomputed there.
//!
//! ```text
//!  plan (copy_prefix / Request::copy_from)      complete            (or drop)
//!    │ pin the source's prefix (a Lease)           │ insert on the      │ pages back to
//!    │ pin the destination's prefix                │ destination:       │ the destination's
//!    │ pages on the destination for the rest       │ resident there,    │ allocator, pins
//!    ▼                                             │ duplicates freed,  │ released: the
//!  the caller moves the KV, run by run (`runs`)    │ pins released      │ cache as before
//! ```
//!
//! The source pages cannot be evicted (and so cannot be reused for other
//! data) while the copy exists: its lease pins them, as a match's pins the
//! pages a request reads. The destination pages belong to the copy until
//! it completes, so no reader can see them before they hold the KV. If
//! another scheduler made the same prefix resident on the destination
//! meanwhile, completing keeps that one and frees the copy's pages (they
//! are duplicates, as for any concurrent insert).

use super::ownership::OwnedPages;
use super::{CacheError, InsertResult, Lease, PagedCache, RadixCache, Request, TokenKey};
use crate::alloc::PageSpan;
use crate::device::Tier;
use crate::sync::Arc;
use crate::tree::ops::attach::Writer;
use crate::tree::ops::insert::Insert;
use std::ops::Range;

/// One contiguous run of a copy: `len` slots starting at `src` on the
/// source tier go to `len` slots starting at `dst` on the destination.
/// A copy engine moves one run per transfer (pages allocated together are
/// contiguous, so a run is usually many pages), not one per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRun {
    /// First slot on the source tier.
    pub src: u32,
    /// First slot on the destination tier.
    pub dst: u32,
    /// Slots (tokens) in the run.
    pub len: u32,
}

/// A planned copy of tokens `range` of a key from one tier to another; see
/// the module docs. Dropping it cancels the copy (nothing changes in the
/// tree; its pages go back, its pins are released).
///
/// ```
/// use radixkv::{DeviceId, RadixCache, TokenKey};
/// use std::sync::Arc;
/// let c = Arc::new(RadixCache::builder().page_size(2).devices(2).pages_per_device(16).build()?);
/// let key = [1, 2, 3, 4, 5, 6];
/// let span = c.alloc(DeviceId(0), 6)?;
/// c.insert_pages(TokenKey::new(&key), span, 0)?;
/// // Device 1 wants the prefix: copy it from device 0 instead of computing it.
/// let copy = c.copy_prefix(TokenKey::new(&key), DeviceId(0), DeviceId(1))?.unwrap();
/// assert_eq!(copy.range(), 0..6);
/// for run in copy.runs() {
///     // move run.len tokens' KV from slot run.src on device 0 to run.dst on device 1
///     assert!(run.len > 0);
/// }
/// copy.complete()?;
/// assert_eq!(c.peek(TokenKey::new(&key)), vec![6, 6]);
/// c.audit();
/// # Ok::<(), radixkv::CacheError>(())
/// ```
#[derive(Debug)]
#[must_use = "a copy does nothing until it is completed; dropping it cancels it"]
pub struct PrefixCopy {
    cache: Arc<PagedCache>,
    namespace: Option<Box<str>>,
    /// The key up to the end of the copied range.
    tokens: Vec<u32>,
    source: Tier,
    dest: Tier,
    range: Range<usize>,
    /// The source's slots of `range`, read after the source pin succeeded.
    source_slots: Vec<u32>,
    /// Pins the source's prefix `0..range.end` while the copy lives
    /// ([`copy_source_pin`]).
    _source_lease: Option<Lease>,
    /// The destination's slots of `0..range.start` (its cached prefix).
    dest_prefix: Vec<u32>,
    /// Pins the destination's prefix, when the copy took that pin itself
    /// (a request's copy borrows the request's own pin instead).
    _dest_lease: Option<Lease>,
    /// The destination pages for `range`, the copy's own until it completes.
    pages: PageSpan,
}

impl RadixCache<OwnedPages> {
    /// Plans a copy of the part of `key` (whole pages) that `source` holds
    /// beyond what `dest` holds: pins both prefixes and allocates the
    /// destination's pages for the difference (evicting on `dest` if it is
    /// short, never the pinned prefix). `Ok(None)` when `source` holds no
    /// more of the key than `dest`. `source` and `dest` are devices or the
    /// host tier.
    pub fn copy_prefix(
        self: &Arc<Self>,
        key: TokenKey<'_>,
        source: impl Into<Tier>,
        dest: impl Into<Tier>,
    ) -> Result<Option<PrefixCopy>, CacheError> {
        let (source, dest) = (source.into(), dest.into());
        self.check_copy(source, dest)?;
        let dest_match = self.match_and_pin(key, dest)?;
        self.plan_copy(
            key,
            source,
            dest,
            dest_match.len,
            dest_match.values,
            dest_match.lease,
        )
    }

    pub(super) fn check_copy(&self, source: Tier, dest: Tier) -> Result<(), CacheError> {
        self.slot(source)?;
        self.slot(dest)?;
        if source == dest {
            return Err(CacheError::CopyToItself(source));
        }
        Ok(())
    }

    /// The common part of a copy: pin the source's longer prefix, read its
    /// slots, allocate the destination's pages.
    fn plan_copy(
        self: &Arc<Self>,
        key: TokenKey<'_>,
        source: Tier,
        dest: Tier,
        dest_len: usize,
        dest_prefix: Vec<u32>,
        dest_lease: Option<Lease>,
    ) -> Result<Option<PrefixCopy>, CacheError> {
        let src = self.match_and_pin(key, source)?;
        if src.len <= dest_len {
            return Ok(None);
        }
        let source_lease = copy_source_pin(src.lease);
        let range = dest_len..src.len;
        let pages = self.alloc(dest, range.len())?;
        Ok(Some(PrefixCopy {
            cache: Arc::clone(self),
            namespace: key.namespace.map(Box::from),
            tokens: key.tokens[..src.len].to_vec(),
            source,
            dest,
            source_slots: src.values[range.clone()].to_vec(),
            range,
            _source_lease: source_lease,
            dest_prefix,
            _dest_lease: dest_lease,
            pages,
        }))
    }
}

impl PrefixCopy {
    /// The tier the KV comes from.
    pub fn source(&self) -> Tier {
        self.source
    }

    /// The tier the KV goes to.
    pub fn dest(&self) -> Tier {
        self.dest
    }

    /// The tokens of the key the copy moves (whole pages).
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// The source's slot of every copied token, in order.
    pub fn source_slots(&self) -> &[u32] {
        &self.source_slots
    }

    /// The destination's slot of every copied token, in order.
    pub fn dest_slots(&self) -> Vec<u32> {
        self.pages.slots().collect()
    }

    /// The copy as contiguous runs of (source slot, destination slot):
    /// consecutive tokens whose slots both advance by one share a run.
    pub fn runs(&self) -> Vec<SlotRun> {
        let mut out: Vec<SlotRun> = Vec::new();
        for (&s, d) in self.source_slots.iter().zip(self.pages.slots()) {
            match out.last_mut() {
                Some(r)
                    if r.src.checked_add(r.len) == Some(s)
                        && r.dst.checked_add(r.len) == Some(d) =>
                {
                    r.len += 1
                }
                _ => out.push(SlotRun {
                    src: s,
                    dst: d,
                    len: 1,
                }),
            }
        }
        out
    }

    /// Makes the copied tokens resident on the destination (call it once
    /// the KV is in the destination slots): the destination's pages for
    /// tokens another scheduler made resident there meanwhile go back to
    /// its allocator; the pins are released.
    pub fn complete(self) -> Result<InsertResult, CacheError> {
        self.finish(false).map(|(r, _, _)| r)
    }

    /// As [`complete`](Self::complete), and pins the new end on the
    /// destination: the lease and the path's slots (read after the pin).
    fn finish(self, pin: bool) -> Result<(InsertResult, Option<Lease>, Vec<u32>), CacheError> {
        copy_frees_dups(self, pin)
    }
}

/// The protecting step `copy_source_pin` (models `copy_vs_evict_source`,
/// `write_back_vs_evict`): a copy holds the pin on the source's prefix
/// (`lease`) for its whole life, so the source pages cannot be evicted
/// (freed, reused) before it completes or is cancelled. Its control drops
/// the pin as soon as the slots are read.
fn copy_source_pin(lease: Option<Lease>) -> Option<Lease> {
    if crate::negative::removed("copy_source_pin") {
        drop(lease);
        return None;
    }
    lease
}

/// The protecting step `copy_frees_dups` (model
/// `copy_completion_vs_insert_on_dest`): completing a copy is the general
/// chunk insert, which gives the pages the tree did not adopt (another
/// scheduler made the prefix resident first) back to the destination's
/// allocator. The source and destination pins (the copy's fields) are
/// released when `copy` drops at the end, after the insert. Its control
/// makes the copied pages resident without looking at what the tree
/// adopted, so duplicates leak (I2).
fn copy_frees_dups(
    copy: PrefixCopy,
    pin: bool,
) -> Result<(InsertResult, Option<Lease>, Vec<u32>), CacheError> {
    let key = TokenKey::new(&copy.tokens).in_namespace(copy.namespace.as_deref());
    if crate::negative::removed("copy_frees_dups") {
        let mut values = copy.dest_prefix.clone();
        values.extend(copy.pages.slots());
        let t = copy.cache.slot(copy.dest)?;
        let guard = crossbeam_epoch::pin();
        let insert = Insert {
            ns: key.namespace,
            tokens: key.tokens,
            values: &values,
            writer: Writer {
                tier: t,
                priority: 0,
                pin: false,
                count_from: None,
            },
        };
        let w = copy.cache.tree.insert(insert, &guard);
        // The pages leave the copy's span without going back or to the tree.
        let _ = copy.pages.into_owned_pages();
        let _ = pin;
        return Ok((
            InsertResult::from_adopted(w.adopted, copy.tokens.len()),
            None,
            Vec::new(),
        ));
    }
    // A copy is not a request's insert: it counts every node it passes.
    copy.cache
        .insert_chunk_pinned(key, &copy.dest_prefix, copy.pages, (0, 0), pin)
}

/// A copy into a request's own pages ([`Request::copy_from`]): completing
/// it extends the request's cached prefix by the copied tokens, pinned.
/// Dropping it cancels the copy and leaves the request as it was.
#[derive(Debug)]
#[must_use = "a copy does nothing until it is completed; dropping it cancels it"]
pub struct RequestCopy<'r> {
    request: &'r mut Request,
    copy: PrefixCopy,
}

impl std::ops::Deref for RequestCopy<'_> {
    type Target = PrefixCopy;
    fn deref(&self) -> &PrefixCopy {
        &self.copy
    }
}

impl RequestCopy<'_> {
    /// Makes the copied tokens resident on the request's device and part
    /// of its cached prefix (pinned; the old pin is released after the new
    /// one is held). Returns what the insert did.
    pub fn complete(self) -> Result<InsertResult, CacheError> {
        let (r, lease, slots) = self.copy.finish(true)?;
        if let Some(lease) = lease {
            self.request.adopt_prefix(slots, lease);
        }
        Ok(r)
    }
}

impl Request {
    /// Plans copying into this request the part of its tokens that
    /// `source` (the host tier or another device) holds beyond the
    /// request's cached prefix, up to but not including the last token (as
    /// [`RadixCache::begin`], at least one token is computed). Call it
    /// before [`reserve`](Self::reserve): `Ok(None)` when the source holds
    /// no more, or when the request already owns pages.
    ///
    /// ```
    /// use radixkv::{DeviceId, RadixCache, Tier, TokenKey};
    /// use std::sync::Arc;
    /// let c = Arc::new(
    ///     RadixCache::builder().page_size(2).pages_per_device(16).host_pages(64).build()?,
    /// );
    /// let host = Tier::Host;
    /// let key = [1, 2, 3, 4, 5];
    /// let span = c.alloc(host, 4)?;
    /// c.insert_pages(TokenKey::new(&key[..4]), span, 0)?; // on the host only
    /// let mut r = c.begin(TokenKey::new(&key), DeviceId(0))?;
    /// assert_eq!(r.cached_len(), 0);
    /// let copy = r.copy_from(host)?.unwrap();
    /// assert_eq!(copy.range(), 0..4);
    /// copy.complete()?; // (after moving the KV run by run)
    /// assert_eq!(r.cached_len(), 4); // loaded, not recomputed
    /// r.reserve()?; // the last token's page
    /// r.finish()?;
    /// c.audit();
    /// # Ok::<(), radixkv::CacheError>(())
    /// ```
    pub fn copy_from(
        &mut self,
        source: impl Into<Tier>,
    ) -> Result<Option<RequestCopy<'_>>, CacheError> {
        let source = source.into();
        let cache = Arc::clone(self.cache());
        cache.check_copy(source, self.device().into())?;
        if self.backed_len() > self.cached_len() {
            return Ok(None);
        }
        let n = self.tokens().len().saturating_sub(1);
        let ns = self.namespace().map(Box::<str>::from);
        let tokens = self.tokens()[..n].to_vec();
        let key = TokenKey::new(&tokens).in_namespace(ns.as_deref());
        let copy = cache.plan_copy(
            key,
            source,
            self.device().into(),
            self.cached_len(),
            self.cached_slots().to_vec(),
            None,
        )?;
        Ok(copy.map(|copy| RequestCopy {
            request: self,
            copy,
        }))
    }
}
