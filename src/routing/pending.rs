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
/// Two ways in: by tokens ([`add`](Self::add), [`remove`](Self::remove),
/// [`longest`](Self::longest): each page hashed here with a keyed
/// SipHash), or by per-page hashes the caller already has
/// ([`add_pages`](Self::add_pages), [`remove_pages`](Self::remove_pages),
/// [`longest_pages`](Self::longest_pages): each a uniform 64-bit hash of
/// one page's tokens and namespace, not chained, such as the block hashes
/// KV events carry). Either way the chain is made here. Use one way per
/// index: the two hash a page differently.
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
///
/// // By per-page hashes: the same pages at another position, or after
/// // another page, are other prefixes.
/// let q = PendingIndex::new(2, 16);
/// q.add_pages(&[0xa1, 0xb2, 0xc3], 0);
/// assert_eq!(q.longest_pages(&[0xa1, 0xb2, 0xff]), vec![32, 0]);
/// assert_eq!(q.longest_pages(&[0xb2, 0xc3]), vec![0, 0]);
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

/// Chains per-page hashes: each output names its page and every page
/// before it. One 64x64 -> 128-bit multiply per page, folded (the mixer of
/// wyhash and foldhash): the inputs are uniform hashes already, so the
/// outputs are too, as the shard choice and [`Prehashed`] need.
struct Chain<I> {
    pages: I,
    prev: u64,
}

impl<I> Chain<I> {
    fn new(pages: I) -> Self {
        Chain {
            pages,
            prev: 0x243f_6a88_85a3_08d3,
        }
    }
}

impl<I: Iterator<Item = u64>> Iterator for Chain<I> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        let page = self.pages.next()?;
        let x =
            u128::from(self.prev ^ page) * u128::from(page.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15);
        self.prev = (x as u64) ^ ((x >> 64) as u64);
        Some(self.prev)
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
        let seed = {
            let mut s = self.hasher.build_hasher();
            s.write_u8(namespace.is_some() as u8);
            s.write(namespace.unwrap_or("").as_bytes());
            s.finish()
        };
        tokens.chunks_exact(self.page_size).map(move |page| {
            let mut s = self.hasher.build_hasher();
            s.write_u64(seed);
            for &t in page {
                s.write_u32(t);
            }
            s.finish()
        })
    }

    /// Records `tokens` (whole pages) as dispatched to `device`.
    pub fn add(&self, tokens: &[u32], namespace: Option<&str>, device: usize) {
        self.add_chain(Chain::new(self.page_hashes(tokens, namespace)), device);
    }

    /// Forgets one earlier [`add`](Self::add) of the same tokens.
    pub fn remove(&self, tokens: &[u32], namespace: Option<&str>, device: usize) {
        self.remove_chain(Chain::new(self.page_hashes(tokens, namespace)), device);
    }

    /// Per device, the longest prefix of `tokens` (whole pages) dispatched
    /// there and not yet removed, in tokens (each page read under its
    /// shard's lock: a snapshot per page, which is all routing needs).
    pub fn longest(&self, tokens: &[u32], namespace: Option<&str>) -> Vec<usize> {
        self.longest_chain(Chain::new(self.page_hashes(tokens, namespace)))
    }

    /// Records the prompt whose pages have the hashes `pages` as
    /// dispatched to `device`.
    pub fn add_pages(&self, pages: &[u64], device: usize) {
        self.add_chain(Chain::new(pages.iter().copied()), device);
    }

    /// Forgets one earlier [`add_pages`](Self::add_pages) of the same
    /// pages.
    pub fn remove_pages(&self, pages: &[u64], device: usize) {
        self.remove_chain(Chain::new(pages.iter().copied()), device);
    }

    /// [`longest`](Self::longest) of the prompt whose pages have the
    /// hashes `pages`, in tokens.
    pub fn longest_pages(&self, pages: &[u64]) -> Vec<usize> {
        self.longest_chain(Chain::new(pages.iter().copied()))
    }

    fn add_chain(&self, chain: impl Iterator<Item = u64>, device: usize) {
        if device >= self.devices {
            return;
        }
        let n = self.devices;
        for h in chain {
            self.shard(h)
                .entry(h)
                .or_insert_with(|| vec![0; n].into_boxed_slice())[device] += 1;
        }
    }

    fn remove_chain(&self, chain: impl Iterator<Item = u64>, device: usize) {
        if device >= self.devices {
            return;
        }
        for h in chain {
            let mut shard = self.shard(h);
            if let Some(c) = shard.get_mut(&h) {
                c[device] = c[device].saturating_sub(1);
                if c.iter().all(|&x| x == 0) {
                    shard.remove(&h);
                }
            }
        }
    }

    fn longest_chain(&self, chain: impl Iterator<Item = u64>) -> Vec<usize> {
        let mut out = vec![0; self.devices];
        let mut alive: Vec<bool> = vec![true; self.devices];
        for (i, h) in chain.enumerate() {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The longest prefix per device by brute force over the prompts sent.
    fn naive(sent: &[(Vec<u64>, usize)], devices: usize, page: usize, q: &[u64]) -> Vec<usize> {
        let mut out = vec![0; devices];
        for (p, d) in sent {
            let common = p.iter().zip(q).take_while(|(a, b)| a == b).count();
            out[*d] = out[*d].max(common * page);
        }
        out
    }

    #[test]
    fn pages_match_a_brute_force_model_under_adds_and_removes() {
        // Prompts over a 3-letter alphabet of page hashes, so that they
        // share prefixes, and the same page recurs at other positions.
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let (devices, page) = (3, 4);
        let p = PendingIndex::new(devices, page);
        let mut sent: Vec<(Vec<u64>, usize)> = Vec::new();
        for _ in 0..3000 {
            let len = 1 + next(6) as usize;
            let prompt: Vec<u64> = (0..len).map(|_| 0xabc0 + next(3)).collect();
            match next(3) {
                0 if !sent.is_empty() => {
                    let (q, d) = sent.swap_remove(next(sent.len() as u64) as usize);
                    p.remove_pages(&q, d);
                }
                1 => {
                    let d = next(devices as u64) as usize;
                    p.add_pages(&prompt, d);
                    sent.push((prompt, d));
                }
                _ => assert_eq!(
                    p.longest_pages(&prompt),
                    naive(&sent, devices, page, &prompt),
                    "{prompt:x?} against {sent:x?}"
                ),
            }
        }
        for (q, d) in sent.drain(..) {
            p.remove_pages(&q, d);
        }
        assert!(p.is_empty());
    }
}
