//! Per-device paged allocators and owned page spans.
//!
//! A device's KV memory is `num_pages` pages of `page_size` token slots;
//! token `j` of page `p` lives in slot `p * page_size + j`. Page 0 is
//! reserved (as in SGLang, for padding writes) and never handed out.
//!
//! # Concurrency and cost
//!
//! The free set is a bitmap (bit set = free) of `AtomicU64` words plus a
//! free-page counter. An allocation first reserves its page count on the
//! counter (one CAS; failure says how many pages are missing), then claims
//! bits word by word, taking as many as it needs from a word with one CAS,
//! so allocating or freeing `n` pages costs about `n / 64` atomics, not
//! `n`. Because frees set bits *before* they raise the counter, a reserved
//! claim always finds enough set bits. The device's scheduler, the evictor
//! and other schedulers may allocate and free concurrently; nothing locks.
//!
//! | atomic | ordering | the edge it carries |
//! | --- | --- | --- |
//! | `free` (reserve: `fetch_update`; free: `fetch_add`) | SeqCst | a free sets its bits, then raises the count; a claimer reserves from the count, then looks for bits: the RMWs on `free` carry the bits to the claimer (a release/acquire pair would) |
//! | bitmap words (claim CAS, free `fetch_or`, loads) | SeqCst | a page is handed out once: the claim is a CAS from the word it read (`claim_cas`), a free a single RMW |
//! | `cursor` | Relaxed | only where the next scan starts; a stale one only scans further |
//! | `in_spans`, `double_frees` | SeqCst | counts read by the audit in quiescent state; no edge |
//! | `low_watermark`, `below` | SeqCst | the watermark signal: `below`'s swap makes one signal per crossing whatever the interleaving; rare |
//!
//! On x86-64 the RMWs and loads compile to the same instructions at
//! AcqRel or Acquire; only the rare stores of the watermark would change,
//! so nothing here was weakened.
//!
//! # Reuse order
//!
//! Next fit: a claim scans from a rotating cursor (the word after the
//! previous claim's last word), taking the lowest free pages of each word.
//! A freed page is therefore reused only after the cursor wraps around the
//! pool, which spreads reuse and makes a stale use of a freed page more
//! likely to be caught by the ownership checks in the tests.
//!
//! ```
//! use radixkv::alloc::PageAllocator;
//! use radixkv::DeviceId;
//! let a = PageAllocator::new(DeviceId(0), 64, 16).unwrap();
//! assert_eq!(a.tier(), DeviceId(0).into());
//! assert_eq!(a.free_pages(), 63); // page 0 is reserved
//! let span = a.alloc(40).unwrap(); // 40 tokens: 3 pages
//! assert_eq!(span.len(), 3);
//! assert_eq!(span.slots().count(), 48);
//! assert_eq!(a.free_pages(), 60);
//! drop(span); // returns its pages
//! assert_eq!(a.free_pages(), 63);
//! assert!(a.alloc(64 * 16).is_err());
//! ```

use crate::device::Tier;
use crate::sync::{Arc, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::fmt;

/// Allocation failures.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// Not enough free pages.
    #[error("{tier}: {wanted} pages wanted, {free} free ({missing} missing)")]
    OutOfPages {
        /// The tier.
        tier: Tier,
        /// Pages asked for.
        wanted: usize,
        /// Pages free at the time.
        free: usize,
        /// `wanted - free`.
        missing: usize,
    },
    /// A pool that cannot exist.
    #[error("invalid pool: {0}")]
    InvalidPool(String),
}

/// Called with the tier and its free page count when the free count falls
/// below the low watermark (once per crossing).
pub type WatermarkListener = Arc<dyn Fn(Tier, usize) + Send + Sync>;

/// The page allocator of one tier (a device, or the host tier). Share it
/// with `Arc`.
pub struct PageAllocator {
    tier: Tier,
    num_pages: usize,
    page_size: usize,
    words: Box<[AtomicU64]>,
    free: AtomicUsize,
    cursor: AtomicUsize,
    in_spans: AtomicUsize,
    double_frees: AtomicU64,
    low_watermark: AtomicUsize,
    below: AtomicBool,
    listener: Option<WatermarkListener>,
}

impl fmt::Debug for PageAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PageAllocator")
            .field("tier", &self.tier)
            .field("num_pages", &self.num_pages)
            .field("page_size", &self.page_size)
            .field("free", &self.free_pages())
            .field("double_frees", &self.double_frees())
            .finish()
    }
}

impl PageAllocator {
    /// A pool of `num_pages` pages (page 0 reserved) of `page_size` slots.
    pub fn new(
        tier: impl Into<Tier>,
        num_pages: usize,
        page_size: usize,
    ) -> Result<Arc<Self>, AllocError> {
        Self::with_watermark(tier, num_pages, page_size, 0, None)
    }

