//! [`Contents`]: the tokens of every block any source holds, by its
//! per-block hash ([`crate::local_hash`]), each stored once however many
//! sources hold it. Sources keep their blocks' tokens through it, and
//! `/query_by_hash` reads hashes back into tokens through it.
//!
//! Two different blocks with one hash (a 64-bit collision) keep apart: the
//! first owns the entry, the second its own copy of the tokens, and a
//! query by that hash reads the first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Shards of the table: stores of different sources rarely meet on one
/// lock.
const SHARDS: usize = 64;

/// One shard: entries by hash (already uniform: foldhash only mixes it).
type Shard = HashMap<u64, Entry, foldhash::fast::RandomState>;

#[derive(Debug)]
struct Entry {
    tokens: Arc<[u32]>,
    namespace: Option<Arc<str>>,
    /// Blocks (of any source) sharing these tokens.
    refs: u32,
}

/// A block's tokens and namespace, read back from its hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Content {
    /// Its tokens.
    pub tokens: Arc<[u32]>,
    /// Its namespace (the core's [`radixkv::TokenKey::namespace_for`]).
    pub namespace: Option<Arc<str>>,
}

/// See the module docs.
#[derive(Debug)]
pub struct Contents {
    shards: Vec<Mutex<Shard>>,
}

impl Default for Contents {
    fn default() -> Self {
        Contents {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Contents {
    fn shard(&self, hash: u64) -> MutexGuard<'_, Shard> {
        // The hash is already uniform: its top bits pick the shard.
        lock(&self.shards[(hash >> 58) as usize % SHARDS])
    }

    /// One more block with hash `hash`, `tokens` and `namespace`: the
    /// shared copy of its tokens.
    pub fn hold(&self, hash: u64, tokens: &[u32], namespace: &Option<Arc<str>>) -> Arc<[u32]> {
        let mut s = self.shard(hash);
        match s.get_mut(&hash) {
            Some(e) if *e.tokens == *tokens && e.namespace == *namespace => {
                e.refs += 1;
                Arc::clone(&e.tokens)
            }
            // A collision: its own copy, not in the table.
            Some(_) => Arc::from(tokens),
            None => {
                let tokens: Arc<[u32]> = Arc::from(tokens);
                s.insert(
                    hash,
                    Entry {
                        tokens: Arc::clone(&tokens),
                        namespace: namespace.clone(),
                        refs: 1,
                    },
                );
                tokens
            }
        }
    }

    /// A block that [`Contents::hold`] gave `tokens` for `hash` is gone.
    pub fn release(&self, hash: u64, tokens: &Arc<[u32]>) {
        let mut s = self.shard(hash);
        let Some(e) = s.get_mut(&hash) else { return };
        if !Arc::ptr_eq(&e.tokens, tokens) {
            return; // the collision's own copy
        }
        e.refs -= 1;
        if e.refs == 0 {
            s.remove(&hash);
        }
    }

    /// The block named `hash`, if some source holds one.
    pub fn get(&self, hash: u64) -> Option<Content> {
        self.shard(hash).get(&hash).map(|e| Content {
            tokens: Arc::clone(&e.tokens),
            namespace: e.namespace.clone(),
        })
    }

    /// Distinct blocks held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// Whether no block is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_tokens_are_kept_once_and_dropped_with_the_last_holder() {
        let c = Contents::default();
        let a = c.hold(7, &[1, 2], &None);
        let b = c.hold(7, &[1, 2], &None);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(c.len(), 1);
        c.release(7, &a);
        assert_eq!(c.get(7).map(|x| x.tokens.to_vec()), Some(vec![1, 2]));
        c.release(7, &b);
        assert!(c.get(7).is_none() && c.is_empty());
    }

    #[test]
    fn a_collision_keeps_its_own_copy_and_leaves_the_entry_alone() {
        let c = Contents::default();
        let first = c.hold(9, &[1, 2], &None);
        let other = c.hold(9, &[3, 4], &None);
        assert!(!Arc::ptr_eq(&first, &other));
        c.release(9, &other);
        assert_eq!(c.get(9).map(|x| x.tokens.to_vec()), Some(vec![1, 2]));
        c.release(9, &first);
        assert!(c.is_empty());
    }
}
