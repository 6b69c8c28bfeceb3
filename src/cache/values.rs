//! Inserting the caller's values: what a [`CallerValues`] cache does
//! instead of owning pages (SGLang's `RadixCache` over the caller's own
//! KV allocator).

use super::ownership::CallerValues;
use super::{CacheError, InsertResult, NodeHandle, RadixCache, TokenKey, TreePlace};
use crate::device::Tier;
use crate::tree::ops::attach::Writer;
use crate::tree::ops::insert::Insert;

impl RadixCache<CallerValues> {
    /// Caches `key` on `tier` with one value per token (KV slot indices
    /// chosen by the caller). Returns how many leading tokens were already
    /// cached there; the caller's values for those are duplicates (see
    /// [`InsertResult::duplicates`]). Existing values are never replaced.
    ///
    /// Errors (cache unchanged): a key that is not page-aligned, a values
    /// length that differs from the key's, an unknown tier. An empty key
    /// returns `prefix_len` 0.
    ///
    /// ```
    /// use radixkv::{CacheError, DeviceId, RadixCache, TokenKey};
    /// let c = RadixCache::builder().page_size(2).build().unwrap();
    /// let r = c.insert(TokenKey::new(&[1, 2, 3, 4]), DeviceId(0), &[9, 8, 7, 6], 0).unwrap();
    /// assert_eq!(r.prefix_len, 0);
    /// assert!(matches!(
    ///     c.insert(TokenKey::new(&[1, 2, 3]), DeviceId(0), &[9, 8, 7], 0),
    ///     Err(CacheError::Unaligned { len: 3, page_size: 2 })
    /// ));
    /// ```
    pub fn insert(
        &self,
        key: TokenKey<'_>,
        tier: impl Into<Tier>,
        values: &[u32],
        priority: i64,
    ) -> Result<InsertResult, CacheError> {
        self.insert_counting(key, tier, values, priority, 0)
    }

    /// [`insert`](Self::insert) for a request that inserted the first
    /// `inserted_len` tokens of `key` before (a chunk at a time): with
    /// [`HitCounts::OnInsert`](crate::HitCounts::OnInsert), only the nodes
    /// whose key ends past `inserted_len` count this insert as a hit, once
    /// each (SGLang 0.5.23's rule); otherwise the same as `insert`.
    ///
    /// ```
    /// use radixkv::{DeviceId, HitCounts, RadixCache, TokenKey};
    /// let c = RadixCache::builder().hit_counts(HitCounts::OnInsert).build().unwrap();
    /// let d = DeviceId(0);
    /// c.insert_counting(TokenKey::new(&[1, 2]), d, &[5, 6], 0, 0).unwrap();
    /// // The same request, two tokens further: [1 2] was its own already.
    /// c.insert_counting(TokenKey::new(&[1, 2, 3, 4]), d, &[5, 6, 7, 8], 0, 2).unwrap();
    /// assert_eq!(c.match_prefix(TokenKey::new(&[1, 2]), d).unwrap().hits, 1);
    /// assert_eq!(c.match_prefix(TokenKey::new(&[1, 2, 3, 4]), d).unwrap().hits, 1);
    /// ```
    pub fn insert_counting(
        &self,
        key: TokenKey<'_>,
        tier: impl Into<Tier>,
        values: &[u32],
        priority: i64,
        inserted_len: usize,
    ) -> Result<InsertResult, CacheError> {
        self.insert_walk(key, tier.into(), values, priority, inserted_len, false)
            .map(|(r, _)| r)
    }

    /// [`insert`](Self::insert), also returning the place where `key`
    /// ends in the tree: what a caller that will take a page of `key`
    /// out again keeps, to reach it without a walk from the root
    /// ([`evict_from_place`](Self::evict_from_place)). `None` for an empty
    /// key, or when another writer evicted part of the key while this
    /// insert went down it.
    ///
    /// ```
    /// use radixkv::{DeviceId, RadixCache, TokenKey};
    /// let c = RadixCache::builder().page_size(2).build().unwrap();
    /// let d = DeviceId(0);
    /// let (r, place) = c.insert_placed(TokenKey::new(&[1, 2, 3, 4]), d, &[5, 6, 7, 8], 0).unwrap();
    /// assert_eq!((r.prefix_len, place.unwrap().len()), (0, 4));
    /// ```
    pub fn insert_placed(
        &self,
        key: TokenKey<'_>,
        tier: impl Into<Tier>,
        values: &[u32],
        priority: i64,
    ) -> Result<(InsertResult, Option<TreePlace>), CacheError> {
        self.insert_walk(key, tier.into(), values, priority, 0, true)
    }