    /// Like [`new`](Self::new), calling `listener` whenever an allocation
    /// takes the free page count below `low_watermark` (edge-triggered: once
    /// per crossing; frees that bring it back re-arm it).
    pub fn with_watermark(
        tier: impl Into<Tier>,
        num_pages: usize,
        page_size: usize,
        low_watermark: usize,
        listener: Option<WatermarkListener>,
    ) -> Result<Arc<Self>, AllocError> {
        if num_pages < 2 || num_pages > u32::MAX as usize {
            return Err(AllocError::InvalidPool(format!(
                "{num_pages} pages (need 2..=2^32-1: page 0 is reserved)"
            )));
        }
        if page_size == 0
            || num_pages
                .checked_mul(page_size)
                .is_none_or(|s| s > u32::MAX as usize)
        {
            return Err(AllocError::InvalidPool(format!(
                "{num_pages} pages of {page_size} slots do not fit 32-bit slot ids"
            )));
        }
        let words = (0..num_pages.div_ceil(64))
            .map(|w| {
                let lo = w * 64;
                let hi = (lo + 64).min(num_pages);
                let mut bits = if hi - lo == 64 {
                    u64::MAX
                } else {
                    (1u64 << (hi - lo)) - 1
                };
                if w == 0 {
                    bits &= !1; // page 0 is reserved
                }
                AtomicU64::new(bits)
            })
            .collect();
        Ok(Arc::new(PageAllocator {
            tier: tier.into(),
            num_pages,
            page_size,
            words,
            free: AtomicUsize::new(num_pages - 1),
            cursor: AtomicUsize::new(0),
            in_spans: AtomicUsize::new(0),
            double_frees: AtomicU64::new(0),
            low_watermark: AtomicUsize::new(low_watermark),
            below: AtomicBool::new(false),
            listener,
        }))
    }

    /// The tier whose pages these are.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// Pages in the pool, page 0 included.
    pub fn num_pages(&self) -> usize {
        self.num_pages
    }

    /// Token slots per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Moves the low watermark (the background evictor's wake-up level) to
    /// `pages` free pages; a crossing from now on signals at the new level.
    pub fn set_low_watermark(&self, pages: usize) {
        self.low_watermark.store(pages, Ordering::SeqCst);
        // Re-armed: the next allocation below the new level signals.
        self.below.store(false, Ordering::SeqCst);
    }

    /// Free pages now.
    pub fn free_pages(&self) -> usize {
        self.free.load(Ordering::SeqCst)
    }

    /// Pages held by live [`PageSpan`]s (requests).
    pub fn pages_in_spans(&self) -> usize {
        self.in_spans.load(Ordering::SeqCst)
    }

    /// Frees of pages that were already free (or not pages of this pool).
    pub fn double_frees(&self) -> u64 {
        self.double_frees.load(Ordering::SeqCst)
    }

    /// Whether `page` is free now.
    pub fn is_free(&self, page: u32) -> bool {
        let p = page as usize;
        p < self.num_pages && self.words[p / 64].load(Ordering::SeqCst) & (1 << (p % 64)) != 0
    }

    /// Allocates whole pages for `tokens` tokens.
    pub fn alloc(self: &Arc<Self>, tokens: usize) -> Result<PageSpan, AllocError> {
        let pages = self.take(tokens.div_ceil(self.page_size))?;
        self.in_spans.fetch_add(pages.len(), Ordering::SeqCst);
        Ok(PageSpan {
            alloc: Arc::clone(self),
            pages,
        })
    }

