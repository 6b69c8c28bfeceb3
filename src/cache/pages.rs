//! What a cache that owns its pages ([`OwnedPages`]) adds: a page
//! allocator per tier, allocation that evicts the shortfall, inserting
//! page spans (duplicates go back), the watermarks the background evictor
//! follows, and the audit of pages (I2).

use super::ownership::OwnedPages;
use super::{CacheError, InsertResult, Lease, RadixCache, TokenKey};
use crate::alloc::{AllocError, PageAllocator, PageSpan};
use crate::device::Tier;
use crate::sync::{Arc, Ordering};
use crate::tree::node::arc_of;
use crate::tree::ops::attach::Writer;
use crate::tree::ops::insert::Insert;
use crate::tree::state::Tree;

impl RadixCache<OwnedPages> {
    /// The page allocator of `tier`.
    pub fn allocator(&self, tier: impl Into<Tier>) -> Result<&Arc<PageAllocator>, CacheError> {
        let t = self.slot(tier.into())?;
        self.pages.allocators.get(t).ok_or(CacheError::NoHostTier)
    }

    /// Allocates pages for `tokens` tokens on `tier`. When the tier is
    /// short, evicts exactly the shortfall (whole unpinned leaves, in policy
    /// order) and retries once; if that still cannot be met (everything
    /// pinned, or another request took the pages), the error says how many
    /// pages were missing.
    pub fn alloc(&self, tier: impl Into<Tier>, tokens: usize) -> Result<PageSpan, CacheError> {
        let tier = tier.into();
        let a = self.allocator(tier)?;
        match a.alloc(tokens) {
            Err(AllocError::OutOfPages { missing, .. }) => {
                self.evict(tier, missing * self.page_size())?;
                Ok(a.alloc(tokens)?)
            }
            r => Ok(r?),
        }
    }

    /// Caches `key` on the span's tier with the span's pages (one page per
    /// `page_size` tokens, in order): pages for tokens already cached there
    /// go back to the allocator, the rest now belong to the tree. `key` must
    /// cover exactly the span's slots. On an error the span is dropped, so
    /// its pages go back to the allocator: nothing is lost.
    ///
    /// ```
    /// use radixkv::{DeviceId, RadixCache, TokenKey};
    /// let cache = RadixCache::builder().page_size(2).pages_per_device(64).build().unwrap();
    /// let a = cache.allocator(DeviceId(0)).unwrap().clone();
    /// let span = cache.alloc(DeviceId(0), 4).unwrap();
    /// cache.insert_pages(TokenKey::new(&[1, 2, 3, 4]), span, 0).unwrap();
    /// let dup = cache.alloc(DeviceId(0), 4).unwrap();
    /// let r = cache.insert_pages(TokenKey::new(&[1, 2, 3, 4]), dup, 0).unwrap();
    /// assert_eq!(r.prefix_len, 4); // both pages were duplicates...
    /// assert_eq!(a.free_pages(), 63 - 2); // ...and went back
    /// cache.evict(DeviceId(0), 4).unwrap();
    /// assert_eq!(a.free_pages(), 63);
    /// cache.audit(); // I2: free + tree + requests = pool - 1
    /// ```
    pub fn insert_pages(
        &self,
        key: TokenKey<'_>,
        span: PageSpan,
        priority: i64,
    ) -> Result<InsertResult, CacheError> {
        // The general chunk insert with no borrowed prefix and no pin.
        self.insert_chunk_pinned(key, &[], span, (priority, 0), false)
            .map(|(r, _, _)| r)
    }

    /// Inserts `key` on `chunk`'s tier, whose first `borrowed.len()` tokens
    /// are the request's pinned cached prefix and the rest are `chunk`'s
    /// pages (duplicate pages go back to the allocator); returns the
    /// insert's result and, with `pin`, a lease on the new end and the
    /// path's values (read after the pin). `insert_pages` is the case
    /// without a borrowed prefix or pin. `inserted_len`: the tokens of the
    /// key the same request inserted before (see
    /// [`HitCounts::OnInsert`](crate::HitCounts::OnInsert)).
    pub(crate) fn insert_chunk_pinned(
        &self,
        key: TokenKey<'_>,
        borrowed: &[u32],
        chunk: PageSpan,
        (priority, inserted_len): (i64, usize),
        pin: bool,
    ) -> Result<(InsertResult, Option<Lease>, Vec<u32>), CacheError> {
        // The span's own allocator names its tier here, or it is foreign
        // (another cache's, whatever tier it names).
        let Some(t) =
            (self.pages.allocators.iter()).position(|a| Arc::ptr_eq(a, chunk.allocator()))
        else {
            return Err(CacheError::ForeignSpan);
        };
        let a = &self.pages.allocators[t];
        let len = key.tokens.len();
        if len != borrowed.len() + chunk.tokens() {
            return Err(CacheError::LengthMismatch {
                tokens: len,
                values: borrowed.len() + chunk.tokens(),
            });
        }
        if len == 0 {
            return Ok((InsertResult::from_adopted(Vec::new(), 0), None, Vec::new()));
        }
        let mut values = borrowed.to_vec();
        values.extend(chunk.slots());
        let guard = crossbeam_epoch::pin();
        let w = self.tree.insert(
            Insert {
                ns: key.namespace,
                tokens: key.tokens,
                values: &values,
                writer: Writer {
                    tier: t,
                    priority,
                    pin,
                    count_from: self.hits_on_insert.then_some(inserted_len),
                },
            },
            &guard,
        );
        let pages = chunk.into_owned_pages();
        let ps = self.page_size();
        let base = borrowed.len();
        let mut dups = Vec::new();
        let r = InsertResult::from_adopted(w.adopted, len);
        for range in r.duplicates() {
            // The borrowed prefix is pinned, so the tree never adopts it:
            // only the request's own pages can be duplicates to free.
            let lo = range.start.max(base);
            if lo < range.end {
                dups.extend_from_slice(&pages[(lo - base) / ps..(range.end - base) / ps]);
            }
        }
        debug_assert!(
            r.adopted.iter().all(|a| a.start >= base),
            "adopted a borrowed page"
        );
        a.give_back(&dups);
        let (lease, slots) = match w.pinned {
            Some((node, depth)) => {
                // SAFETY: `node` is a tree node the insert reached under its
                // guard, alive for this call (and pinned).
                let lease = self.lease(Some(unsafe { arc_of(node) }), t);
                let slots = self
                    .tree
                    .path_values(node, t, depth, &guard)
                    .unwrap_or_default();
                (Some(lease), slots)
            }
            None => (None, Vec::new()),
        };
        Ok((r, lease, slots))
    }

