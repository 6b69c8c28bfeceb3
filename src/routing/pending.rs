//! [`PendingIndex`]: the prefixes dispatched to each device (or rank) and
//! not yet in its cache, so that a router sends a burst of requests with
//! one prefix after the first, before the first's prompt is cached.

use crate::sync::{lock, Mutex};
use std::cmp::Ordering;
use std::hash::{BuildHasher, Hasher};

/// The prompts dispatched to each device and not yet inserted into the
/// tree, each as whole pages named by a chained 64-bit hash (of the page's
/// tokens, everything before it and the namespace), so that two prompts'
/// chains agree exactly as far as the prompts do. A hash collision
/// (probability about n²/2⁶⁴ for n distinct pages) can only mislead
/// routing, never the cache.
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
/// Each device keeps its prompts' chains sorted (lexicographically, a
/// prompt before its extensions), identical prompts counted once. The
/// longest prefix of a prompt sent to a device is then shared with one of
/// the two chains it sorts between, and the first place where two chains
/// part is found by bisection (they agree up to it and differ from it on):
/// a lookup costs about log₂(prompts) · log₂(pages) reads of a chain, and
/// recording or forgetting a prompt that much plus moving the device's
/// list, where one probe of a shared map per page would cost a long
/// prompt thousands. Devices are independent, each behind its own mutex,
/// held for one device's part of a call.
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
    devices: Box<[Mutex<Sent>]>,
    hasher: std::collections::hash_map::RandomState,
}

/// One device's prompts: their chains in [`order`], each once, with how
/// many times it was added and not yet removed.
#[derive(Debug, Default)]
struct Sent(Vec<(PageChain, u32)>);

/// A prompt's whole pages as a [`PendingIndex`] names them: each page's
/// hash chained with every page before it. Made once
/// ([`PendingIndex::chain_pages`], [`PendingIndex::chain_tokens`]) and
/// used for a lookup, a record and the removal; cloning shares it.
///
/// ```
/// use radixkv::routing::PendingIndex;
/// let p = PendingIndex::new(2, 16);
/// let c = p.chain_pages(&[0xa1, 0xb2]);
/// assert_eq!(c.pages(), 2);
/// assert_eq!(p.longest_chain(&c), vec![0, 0]);
/// p.add_chain(c.clone(), 1);
/// assert_eq!(p.longest_chain(&c), vec![0, 32]);
/// p.remove_chain(&c, 1);
/// assert!(p.is_empty());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageChain(std::sync::Arc<Vec<u64>>);

impl PageChain {
    /// Whole pages in the prompt.
    pub fn pages(&self) -> usize {
        self.0.len()
    }
}

/// Builds a [`PageChain`] page by page, for a caller that hashes the
/// pages itself: chaining as each page's hash is made lets the processor
/// overlap the chain's serial multiplies with the hashing.
///
/// ```
/// use radixkv::routing::{PageChainBuilder, PendingIndex};
/// let mut b = PageChainBuilder::with_capacity(2);
/// b.push(0xa1);
/// b.push(0xb2);
/// assert_eq!(b.finish(), PendingIndex::new(1, 16).chain_pages(&[0xa1, 0xb2]));
/// ```
#[derive(Debug)]
pub struct PageChainBuilder {
    prev: u64,
    chained: Vec<u64>,
}

impl PageChainBuilder {
    /// An empty chain with room for `pages` pages.
    pub fn with_capacity(pages: usize) -> Self {
        PageChainBuilder {
            prev: 0x243f_6a88_85a3_08d3,
            chained: Vec::with_capacity(pages),
        }
    }

    /// Appends the page whose hash is `page` (a uniform 64-bit hash of
    /// one page's tokens and namespace). One 64x64 -> 128-bit multiply,
    /// folded (the mixer of wyhash and foldhash): the inputs are uniform
    /// hashes already, so the outputs are too.
    #[inline]
    pub fn push(&mut self, page: u64) {
        let x =
            u128::from(self.prev ^ page) * u128::from(page.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15);
        self.prev = (x as u64) ^ ((x >> 64) as u64);
        self.chained.push(self.prev);
    }

