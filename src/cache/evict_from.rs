//! Taking one block and what continues it out of a tier (a router's
//! index applying a `BlockRemoved`): by its key from the root
//! ([`RadixCache::evict_from`]) or by climbing from a [`TreePlace`]
//! ([`RadixCache::evict_from_place`]), with the place above the page
//! taken ([`EvictedFrom`]). The eviction itself, its accounting and the
//! candidates it files are `eviction`'s.

use super::eviction::fitted;
use super::ownership::Ownership;
use super::{CacheError, Evicted, EvictedFrom, RadixCache, TokenKey, TreePlace};
use crate::device::Tier;
use crate::sync::Ordering;
use crate::tree::node::{arc_of, Node};
use crate::tree::ops::evict::is_leaf_on;
use crossbeam_epoch::Guard;

impl<P: Ownership> RadixCache<P> {
    /// Takes `tier`'s residency from the last page of `key` and from every
    /// page below it on `tier` (a router's index applying a `BlockRemoved`:
    /// a block that leaves takes the blocks that continue it out of reach
    /// too), and returns their values (pages go back to the tier's
    /// allocator, as in [`evict`](Self::evict)). The pages of `key` before
    /// its last stay; a node that holds them and the last page is split
    /// between them. Pinned pages stay (and what is above them). Nothing
    /// happens when the tree does not hold `key` on `tier`.
    ///
    /// ```
    /// use radixkv::{DeviceId, RadixCache, TokenKey};
    /// let c = RadixCache::builder().page_size(2).build().unwrap();
    /// let d = DeviceId(0);
    /// c.insert(TokenKey::new(&[1, 2, 3, 4, 5, 6]), d, &[10, 11, 12, 13, 14, 15], 0).unwrap();
    /// c.insert(TokenKey::new(&[1, 2, 3, 4, 7, 7]), d, &[10, 11, 12, 13, 16, 17], 0).unwrap();
    /// // The page [3 4] goes, and both continuations below it.
    /// let e = c.evict_from(TokenKey::new(&[1, 2, 3, 4]), d).unwrap();
    /// assert_eq!((e.tokens, e.leaves), (6, 3));
    /// assert_eq!(c.peek(TokenKey::new(&[1, 2, 3, 4, 5, 6])), vec![2]);
    /// c.check().unwrap();
    /// ```
    pub fn evict_from(
        &self,
        key: TokenKey<'_>,
        tier: impl Into<Tier>,
    ) -> Result<Evicted, CacheError> {
        self.evict_from_key(key, tier.into(), false)
            .map(|e| e.evicted)
    }

    /// [`evict_from`](Self::evict_from), also returning the place where
    /// the path above the evicted page ends (see [`EvictedFrom`]).
    ///
    /// ```
    /// use radixkv::{DeviceId, RadixCache, TokenKey};
    /// let c = RadixCache::builder().page_size(2).build().unwrap();
    /// let d = DeviceId(0);
    /// c.insert(TokenKey::new(&[1, 2, 3, 4, 5, 6]), d, &[10, 11, 12, 13, 14, 15], 0).unwrap();
    /// let e = c.evict_from_with_place(TokenKey::new(&[1, 2, 3, 4]), d).unwrap();
    /// assert_eq!((e.evicted.tokens, e.above.unwrap().len()), (4, 2));
    /// ```
    pub fn evict_from_with_place(
        &self,
        key: TokenKey<'_>,
        tier: impl Into<Tier>,
    ) -> Result<EvictedFrom, CacheError> {
        self.evict_from_key(key, tier.into(), true)
    }

