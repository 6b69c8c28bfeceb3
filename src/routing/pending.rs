//! [`PendingIndex`]: the prefixes dispatched to each device (or rank) and
//! not yet in its cache, so that a router sends a burst of requests with
//! one prefix after the first, before the first's prompt is cached.

use crate::sync::{lock, Mutex, MutexGuard};
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

/// The prefixes dispatched to each device and not yet inserted into the
/// tree: whole pages, identified by a chained 64-bit hash of the page's
/// tokens and everything before it (and the namespace), with a count per
/// device. A hash collision (probability about n²/2⁶⁴ for n distinct
/// pages) can only mislead routing, never the cache.
///
/// Shared without a global lock: the pages are spread over 16 shards, each
/// behind its own mutex, held for one page's count at a time (a submit and
/// a completion on different prompts rarely meet).
///
/// ```
/// use radixkv::routing::PendingIndex;
/// let p = PendingIndex::new(2, 2);
/// p.add(&[1, 2, 3, 4, 5], None, 1);
/// assert_eq!(p.longest(&[1, 2, 3, 9], None), vec![0, 2]);
/// p.remove(&[1, 2, 3, 4, 5], None, 1);
/// assert_eq!(p.longest(&[1, 2, 3, 9], None), vec![0, 0]);
/// ```
#[derive(Debug)]
pub struct PendingIndex {
    page_size: usize,
    devices: usize,
    shards: Box<[Mutex<Counts>]>,
    hasher: std::collections::hash_map::RandomState,
}

const SHARDS: usize = 16;

/// One shard: per page hash, the count per device. The keys are already
/// keyed hashes (SipHash with the index's random keys): the map takes
/// them as they are ([`Prehashed`]) instead of hashing them again.
type Counts = HashMap<u64, Box<[u32]>, BuildHasherDefault<Prehashed>>;

/// A hasher for keys that are uniform 64-bit hashes already: the key is
/// the hash.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed here (`write_u64`); anything else is
        // folded in, so that the hasher stays correct if that changes.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl PendingIndex {
    /// An empty index for `devices` devices and pages of `page_size` tokens.
    pub fn new(devices: usize, page_size: usize) -> Self {
        PendingIndex {
            page_size: page_size.max(1),
            devices,
            shards: (0..SHARDS).map(|_| Mutex::new(Counts::default())).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }

    fn shard(&self, h: u64) -> MutexGuard<'_, Counts> {
        // A panic under a shard's lock leaves a valid map (counts may be
        // off by one, which only affects routing).
        lock(&self.shards[(h >> 60) as usize % SHARDS])
    }

    fn page_hashes<'a>(
        &'a self,
        tokens: &'a [u32],
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = u64> + 'a {
        let mut h = {
            let mut s = self.hasher.build_hasher();
            s.write_u8(namespace.is_some() as u8);
            s.write(namespace.unwrap_or("").as_bytes());
            s.finish()
        };
        tokens.chunks_exact(self.page_size).map(move |page| {
            let mut s = self.hasher.build_hasher();
            s.write_u64(h);
            for &t in page {
                s.write_u32(t);
            }
            h = s.finish();
            h
        })
    }

    /// Records `tokens` (whole pages) as dispatched to `device`.
    pub fn add(&self, tokens: &[u32], namespace: Option<&str>, device: usize) {
        if device >= self.devices {
            return;
        }
        let n = self.devices;
        for h in self.page_hashes(tokens, namespace) {
            self.shard(h)
                .entry(h)
                .or_insert_with(|| vec![0; n].into_boxed_slice())[device] += 1;
        }
    }

    /// Forgets one earlier [`add`](Self::add) of the same tokens.
    pub fn remove(&self, tokens: &[u32], namespace: Option<&str>, device: usize) {
        if device >= self.devices {
            return;
        }
        for h in self.page_hashes(tokens, namespace) {
            let mut shard = self.shard(h);
            if let Some(c) = shard.get_mut(&h) {
                c[device] = c[device].saturating_sub(1);
                if c.iter().all(|&x| x == 0) {
                    shard.remove(&h);
                }
            }
        }
    }

    /// Per device, the longest prefix of `tokens` (whole pages) dispatched
    /// there and not yet removed (each page read under its shard's lock: a
    /// snapshot per page, which is all routing needs).
    pub fn longest(&self, tokens: &[u32], namespace: Option<&str>) -> Vec<usize> {
        let mut out = vec![0; self.devices];
        let mut alive: Vec<bool> = vec![true; self.devices];
        for (i, h) in self.page_hashes(tokens, namespace).enumerate() {
            let shard = self.shard(h);
            let Some(c) = shard.get(&h) else {
                break;
            };
            let mut any = false;
            for d in 0..self.devices {
                if alive[d] && c[d] > 0 {
                    out[d] = (i + 1) * self.page_size;
                    any = true;
                } else {
                    alive[d] = false;
                }
            }
            if !any {
                break;
            }
        }
        out
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(|s| lock(s).is_empty())
    }
}