    /// The chain.
    pub fn finish(self) -> PageChain {
        // The vector moves into the shared allocation's header: no copy of
        // the pages.
        PageChain(std::sync::Arc::new(self.chained))
    }
}

/// Chains per-page hashes: each output names its page and every page
/// before it.
fn chain(pages: impl ExactSizeIterator<Item = u64>) -> PageChain {
    let mut b = PageChainBuilder::with_capacity(pages.len());
    for page in pages {
        b.push(page);
    }
    b.finish()
}

/// Pages two chains share from the start: they agree before that many
/// and differ at every place from there (a chain value names its whole
/// prefix), so the first place they differ is found by bisection.
fn common(a: &[u64], b: &[u64]) -> usize {
    let n = a.len().min(b.len());
    // a[..lo] == b[..lo]; a[hi] != b[hi] or hi == n.
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if a[mid] == b[mid] {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Lexicographic order of two chains (a chain before its extensions),
/// through [`common`].
fn order(a: &[u64], b: &[u64]) -> Ordering {
    let c = common(a, b);
    match (a.get(c), b.get(c)) {
        (Some(x), Some(y)) => x.cmp(y),
        _ => a.len().cmp(&b.len()),
    }
}

impl Sent {
    /// Where `chain` is or would go.
    fn find(&self, chain: &[u64]) -> Result<usize, usize> {
        self.0.binary_search_by(|(c, _)| order(&c.0, chain))
    }

    fn add(&mut self, chain: PageChain) {
        match self.find(&chain.0) {
            Ok(i) => self.0[i].1 += 1,
            Err(i) => self.0.insert(i, (chain, 1)),
        }
    }

    fn remove(&mut self, chain: &[u64]) {
        // A collision could break the order's assumption and hide the
        // entry from the bisection: then it is looked for one by one, so
        // that nothing stays behind.
        let at = self
            .find(chain)
            .ok()
            .or_else(|| self.0.iter().position(|(c, _)| *c.0 == *chain));
        if let Some(i) = at {
            self.0[i].1 -= 1;
            if self.0[i].1 == 0 {
                self.0.remove(i);
            }
        }
    }

    /// Pages of `chain` the longest prompt here shares with it: one of its
    /// two neighbours in the order shares the most.
    fn longest(&self, chain: &[u64]) -> usize {
        match self.find(chain) {
            Ok(_) => chain.len(),
            Err(i) => {
                let before = i
                    .checked_sub(1)
                    .map_or(0, |j| common(&self.0[j].0 .0, chain));
                let after = self.0.get(i).map_or(0, |(c, _)| common(&c.0, chain));
                before.max(after)
            }
        }
    }
}

impl PendingIndex {
    /// An empty index for `devices` devices and pages of `page_size` tokens.
    pub fn new(devices: usize, page_size: usize) -> Self {
        PendingIndex {
            page_size: page_size.max(1),
            devices: (0..devices).map(|_| Mutex::new(Sent::default())).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }

    fn page_hashes<'a>(
        &'a self,
        tokens: &'a [u32],
        namespace: Option<&'a str>,
    ) -> impl ExactSizeIterator<Item = u64> + 'a {
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

    /// The chain of `tokens`' whole pages in `namespace` (each page
    /// hashed with this index's keyed SipHash).
    pub fn chain_tokens(&self, tokens: &[u32], namespace: Option<&str>) -> PageChain {
        chain(self.page_hashes(tokens, namespace))
    }

    /// The chain of the prompt whose pages have the hashes `pages` (each a
    /// uniform 64-bit hash of one page's tokens and namespace, not chained,
    /// such as the block hashes KV events carry).
    pub fn chain_pages(&self, pages: &[u64]) -> PageChain {
        chain(pages.iter().copied())
    }

    /// Records `tokens` (whole pages) as dispatched to `device`.
    pub fn add(&self, tokens: &[u32], namespace: Option<&str>, device: usize) {
        self.add_chain(self.chain_tokens(tokens, namespace), device);
    }

    /// Forgets one earlier [`add`](Self::add) of the same tokens.
    pub fn remove(&self, tokens: &[u32], namespace: Option<&str>, device: usize) {
        self.remove_chain(&self.chain_tokens(tokens, namespace), device);
    }

    /// Per device, the longest prefix of `tokens` (whole pages) dispatched
    /// there and not yet removed, in tokens (each device read under its
    /// own lock: a snapshot per device, which is all routing needs).
    pub fn longest(&self, tokens: &[u32], namespace: Option<&str>) -> Vec<usize> {
        self.longest_chain(&self.chain_tokens(tokens, namespace))
    }

    /// Records the prompt whose pages have the hashes `pages` as
    /// dispatched to `device`.
    pub fn add_pages(&self, pages: &[u64], device: usize) {
        self.add_chain(self.chain_pages(pages), device);
    }

    /// Forgets one earlier [`add_pages`](Self::add_pages) of the same
    /// pages.
    pub fn remove_pages(&self, pages: &[u64], device: usize) {
        self.remove_chain(&self.chain_pages(pages), device);
    }

    /// [`longest`](Self::longest) of the prompt whose pages have the
    /// hashes `pages`, in tokens.
    pub fn longest_pages(&self, pages: &[u64]) -> Vec<usize> {
        self.longest_chain(&self.chain_pages(pages))
    }

    /// Records the prompt of `chain` (made by this index) as dispatched to
    /// `device`; a device the index does not have, or no whole page, is
    /// ignored.
    pub fn add_chain(&self, chain: PageChain, device: usize) {
        if let (Some(d), false) = (self.devices.get(device), chain.0.is_empty()) {
            lock(d).add(chain);
        }
    }

    /// Forgets one earlier [`add_chain`](Self::add_chain) of an equal
    /// chain to `device` (nothing, if there was none).
    pub fn remove_chain(&self, chain: &PageChain, device: usize) {
        if let (Some(d), false) = (self.devices.get(device), chain.0.is_empty()) {
            lock(d).remove(&chain.0);
        }
    }

    /// [`longest`](Self::longest) of the prompt of `chain`, in tokens.
    pub fn longest_chain(&self, chain: &PageChain) -> Vec<usize> {
        self.devices
            .iter()
            .map(|d| lock(d).longest(&chain.0) * self.page_size)
            .collect()
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.devices.iter().all(|d| lock(d).0.is_empty())
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

    /// Random adds, removes and lookups of prompts of 1 to `max_len`
    /// pages over an alphabet of `letters` page hashes (so that they share
    /// prefixes and the same page recurs at other positions), each lookup
    /// checked against [`naive`]; everything removed at the end.
    fn against_the_model(seed: u64, max_len: u64, letters: u64, steps: usize) {
        let mut x: u64 = seed;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let (devices, page) = (3, 4);
        let p = PendingIndex::new(devices, page);
        let mut sent: Vec<(Vec<u64>, usize)> = Vec::new();
        for _ in 0..steps {
            let len = 1 + next(max_len) as usize;
            let prompt: Vec<u64> = (0..len).map(|_| 0xabc0 + next(letters)).collect();
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
        // A prompt never added, forgotten: nothing changes.
        p.remove_pages(&[0xdead], 0);
        for (q, d) in sent.drain(..) {
            p.remove_pages(&q, d);
        }
        assert!(p.is_empty());
    }

    #[test]
    fn pages_match_a_brute_force_model_under_adds_and_removes() {
        // Short prompts over three pages: many equal ones.
        against_the_model(0x2545_f491_4f6c_dd1d, 6, 3, 3000);
        // Long prompts over two pages: long shared runs, so that the
        // bisection of where two chains part is exercised.
        against_the_model(0x9e37_79b9_7f4a_7c15, 60, 2, 3000);
        // Long prompts that mostly share a long head.
        against_the_model(0x1234_5678_9abc_def1, 200, 1, 500);
    }

    #[test]
    fn pages_of_an_unknown_device_are_ignored() {
        let p = PendingIndex::new(2, 1);
        p.add_pages(&[1, 2], 5);
        assert_eq!(p.longest_pages(&[1, 2]), vec![0, 0]);
        p.add_pages(&[], 0);
        assert!(p.is_empty());
    }
}