    /// Claims `n` pages.
    fn take(&self, n: usize) -> Result<Vec<u32>, AllocError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        // Reserve the count first: then enough set bits exist for us.
        let reserved = self
            .free
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(n));
        let before = match reserved {
            Ok(before) => before,
            Err(free) => {
                return Err(AllocError::OutOfPages {
                    tier: self.tier,
                    wanted: n,
                    free,
                    missing: n - free,
                })
            }
        };
        self.watch(before - n);
        let mut out = Vec::with_capacity(n);
        let nwords = self.words.len();
        let mut w = self.cursor.load(Ordering::Relaxed) % nwords;
        while out.len() < n {
            let word = &self.words[w];
            let mut cur = word.load(Ordering::SeqCst);
            while cur != 0 && out.len() < n {
                // The lowest `want` set bits of `cur`.
                let want = (n - out.len()).min(cur.count_ones() as usize);
                let mut mask = 0u64;
                let mut rest = cur;
                for _ in 0..want {
                    let low = rest & rest.wrapping_neg();
                    mask |= low;
                    rest &= !low;
                }
                let claimed = claim_cas(word, cur, mask);
                match claimed {
                    Ok(_) => {
                        let mut m = mask;
                        while m != 0 {
                            out.push((w * 64 + m.trailing_zeros() as usize) as u32);
                            m &= m - 1;
                        }
                        cur &= !mask;
                    }
                    Err(actual) => cur = actual,
                }
            }
            if out.len() < n {
                w = (w + 1) % nwords;
            }
        }
        // Relaxed: the cursor is only a starting hint for the next scan.
        self.cursor.store((w + 1) % nwords, Ordering::Relaxed);
        Ok(out)
    }

    /// Returns `pages` to the pool. A page that is already free (or not a
    /// page of this pool) is counted in [`double_frees`](Self::double_frees)
    /// and otherwise ignored.
    pub(crate) fn give_back(&self, pages: &[u32]) {
        let mut sorted = pages.to_vec();
        sorted.sort_unstable();
        let mut freed = 0usize;
        let mut bad = 0u64;
        let mut i = 0;
        while i < sorted.len() {
            let p = sorted[i] as usize;
            if p == 0 || p >= self.num_pages {
                bad += 1;
                i += 1;
                continue;
            }
            let w = p / 64;
            let mut mask = 0u64;
            while i < sorted.len()
                && (sorted[i] as usize) / 64 == w
                && (sorted[i] as usize) < self.num_pages
            {
                let bit = 1u64 << (sorted[i] % 64);
                if mask & bit != 0 {
                    bad += 1; // the same page twice in one call
                }
                mask |= bit;
                i += 1;
            }
            // Bits first, then the counter: a reserved claim always finds
            // its bits.
            let prev = self.words[w].fetch_or(mask, Ordering::SeqCst);
            bad += u64::from((prev & mask).count_ones());
            freed += (mask & !prev).count_ones() as usize;
        }
        if bad > 0 {
            self.double_frees.fetch_add(bad, Ordering::SeqCst);
        }
        let now = self.free.fetch_add(freed, Ordering::SeqCst) + freed;
        if now >= self.low_watermark.load(Ordering::SeqCst) {
            self.below.store(false, Ordering::SeqCst);
        }
    }

    fn watch(&self, free_now: usize) {
        if free_now < self.low_watermark.load(Ordering::SeqCst)
            && !self.below.swap(true, Ordering::SeqCst)
        {
            if let Some(l) = &self.listener {
                l(self.tier, free_now);
            }
        }
    }

    /// Hands pages of a span over to a new owner (the tree) without freeing.
    pub(crate) fn transfer_out_of_spans(&self, n: usize) {
        self.in_spans.fetch_sub(n, Ordering::SeqCst);
    }
}

/// Pages owned by a request: not `Clone`; dropping it returns the pages to
/// their allocator. Moving it into the cache hands them to the tree.
pub struct PageSpan {
    alloc: Arc<PageAllocator>,
    pages: Vec<u32>,
}

impl fmt::Debug for PageSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PageSpan")
            .field("tier", &self.alloc.tier)
            .field("pages", &self.pages)
            .finish()
    }
}

impl PageSpan {
    /// The tier whose pages these are.
    pub fn tier(&self) -> Tier {
        self.alloc.tier
    }

    /// The page ids, in order.
    pub fn pages(&self) -> &[u32] {
        &self.pages
    }

    /// Number of pages.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// Whether the span holds no page.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Token slots per page.
    pub fn page_size(&self) -> usize {
        self.alloc.page_size
    }

    /// Token slots the span covers (`len() * page_size()`).
    pub fn tokens(&self) -> usize {
        self.pages.len() * self.alloc.page_size
    }

    /// The slot ids of every token, in order.
    pub fn slots(&self) -> impl Iterator<Item = u32> + '_ {
        let ps = self.alloc.page_size as u32;
        self.pages.iter().flat_map(move |&p| p * ps..p * ps + ps)
    }

    /// Splits off the pages from index `at` on into a new span.
    pub fn split_off(&mut self, at: usize) -> PageSpan {
        PageSpan {
            alloc: Arc::clone(&self.alloc),
            pages: self.pages.split_off(at.min(self.pages.len())),
        }
    }

    /// Appends the pages of `other` (same device) to this span.
    pub fn append(&mut self, mut other: PageSpan) -> Result<(), PageSpan> {
        if !Arc::ptr_eq(&self.alloc, &other.alloc) {
            return Err(other);
        }
        self.pages.append(&mut other.pages);
        Ok(())
    }

    /// The allocator the pages belong to.
    pub(crate) fn allocator(&self) -> &Arc<PageAllocator> {
        &self.alloc
    }

    /// Gives up ownership of the pages without freeing them (the tree now
    /// owns them).
    pub(crate) fn into_owned_pages(mut self) -> Vec<u32> {
        let pages = std::mem::take(&mut self.pages);
        self.alloc.transfer_out_of_spans(pages.len());
        pages
    }
}