    fn evict_from_key(
        &self,
        key: TokenKey<'_>,
        tier: Tier,
        place_above: bool,
    ) -> Result<EvictedFrom, CacheError> {
        let t = self.slot(tier)?;
        let ps = self.page_size();
        let tokens = key.tokens();
        if !tokens.len().is_multiple_of(ps) {
            return Err(CacheError::Unaligned {
                len: tokens.len(),
                page_size: ps,
            });
        }
        if tokens.is_empty() {
            return Ok(EvictedFrom::default());
        }
        // As `evict`: what earlier changes unlinked is freed here, not by
        // matching threads (a tree changed mostly by key would otherwise
        // hold its garbage until the next insert that takes a share).
        self.tree.reclaim();
        let guard = crossbeam_epoch::pin();
        let start = tokens.len() - ps;
        let Some((top, parent)) =
            self.tree
                .node_starting_at(key.namespace(), tokens, start, &guard)
        else {
            return Ok(EvictedFrom::default());
        };
        crate::pause::at(crate::pause::Point::Located);
        Ok(EvictedFrom {
            evicted: self.evict_below(top, parent, t, &guard),
            // SAFETY: `parent` was reached under `guard`, alive here.
            above: place_above
                .then(|| unsafe { self.place_of(parent, start) })
                .flatten(),
        })
    }

    /// [`evict_from`](Self::evict_from) of the page that ends `end` tokens
    /// from the root on the path to `place` (of an earlier
    /// [`insert_placed`](Self::insert_placed) or eviction of this cache),
    /// whose tokens are `page`: the same change, found by climbing from
    /// the place instead of walking down from the root with the whole
    /// key, with the place of the path above it (see [`EvictedFrom`]).
    /// `Ok(None)` when the place has left the tree (no tier holds its node
    /// any more), or the page there is not `page` (a place kept for
    /// another path): the caller walks with the key instead. Errors: `end`
    /// not page-aligned, 0, or past the place, or `page` not one page
    /// long ([`CacheError::Unaligned`]); a place of another cache
    /// ([`CacheError::ForeignHandle`]); an unknown tier.
    ///
    /// ```
    /// use radixkv::{DeviceId, RadixCache, TokenKey};
    /// let c = RadixCache::builder().page_size(2).build().unwrap();
    /// let d = DeviceId(0);
    /// let (_, place) = c.insert_placed(TokenKey::new(&[1, 2, 3, 4, 5, 6]), d, &[10, 11, 12, 13, 14, 15], 0).unwrap();
    /// // The page [3 4] goes, and [5 6] below it.
    /// let place = place.unwrap();
    /// assert!(c.evict_from_place(&place, 4, &[3, 9], d).unwrap().is_none());
    /// let e = c.evict_from_place(&place, 4, &[3, 4], d).unwrap().unwrap();
    /// assert_eq!(e.evicted.tokens, 4);
    /// assert_eq!(c.peek(TokenKey::new(&[1, 2, 3, 4, 5, 6])), vec![2]);
    /// // The page above, [1 2], from the place the eviction gave.
    /// let e = c.evict_from_place(&e.above.unwrap(), 2, &[1, 2], d).unwrap().unwrap();
    /// assert_eq!((e.evicted.tokens, e.above.is_none()), (2, true));
    /// c.check().unwrap();
    /// ```
    pub fn evict_from_place(
        &self,
        place: &TreePlace,
        end: usize,
        page: &[u32],
        tier: impl Into<Tier>,
    ) -> Result<Option<EvictedFrom>, CacheError> {
        let t = self.check_place(place, end, page, tier.into())?;
        let ps = self.page_size();
        // As `evict_from`.
        self.tree.reclaim();
        let guard = crossbeam_epoch::pin();
        let start = end - ps;
        let Some((top, parent)) =
            self.tree
                .node_starting_above(&place.node, place.len(), start, page, &guard)
        else {
            return Ok(None);
        };
        crate::pause::at(crate::pause::Point::Located);
        Ok(Some(EvictedFrom {
            evicted: self.evict_below(top, parent, t, &guard),
            // SAFETY: `parent` was reached under `guard`, alive here.
            above: unsafe { self.place_of(parent, start) },
        }))
    }

