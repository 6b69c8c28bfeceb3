//! Inserting the caller's values: what a [`CallerValues`] cache does
//! instead of owning pages (SGLang's `RadixCache` over the caller's own
//! KV allocator).

use super::ownership::CallerValues;
use super::{CacheError, InsertResult, RadixCache, TokenKey};
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
        let t = self.slot(tier.into())?;
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
            return Ok(InsertResult::from_adopted(Vec::new(), 0));
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
                },
            },
            &guard,
        );
        Ok(InsertResult::from_adopted(w.adopted, len))
    }
}