impl Drop for PageSpan {
    fn drop(&mut self) {
        if !self.pages.is_empty() {
            self.alloc.transfer_out_of_spans(self.pages.len());
            self.alloc.give_back(&self.pages);
        }
    }
}

/// The protecting step `claim_cas` (model `two_claimers_and_a_free`): a
/// claim of bits `mask` of a bitmap word read as `cur` is a CAS, so two
/// claimers that read the same word cannot both take a bit. Its control
/// stores blindly.
fn claim_cas(word: &AtomicU64, cur: u64, mask: u64) -> Result<u64, u64> {
    if crate::negative::removed("claim_cas") {
        word.store(cur & !mask, Ordering::SeqCst);
        return Ok(cur);
    }
    word.compare_exchange(cur, cur & !mask, Ordering::SeqCst, Ordering::SeqCst)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::device::DeviceId;
    use std::collections::HashSet;

    #[test]
    fn alloc_free_and_double_free_counting() {
        let a = PageAllocator::new(DeviceId(1), 200, 4).unwrap();
        let s1 = a.alloc(4 * 70).unwrap();
        let s2 = a.alloc(4 * 100).unwrap();
        let all: HashSet<u32> = s1.pages().iter().chain(s2.pages()).copied().collect();
        assert_eq!(all.len(), 170, "no page handed out twice");
        assert!(!all.contains(&0), "page 0 is reserved");
        assert_eq!(a.free_pages(), 29);
        assert_eq!(a.pages_in_spans(), 170);
        let err = a.alloc(4 * 30).unwrap_err();
        assert_eq!(
            err,
            AllocError::OutOfPages {
                tier: DeviceId(1).into(),
                wanted: 30,
                free: 29,
                missing: 1
            }
        );
        let first = s1.pages()[0];
        drop(s1);
        assert_eq!(a.free_pages(), 99);
        assert_eq!(a.double_frees(), 0);
        // The test-only path: free a page that is already free.
        a.give_back(&[first]);
        assert_eq!(a.double_frees(), 1, "the counter moves");
        a.give_back(&[0, 5000]);
        assert_eq!(a.double_frees(), 3, "page 0 and foreign pages count too");
        assert_eq!(a.free_pages(), 99, "bad frees change nothing");
        drop(s2);
        assert_eq!(a.free_pages(), 199);
        assert_eq!(a.pages_in_spans(), 0);
    }

    #[test]
    fn reuse_is_next_fit() {
        let a = PageAllocator::new(DeviceId(0), 1000, 1).unwrap();
        let s = a.alloc(10).unwrap();
        let first = s.pages().to_vec();
        drop(s);
        let t = a.alloc(10).unwrap();
        assert!(
            t.pages().iter().all(|p| !first.contains(p)),
            "freed pages wait for the cursor to wrap"
        );
    }

    #[test]
    fn watermark_fires_once_per_crossing() {
        use std::sync::atomic::AtomicUsize as Count;
        let hits = Arc::new(Count::new(0));
        let h = Arc::clone(&hits);
        let a = PageAllocator::with_watermark(
            DeviceId(0),
            101,
            1,
            20,
            Some(Arc::new(move |_, _| {
                h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            })),
        )
        .unwrap();
        let big = a.alloc(85).unwrap();
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
        let more = a.alloc(5).unwrap();
        assert_eq!(
            hits.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "still below: no repeat"
        );
        drop(big);
        drop(more);
        let _again = a.alloc(90).unwrap();
        assert_eq!(
            hits.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "re-armed after recovery"
        );
    }

    #[test]
    fn concurrent_alloc_free_keeps_every_page_once() {
        let a = PageAllocator::new(DeviceId(0), 4096, 16).unwrap();
        std::thread::scope(|s| {
            for t in 0..4 {
                let a = &a;
                s.spawn(move || {
                    let mut held: Vec<PageSpan> = Vec::new();
                    for i in 0..2000 {
                        match a.alloc(16 * (1 + (i * 7 + t) % 40)) {
                            Ok(sp) => held.push(sp),
                            Err(_) => {
                                held.clear();
                            }
                        }
                        if held.len() > 6 {
                            held.remove(0);
                        }
                    }
                });
            }
        });
        assert_eq!(a.free_pages(), 4095);
        assert_eq!(a.double_frees(), 0);
        assert!((1..4096).all(|p| a.is_free(p)));
    }
}
