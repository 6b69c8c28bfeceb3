//! The request lifecycle (SGLang's `cache_unfinished_req` /
//! `cache_finished_req`) for a cache that owns its pages.
//!
//! ```text
//!  begin ──► reserve ──► commit_chunk* ──► finish
//!    │          │              │             │
//!  match+pin  pages for     insert chunk,  insert the rest, free
//!  (never the uncached   pin new end,   duplicates and the
//!  last token) suffix      then release   unaligned tail, release
//!                          the old pin    the pin
//! ```
//!
//! Dropping a [`Request`] (an abort, an early return, a panic) returns its
//! pages to the allocator and releases its pin: nothing leaks.

use super::ownership::OwnedPages;
use super::{CacheError, InsertResult, Lease, PagedCache, RadixCache, TokenKey};
use crate::alloc::PageSpan;
use crate::device::DeviceId;
use crate::sync::Arc;

/// One request's hold on the cache: the cached prefix it reuses (pinned),
/// and the pages it owns for the rest of its tokens.
///
/// ```
/// use radixkv::{DeviceId, RadixCache, TokenKey};
/// use std::sync::Arc;
/// let cache = Arc::new(RadixCache::builder().page_size(2).pages_per_device(64).build()?);
/// let mut r = cache.begin(TokenKey::new(&[1, 2, 3, 4, 5]), DeviceId(0))?;
/// assert_eq!(r.cached_len(), 0);
/// r.reserve()?; // pages for tokens 0..5 (3 pages)
/// let slots = r.slots(); // where the KV of each token goes
/// assert_eq!(slots.len(), 6);
/// r.finish()?; // tokens 0..4 cached; the page of token 4 goes back
///
/// let r2 = cache.begin(TokenKey::new(&[1, 2, 3, 4, 5, 6]), DeviceId(0))?;
/// assert_eq!(r2.cached_len(), 4); // reused; only 4..6 is computed
/// drop(r2); // abort: pages back, pin released
/// cache.audit();
/// # Ok::<(), radixkv::CacheError>(())
/// ```
#[derive(Debug)]
pub struct Request {
    cache: Arc<PagedCache>,
    device: DeviceId,
    namespace: Option<Box<str>>,
    tokens: Vec<u32>,
    cached_len: usize,
    cached_slots: Vec<u32>,
    lease: Option<Lease>,
    own: Option<PageSpan>,
    /// What the match at `begin` saw beyond the device's own prefix.
    further: Further,
    /// Tokens of the request's key it inserted so far (its hits are
    /// counted once, `HitCounts::OnInsert`).
    inserted_len: usize,
}

/// What the match at [`RadixCache::begin`] saw on the other tiers.
#[derive(Debug, Clone, Copy, Default)]
struct Further {
    host_len: usize,
    peer: Option<(DeviceId, usize)>,
    hits: u64,
}

impl RadixCache<OwnedPages> {
    /// Starts a request for `key` on `device`: matches and pins the longest
    /// cached prefix that does not cover the last token (at least one token
    /// is always computed).
    pub fn begin(
        self: &Arc<Self>,
        key: TokenKey<'_>,
        device: DeviceId,
    ) -> Result<Request, CacheError> {
        let n = key.tokens.len().saturating_sub(1);
        let probe = TokenKey::new(&key.tokens[..n]).in_namespace(key.namespace);
        let m = self.match_and_pin(probe, device)?;
        Ok(Request {
            cache: Arc::clone(self),
            device,
            namespace: key.namespace.map(Box::from),
            tokens: key.tokens.to_vec(),
            cached_len: m.len,
            cached_slots: m.values,
            lease: m.lease,
            own: None,
            further: Further {
                host_len: m.host_len,
                peer: m
                    .any_device
                    .filter(|&e| e != device)
                    .map(|e| (e, m.any_len)),
                hits: m.hits,
            },
            inserted_len: 0,
        })
    }
}

impl Request {
    /// The device the request runs on.
    pub fn device(&self) -> DeviceId {
        self.device
    }

    /// Tokens whose KV comes from the cache (a multiple of the page size).
    pub fn cached_len(&self) -> usize {
        self.cached_len
    }

    /// Tokens of the request (before its last) that the host tier held
    /// when it began: what [`copy_from`](Self::copy_from) the host could
    /// load beyond [`cached_len`](Self::cached_len). 0 without a host tier.
    pub fn host_len(&self) -> usize {
        self.further.host_len
    }