    /// Appends to `out` the key from the root to the page that ends `end`
    /// tokens from it on the path to `place` (of an earlier
    /// [`insert_placed`](Self::insert_placed) or eviction of this cache),
    /// whose tokens are `page`, read from the tree by climbing from the
    /// place (as many nodes as the path has, not its pages); returns
    /// whether `tier` holds that whole key. What a caller extending a
    /// path it kept a place on builds the key of its insert from.
    /// `Ok(None)` (and `out` as it was) when the place has left the tree
    /// or the page there is not `page`. Errors as
    /// [`evict_from_place`](Self::evict_from_place)'s.
    ///
    /// ```
    /// use radixkv::{DeviceId, RadixCache, TokenKey};
    /// let c = RadixCache::builder().page_size(2).devices(2).build().unwrap();
    /// let (_, place) = c.insert_placed(TokenKey::new(&[1, 2, 3, 4, 5, 6]), DeviceId(0), &[0; 6], 0).unwrap();
    /// let place = place.unwrap();
    /// let mut key = Vec::new();
    /// assert_eq!(c.place_path(&place, 4, &[3, 4], DeviceId(0), &mut key).unwrap(), Some(true));
    /// assert_eq!(key, [1, 2, 3, 4]);
    /// key.clear();
    /// assert_eq!(c.place_path(&place, 4, &[3, 4], DeviceId(1), &mut key).unwrap(), Some(false));
    /// assert_eq!(c.place_path(&place, 4, &[9, 9], DeviceId(0), &mut key).unwrap(), None);
    /// ```
    pub fn place_path(
        &self,
        place: &TreePlace,
        end: usize,
        page: &[u32],
        tier: impl Into<Tier>,
        out: &mut Vec<u32>,
    ) -> Result<Option<bool>, CacheError> {
        let t = self.check_place(place, end, page, tier.into())?;
        let guard = crossbeam_epoch::pin();
        let holder = self
            .tree
            .path_to(&place.node, place.len(), end, page, &guard, out);
        Ok(holder.map(|n| n.resident(t)))
    }

    /// The insert behind [`insert_counting`](Self::insert_counting) and
    /// [`insert_placed`](Self::insert_placed); the place only when `place`.
    fn insert_walk(
        &self,
        key: TokenKey<'_>,
        tier: Tier,
        values: &[u32],
        priority: i64,
        inserted_len: usize,
        place: bool,
    ) -> Result<(InsertResult, Option<TreePlace>), CacheError> {
        let t = self.slot(tier)?;
        let len = key.tokens.len();
        if !len.is_multiple_of(self.page_size()) {
            return Err(CacheError::Unaligned {
                len,
                page_size: self.page_size(),
            });
        }
        if values.len() != len {
            return Err(CacheError::LengthMismatch {
                tokens: len,
                values: values.len(),
            });
        }
        if len == 0 {
            return Ok((InsertResult::from_adopted(Vec::new(), 0), None));
        }
        let guard = crossbeam_epoch::pin();
        let w = self.tree.insert(
            Insert {
                ns: key.namespace,
                tokens: key.tokens,
                values,
                writer: Writer {
                    tier: t,
                    priority,
                    pin: false,
                    count_from: self.hits_on_insert.then_some(inserted_len),
                },
            },
            &guard,
        );
        let place = match (place, w.end) {
            // SAFETY: the insert's end node, reached under `guard` (alive
            // here).
            (true, Some(end)) => unsafe { self.place_of(end, len) },
            _ => None,
        };
        Ok((InsertResult::from_adopted(w.adopted, len), place))
    }

    /// The values of the path from the root through `handle`'s end node
    /// (as a match of that path returns them), read under a pin of the
    /// node held for the call: [`CacheError::StaleHandle`] if the node
    /// left the tree on the handle's tier since the match. A split since
    /// then changes nothing (the handle names the same end position).
    ///
    /// ```
    /// use radixkv::{DeviceId, RadixCache, TokenKey};
    /// let c = RadixCache::builder().build().unwrap();
    /// let d = DeviceId(0);
    /// c.insert(TokenKey::new(&[1, 2, 3]), d, &[7, 8, 9], 0).unwrap();
    /// let h = c.match_prefix(TokenKey::new(&[1, 2, 3]), d).unwrap().handle;
    /// c.insert(TokenKey::new(&[1, 5]), d, &[7, 4], 0).unwrap(); // splits [1 2 3]
    /// assert_eq!(c.path_values(&h).unwrap(), [7, 8, 9]);
    /// c.evict(d, 3).unwrap();
    /// assert!(c.path_values(&h).is_err());
    /// ```
    pub fn path_values(&self, handle: &NodeHandle) -> Result<Vec<u32>, CacheError> {
        let lease = self.pin(handle)?;
        let Some(node) = &handle.node else {
            return Ok(Vec::new());
        };
        let guard = crossbeam_epoch::pin();
        let values = self.tree.path_values(node, handle.slot, handle.len, &guard);
        drop(lease);
        values.ok_or(CacheError::StaleHandle(handle.tier()))
    }
}
