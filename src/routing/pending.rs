//! [`PendingIndex`]: the prefixes dispatched to each device (or rank) and
//! not yet in its cache, so that a router sends a burst of requests with
//! one prefix after the first, before the first's prompt is cached.

use crate::sync::{lock, Mutex};
use std::collections::HashMap;
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
/// Each device's prompts are a radix tree over their chains, behind the
/// device's own mutex (held for one walk of that device's tree): a node
/// stands for a run of pages (a range of one prompt's chain, shared by
/// every prompt below it) and counts the prompts that end at it and those
/// that run through it. A node is found by the chain value of its first
/// page (a chain value names its whole prefix, so one table serves every
/// depth), and a query runs through a whole node when its chain value at
/// the node's last page is the node's (kept in the node, so the prompt's
/// chain is not read). A lookup is then a table probe and a node per
/// branch point on the query's path, and one bisection of a chain where
/// the query leaves the tree; a sorted list of the device's prompts would
/// compare the query with several long chains instead, each comparison a
/// bisection with a cache miss at each step. Recording or forgetting a
/// prompt is the same walk, plus a node or two made, split, merged or
/// freed; a node that ends no prompt and has one child takes the child
/// in, so a conversation whose turns are sent and settle one after the
/// other keeps one node.
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
    devices: Box<[Mutex<Tree>]>,
    hasher: std::collections::hash_map::RandomState,
}

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

/// The first page's position key.
const FIRST_POSITION: u64 = 0x243f_6a88_85a3_08d3;

/// What a page's position key adds to the one before it.
const POSITION_STEP: u64 = 0xa076_1d64_78bd_642f;

/// A page's hash `page` mixed with its position's key `at`: one 64x64 ->
/// 128-bit multiply, folded (the mixer of wyhash and foldhash).
#[inline(always)]
fn mix(page: u64, at: u64) -> u64 {
    let x = u128::from(page ^ at) * u128::from(page.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15);
    (x as u64) ^ ((x >> 64) as u64)
}