    /// The watermarks now, in free pages per tier (none without).
    pub fn watermarks(&self) -> Option<(usize, usize)> {
        self.pages.levels()
    }

    /// Moves the watermarks at run time (the cache must have been built
    /// with watermarks: its background evictor follows them from its next
    /// pass; the allocators signal at the new low level).
    ///
    /// ```
    /// use radixkv::RadixCache;
    /// let c = RadixCache::builder().pages_per_device(64).watermarks(4, 8).build().unwrap();
    /// c.set_watermarks(8, 16).unwrap();
    /// assert_eq!(c.watermarks(), Some((8, 16)));
    /// assert!(c.set_watermarks(16, 8).is_err());
    /// let plain = RadixCache::builder().pages_per_device(64).build().unwrap();
    /// assert!(plain.set_watermarks(1, 2).is_err());
    /// ```
    pub fn set_watermarks(&self, low: usize, high: usize) -> Result<(), CacheError> {
        if self.pages.watermarks.is_none() {
            return Err(CacheError::InvalidConfig(
                "this cache was built without watermarks (no background evictor)".into(),
            ));
        }
        let smallest = self
            .pages
            .allocators
            .iter()
            .map(|a| a.num_pages())
            .min()
            .unwrap_or(0);
        if low >= high || high >= smallest {
            return Err(CacheError::InvalidConfig(format!(
                "watermarks need low < high < pages ({low}, {high}, {smallest})"
            )));
        }
        let levels = &self.pages.levels;
        // High first when rising, low first when falling: never low >= high
        // for a reader between the two stores.
        if low as u64 >= levels.1.load(Ordering::SeqCst) {
            levels.1.store(high as u64, Ordering::SeqCst);
            levels.0.store(low as u64, Ordering::SeqCst);
        } else {
            levels.0.store(low as u64, Ordering::SeqCst);
            levels.1.store(high as u64, Ordering::SeqCst);
        }
        for a in self.pages.allocators.iter() {
            a.set_low_watermark(low);
        }
        Ok(())
    }
}

/// I2 on slot `t`: free + tree-owned + request-owned = pool size - 1, no
/// page owned twice.
pub(super) fn check_pages(
    tree: &Tree,
    t: usize,
    a: &PageAllocator,
    guard: &crossbeam_epoch::Guard,
) -> Result<(), String> {
    let ps = tree.page_size();
    let tier = tree.tier_of(t);
    let mut tree_pages = std::collections::HashSet::new();
    for slot in tree.values_on(t, guard).into_iter().step_by(ps) {
        if !(slot as usize).is_multiple_of(ps) {
            return Err(format!("I2: {tier}: slot {slot} does not start a page"));
        }
        let page = slot / ps as u32;
        if !tree_pages.insert(page) {
            return Err(format!(
                "I2: {tier}: page {page} is owned twice by the tree"
            ));
        }
        if a.is_free(page) {
            return Err(format!(
                "I2: {tier}: page {page} is both free and in the tree"
            ));
        }
    }
    let (free, spans) = (a.free_pages(), a.pages_in_spans());
    if free + tree_pages.len() + spans != a.num_pages() - 1 {
        return Err(format!(
            "I2: {tier}: {free} free + {} in the tree + {spans} in requests != {} pages",
            tree_pages.len(),
            a.num_pages() - 1
        ));
    }
    if a.double_frees() != 0 {
        return Err(format!("I2: {tier}: {} double frees", a.double_frees()));
    }
    Ok(())
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::DeviceId;

    #[test]
    fn audit_catches_a_double_free_and_a_lost_page() {
        let c = RadixCache::builder()
            .page_size(2)
            .pages_per_device(32)
            .build()
            .unwrap();
        let span = c.alloc(DeviceId(0), 4).unwrap();
        let pages = span.pages().to_vec();
        c.insert_pages(TokenKey::new(&[1, 2, 3, 4]), span, 0)
            .unwrap();
        c.audit();
        // A page of the tree freed behind its back: it is now both free and
        // in the tree, and freeing it again counts as a double free.
        let a = c.allocator(DeviceId(0)).unwrap();
        a.give_back(&pages[..1]);
        let e = c.check().unwrap_err();
        assert!(e.contains("both free and in the tree"), "{e}");
        a.give_back(&pages[..1]);
        assert_eq!(a.double_frees(), 1);
        // A page taken from the pool and never accounted for.
        let c = RadixCache::builder()
            .page_size(2)
            .pages_per_device(32)
            .build()
            .unwrap();
        let a = c.allocator(DeviceId(0)).unwrap();
        let span = a.alloc(2).unwrap();
        let _lost = span.into_owned_pages();
        let e = c.check().unwrap_err();
        assert!(e.contains("I2"), "{e}");
    }
}