    /// The tier's slot, once `place` is this cache's and `end` and `page`
    /// name one whole page on its path (see
    /// [`evict_from_place`](Self::evict_from_place)).
    pub(super) fn check_place(
        &self,
        place: &TreePlace,
        end: usize,
        page: &[u32],
        tier: Tier,
    ) -> Result<usize, CacheError> {
        if u64::from(place.cache) != self.id {
            return Err(CacheError::ForeignHandle);
        }
        let t = self.slot(tier)?;
        let ps = self.page_size();
        if end == 0 || end > place.len() || !end.is_multiple_of(ps) {
            return Err(CacheError::Unaligned {
                len: end,
                page_size: ps,
            });
        }
        if page.len() != ps {
            return Err(CacheError::Unaligned {
                len: page.len(),
                page_size: ps,
            });
        }
        Ok(t)
    }

    /// The place of `node`, which ends `len` tokens from its root; `None`
    /// for a root, and where the length or the cache's id does not fit a
    /// place (see [`TreePlace`]).
    ///
    /// # Safety
    ///
    /// `node` is a node of this cache's tree reached under an epoch guard
    /// that is still alive.
    pub(super) unsafe fn place_of(&self, node: &Node, len: usize) -> Option<TreePlace> {
        let (Ok(len), Ok(cache)) = (u32::try_from(len), u32::try_from(self.id)) else {
            return None;
        };
        (!node.is_root).then(|| TreePlace {
            // SAFETY: a tree node reached under a live guard (the
            // function's contract).
            node: unsafe { arc_of(node) },
            len,
            cache,
        })
    }

    /// Takes `t`'s residency from `top`, found below `parent`, and every
    /// node below it (see [`evict_from`](Self::evict_from)); both reached
    /// under `guard`. A writer that split `top` after the walk found it
    /// moved its first pages to a new node between the two, which is taken
    /// too (and so on up to `parent`): the pages from where `top` started
    /// go, as asked.
    fn evict_below(&self, top: &Node, parent: &Node, t: usize, guard: &Guard) -> Evicted {
        let mut out = Evicted::default();
        let mut top = top;
        loop {
            self.evict_subtree_into(top, t, guard, &mut out);
            let img = top.image_ref(guard);
            if img.parent.is(parent) || img.parent.is_null() {
                break;
            }
            // SAFETY: `top` was reached under `guard`, so the parent its
            // image names was linked during `guard` and is not freed before
            // it ends (see `ParentPtr`).
            top = unsafe { &*img.parent.0 };
        }
        fitted(out)
    }

    /// Takes `t`'s residency from `top` and every node below it into
    /// `out`, `top` reached under `guard`.
    fn evict_subtree_into(&self, top: &Node, t: usize, guard: &Guard, out: &mut Evicted) {
        let evicted = self.tree.evict_subtree(top, t, guard);
        for ev in &evicted {
            self.account(&ev.values, t, out);
        }
        // A node above an evicted one that is a leaf on the tier now (the
        // node above the subtree, or one that stayed, pinned) is a candidate
        // again, its hits so far passes through (as after an eviction). It
        // joins the candidate heap under its own key, as the evictor files
        // the parents of the leaves it takes: a leaf note's key is only a
        // bound from the node's last access, and a parent accessed after its
        // creation would rank too late under fifo with it.
        let mut c = crate::sync::lock(&self.candidates[t]);
        for ev in &evicted {
            if is_leaf_on(ev.parent, t) {
                // Relaxed: written and read by this tier's evictors, under
                // the candidates lock (held).
                let hits = ev.parent.slot(t).hits.load(Ordering::Relaxed);
                ev.parent.slot(t).hits_base.store(hits, Ordering::Relaxed);
                if !self.tree.notes_leaves() {
                    continue; // no heap: eviction ranks by a scan
                }
                // SAFETY: `ev.parent` is a tree node reached under `guard`,
                // which is alive here.
                self.file_parent(&mut c, unsafe { arc_of(ev.parent) }, t);
            }
        }
    }
}