/// Chains per-page hashes (each a uniform 64-bit hash of one page's
/// tokens and namespace): each output names its page and every page
/// before it.
///
/// A page's chain value is the sum (wrapping) of a mix of each page's hash
/// with its position, over the page and every page before it. The mixes
/// are independent of each other, so the processor makes several at once;
/// only the sum waits on the page before, one addition a page (a chained
/// multiply per page, the other way to name a prefix, makes each page wait
/// for its predecessor's multiply). Two different prompts of one length
/// differ in some page at some position, whose mix is unrelated to the
/// others': their sums agree with probability about 2⁻⁶⁴.
fn chain(pages: impl ExactSizeIterator<Item = u64>) -> PageChain {
    // Written in place, with the running sum and key in locals (kept in
    // registers): through a push, or a closure that captures them, each
    // page waits for the one before to store them and reads them back.
    let mut out = vec![0; pages.len()];
    let (mut sum, mut at) = (0u64, FIRST_POSITION);
    for (o, page) in out.iter_mut().zip(pages) {
        sum = sum.wrapping_add(mix(page, at));
        at = at.wrapping_add(POSITION_STEP);
        *o = sum;
    }
    PageChain(std::sync::Arc::new(out))
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

/// One run of pages of a device's tree: positions `start..end` of
/// `chain` (a prompt below it; every prompt below agrees with it there).
#[derive(Debug)]
struct Node {
    chain: PageChain,
    start: usize,
    end: usize,
    /// `chain`'s value at `end - 1`: a query whose value there is the
    /// same runs through the whole node.
    last: u64,
    /// Prompts that end here.
    here: u32,
    /// Prompts that end here or below (a node with none is freed).
    below: u32,
    /// Children, and the XOR of their keys: with one child, its key.
    kids: u32,
    kid_keys: u64,
}

impl Node {
    /// The key the node is found by: the chain value of its first page.
    fn key(&self) -> u64 {
        self.chain.0[self.start]
    }

    /// Pages of `q` that run along this node (at least its first, which
    /// found it; a query is not read past its end), given that `q` agrees
    /// with it at `self.start`.
    fn matched(&self, q: &[u64]) -> usize {
        let (start, end) = (self.start, self.end);
        if q.get(end - 1) == Some(&self.last) {
            return end;
        }
        let hi = end.min(q.len());
        match (self.chain.0.get(start + 1..hi), q.get(start + 1..hi)) {
            (Some(a), Some(b)) => start + 1 + common(a, b),
            _ => start + 1,
        }
    }
}

/// One device's prompts as a radix tree over their chains (see
/// [`PendingIndex`]): nodes in an arena (freed slots reused), found by
/// their first page's chain value.
#[derive(Debug, Default)]
struct Tree {
    nodes: Vec<Node>,
    free: Vec<usize>,
    /// Nodes by key. The keys come from prompts, so the table's hash is
    /// seeded (per process) rather than the identity.
    by_first: HashMap<u64, usize, foldhash::fast::RandomState>,
    /// A removal's path, kept between calls for its allocation.
    path: Vec<usize>,
}

impl Tree {
    /// The node that starts at page `depth` of the prompt `q`, if any.
    fn at(&self, q: &[u64], depth: usize) -> Option<usize> {
        let i = *self.by_first.get(q.get(depth)?)?;
        // A node found by a colliding value from another depth is not it.
        (self.nodes[i].start == depth).then_some(i)
    }

    /// A node of pages `start..end` of `chain` with no prompt and no child,
    /// in a free slot if there is one, filed under its key.
    fn node(&mut self, chain: PageChain, start: usize, end: usize) -> usize {
        let node = Node {
            last: chain.0[end - 1],
            chain,
            start,
            end,
            here: 0,
            below: 0,
            kids: 0,
            kid_keys: 0,
        };
        let key = node.key();
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.by_first.insert(key, i);
        i
    }

    /// Frees node `i` (unfiled already), dropping its share of its chain.
    fn release(&mut self, i: usize) {
        self.nodes[i].chain = PageChain(std::sync::Arc::default());
        self.free.push(i);
    }

    /// Walks `q` down from the root: calls `each` with every node it
    /// enters, the last one where `q` leaves the tree or ends; returns the
    /// pages of `q` the tree holds.
    fn walk(&self, q: &[u64], mut each: impl FnMut(usize)) -> usize {
        let (mut depth, mut matched) = (0, 0);
        while let Some(i) = self.at(q, depth) {
            let n = &self.nodes[i];
            matched = n.matched(q);
            each(i);
            if matched < n.end {
                break;
            }
            depth = n.end;
        }
        matched
    }

    /// Pages of `q` that the longest prompt here shares.
    fn longest(&self, q: &[u64]) -> usize {
        if self.by_first.is_empty() {
            return 0;
        }
        self.walk(q, |_| {})
    }

    /// Records the prompt `q` (not empty).
    fn add(&mut self, q: &PageChain) {
        let pages = &q.0;
        let mut depth = 0;
        let mut parent: Option<usize> = None;
        loop {
            let Some(mut i) = self.at(pages, depth) else {
                // The rest of the prompt is a new node.
                let leaf = self.node(q.clone(), depth, pages.len());
                (self.nodes[leaf].here, self.nodes[leaf].below) = (1, 1);
                if let Some(p) = parent {
                    self.nodes[p].kids += 1;
                    self.nodes[p].kid_keys ^= pages[depth];
                }
                return;
            };
            let m = self.nodes[i].matched(pages);
            if m < self.nodes[i].end {
                i = self.split(i, m);
            }
            let n = &mut self.nodes[i];
            n.below += 1;
            if n.end == pages.len() {
                n.here += 1;
                return;
            }
            (parent, depth) = (Some(i), n.end);
        }
    }

    /// Cuts node `i` at page `at` (inside it): a new node takes its pages
    /// before `at` (and its key) and has it as its one child. Returns the
    /// new node.
    fn split(&mut self, i: usize, at: usize) -> usize {
        let (chain, start, below) = {
            let n = &self.nodes[i];
            (n.chain.clone(), n.start, n.below)
        };
        let tail_key = chain.0[at];
        let head = self.node(chain, start, at);
        // Every prompt of the tail runs through the head.
        let h = &mut self.nodes[head];
        (h.below, h.kids, h.kid_keys) = (below, 1, tail_key);
        self.nodes[i].start = at;
        self.by_first.insert(tail_key, i);
        head
    }

    /// The nodes the prompt `q` runs through, ending exactly at its end,
    /// into `path`; false (and `path` partial) if there are none such.
    fn walk_exact(&self, q: &[u64], path: &mut Vec<usize>) -> bool {
        let matched = self.walk(q, |i| path.push(i));
        // Every node but the last was run through whole; the last must end
        // where `q` does.
        matched == q.len() && path.last().is_some_and(|&i| self.nodes[i].end == q.len())
    }

    /// Forgets one earlier [`add`](Self::add) of `q` (nothing, if there is
    /// none).
    fn remove(&mut self, q: &[u64]) {
        let mut path = std::mem::take(&mut self.path);
        path.clear();
        if self.walk_exact(q, &mut path) {
            self.uncount(&path);
        }
        self.path = path;
    }

    /// Takes one prompt off the nodes of `path` (from the root), which
    /// ends at its last node, if one does; then, bottom up, a node left
    /// with no prompt goes, and one that ends none and has one child takes
    /// that child in.
    fn uncount(&mut self, path: &[usize]) {
        let Some(&end) = path.last() else { return };
        if self.nodes[end].here == 0 {
            return;
        }
        self.nodes[end].here -= 1;
        for &i in path {
            self.nodes[i].below -= 1;
        }
        for k in (0..path.len()).rev() {
            let i = path[k];
            if self.nodes[i].below == 0 {
                let key = self.nodes[i].key();
                self.by_first.remove(&key);
                self.release(i);
                if let Some(&p) = k.checked_sub(1).and_then(|j| path.get(j)) {
                    self.nodes[p].kids -= 1;
                    self.nodes[p].kid_keys ^= key;
                }
            } else if self.nodes[i].kids == 1 && self.nodes[i].here == 0 {
                self.merge(i);
            }
        }
    }

    /// Node `i`, which ends no prompt and has one child, takes that child's
    /// pages, counts and children; the child is freed.
    fn merge(&mut self, i: usize) {
        let key = self.nodes[i].kid_keys;
        let Some(&c) = self.by_first.get(&key) else {
            return;
        };
        // Only a colliding chain value names a node that does not start
        // where this one ends: then it stays as it is.
        if c == i || self.nodes[c].start != self.nodes[i].end {
            return;
        }
        self.by_first.remove(&key);
        let child = &self.nodes[c];
        // The child's chain agrees with this node's over its pages.
        let (chain, end, last, here, kids, kid_keys) = (
            child.chain.clone(),
            child.end,
            child.last,
            child.here,
            child.kids,
            child.kid_keys,
        );
        self.release(c);
        let n = &mut self.nodes[i];
        (n.chain, n.end, n.last, n.here, n.kids, n.kid_keys) =
            (chain, end, last, here, kids, kid_keys);
    }
}

impl PendingIndex {
    /// An empty index for `devices` devices and pages of `page_size` tokens.
    pub fn new(devices: usize, page_size: usize) -> Self {
        PendingIndex {
            page_size: page_size.max(1),
            devices: (0..devices).map(|_| Mutex::new(Tree::default())).collect(),
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
            lock(d).add(&chain);
        }
    }

    /// Forgets one earlier [`add_chain`](Self::add_chain) of an equal
    /// chain to `device` (nothing, if there was none).
    pub fn remove_chain(&self, chain: &PageChain, device: usize) {
        if let Some(d) = self.devices.get(device) {
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
        self.devices.iter().all(|d| lock(d).by_first.is_empty())
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
        for d in p.devices.iter() {
            let tree = lock(d);
            assert_eq!(tree.free.len(), tree.nodes.len(), "every node freed");
        }
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
    fn a_conversation_whose_turns_settle_in_turn_keeps_two_nodes() {
        // Turn t is 10 (t + 1) pages, each turn extending the one before;
        // a turn is sent, then the turn before it settles.
        let turn = |t: u64| (0..10 * (t + 1)).collect::<Vec<u64>>();
        let p = PendingIndex::new(2, 1);
        p.add_pages(&turn(0), 1);
        for t in 1..100 {
            p.add_pages(&turn(t), 1);
            p.remove_pages(&turn(t - 1), 1);
            assert_eq!(p.longest_pages(&turn(t + 1)), vec![0, turn(t).len()]);
            let tree = lock(&p.devices[1]);
            // The settled turn's node took its one child in.
            assert_eq!(tree.by_first.len(), 1, "turn {t}");
            assert!(tree.nodes.len() <= 2, "freed nodes are reused");
        }
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