    /// The other device that held the longest prefix of the request (before
    /// its last token) when it began, and that prefix's length, if it was
    /// longer than what this device held.
    pub fn peer(&self) -> Option<(DeviceId, usize)> {
        self.further.peer.filter(|&(_, l)| l > self.cached_len)
    }

    /// Hits of the cached prefix's end node on this device, this request's
    /// match included ([`MatchResult::hits`](super::MatchResult::hits)).
    pub fn prefix_hits(&self) -> u64 {
        self.further.hits
    }

    /// The request's tokens so far (prompt, then generated ones).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Appends generated tokens (call [`reserve`](Self::reserve) before
    /// writing their KV).
    pub fn extend(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
    }

    /// Tokens that have a slot: the cached prefix plus the owned pages.
    pub fn backed_len(&self) -> usize {
        self.cached_len + self.own.as_ref().map_or(0, PageSpan::tokens)
    }

    /// Allocates pages so that every token has a slot. On failure (the
    /// device is out of pages) nothing changes; the caller may evict and
    /// retry.
    pub fn reserve(&mut self) -> Result<(), CacheError> {
        let need = self.tokens.len().saturating_sub(self.backed_len());
        if need == 0 {
            return Ok(());
        }
        let more = self.cache.alloc(self.device, need)?;
        match &mut self.own {
            Some(own) => {
                let _ = own.append(more);
            }
            None => self.own = Some(more),
        }
        Ok(())
    }

    /// The KV slot of every backed token, in order: the cached prefix's
    /// slots (borrowed from the cache, pinned), then the request's own.
    pub fn slots(&self) -> Vec<u32> {
        let mut v = self.cached_slots.clone();
        if let Some(own) = &self.own {
            v.extend(own.slots());
        }
        v
    }

    pub(super) fn cache(&self) -> &Arc<PagedCache> {
        &self.cache
    }

    /// The request's cache namespace.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    pub(super) fn cached_slots(&self) -> &[u32] {
        &self.cached_slots
    }

    /// Takes a longer cached prefix (a completed copy's): its slots and
    /// the pin on its end, held before the old pin is released.
    pub(super) fn adopt_prefix(&mut self, slots: Vec<u32>, lease: Lease) {
        self.cached_len = slots.len();
        self.cached_slots = slots;
        self.lease = Some(lease);
    }

    fn key(&self, len: usize) -> TokenKey<'_> {
        TokenKey::new(&self.tokens[..len]).in_namespace(self.namespace.as_deref())
    }

    /// Caches the first `upto` tokens (rounded down to whole pages) while
    /// the request goes on (chunked prefill, or decoding continues; SGLang's
    /// `cache_unfinished_req`). Pages of tokens another request cached
    /// meanwhile go back to the allocator and the request switches to the
    /// cache's copies; the new end is pinned before the old pin is
    /// released, so no part of the request's prefix is ever evictable.
    pub fn commit_chunk(&mut self, upto: usize) -> Result<InsertResult, CacheError> {
        self.commit(upto, true)
    }

    /// Caches every backed, page-aligned token and ends the request (SGLang's
    /// `cache_finished_req`): duplicates and the unaligned tail go back to the
    /// allocator, the pin is released.
    pub fn finish(mut self) -> Result<InsertResult, CacheError> {
        let upto = self.tokens.len().min(self.backed_len());
        self.commit(upto, false)
        // Dropping `self` returns the unaligned tail and releases the pin.
    }

    /// Ends the request without caching anything (same as dropping it).
    pub fn abort(self) {}

    fn commit(&mut self, upto: usize, keep: bool) -> Result<InsertResult, CacheError> {
        let ps = self.cache.page_size();
        let aligned = upto.min(self.backed_len()).min(self.tokens.len()) / ps * ps;
        if aligned <= self.cached_len {
            return Ok(InsertResult::from_adopted(Vec::new(), aligned));
        }
        let Some(mut chunk) = self.own.take() else {
            // Nothing is backed beyond the cached prefix: nothing to cache.
            return Ok(InsertResult::from_adopted(Vec::new(), aligned));
        };
        let rest = chunk.split_off((aligned - self.cached_len) / ps);
        self.own = (!rest.is_empty()).then_some(rest);
        let (result, lease, slots) = self.cache.insert_chunk_pinned(
            self.key(aligned),
            &self.cached_slots,
            chunk,
            (0, self.inserted_len),
            keep,
        )?;
        self.inserted_len = self.inserted_len.max(aligned);
        if let Some(lease) = lease {
            // The new end is pinned: only now let the old pin go.
            self.cached_len = slots.len();
            self.cached_slots = slots;
            self.lease = Some(lease);
        }
        Ok(result)
    }
}
