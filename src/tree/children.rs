//! Children arrays: [`Children`], the immutable, hash-sorted array of a
//! node's children that is replaced copy-on-write (flat up to `FLAT_MAX`
//! entries, sorted chunks shared between versions beyond), and
//! [`page_hash`], the hash a child is filed under.

use super::node::{Node, NodePtr};
use smallvec::SmallVec;

/// The hash a child is filed under: its first token at page size 1, a
/// 64-bit mix of its first page otherwise. Equal hashes are resolved by
/// comparing the child's key.
pub(crate) fn page_hash(page: &[u32]) -> u64 {
    if let [t] = page {
        return u64::from(*t);
    }
    page.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| {
        (h.rotate_left(5) ^ u64::from(t)).wrapping_mul(0x517c_c1b7_2722_0a95)
    })
}

/// Where `hash` would sit among `n` sorted hashes spread evenly over
/// `lo..=hi`.
fn guess(hash: u64, (lo, hi): (u64, u64), n: usize) -> usize {
    if n == 0 || hash <= lo {
        return 0;
    }
    let span = u128::from(hi - lo) + 1;
    (u128::from(hash - lo) * n as u128 / span) as usize
}

/// `s.partition_point(p)` (`p` true on a prefix of `s`), searched outward
/// from `guess`: a few probes when the guess is close, O(log n) anyway.
fn partition_near<T>(s: &[T], guess: usize, p: impl Fn(&T) -> bool) -> usize {
    let n = s.len();
    if n == 0 {
        return 0;
    }
    let g = guess.min(n - 1);
    let (lo, hi) = if p(&s[g]) {
        // The answer is in (g, n]: gallop right.
        let (mut lo, mut step) = (g + 1, 1);
        let hi = loop {
            let probe = g + step;
            if probe >= n {
                break n;
            }
            if !p(&s[probe]) {
                break probe;
            }
            lo = probe + 1;
            step *= 2;
        };
        (lo, hi)
    } else {
        // The answer is in [0, g]: gallop left.
        let (mut hi, mut step) = (g, 1);
        let lo = loop {
            if step > g {
                break 0;
            }
            let probe = g - step;
            if p(&s[probe]) {
                break probe + 1;
            }
            hi = probe;
            step *= 2;
        };
        (lo, hi)
    };
    lo + s[lo..hi].partition_point(&p)
}

/// One child entry: the hash of the child's first page, and the child.
pub(crate) type ChildEntry = (u64, NodePtr);

/// Children arrays up to this size are one flat array.
const FLAT_MAX: usize = 64;
/// Chunks of a wide node's array split when they grow past this.
const CHUNK_MAX: usize = 48;

/// One sorted chunk of a wide node's array: immutable, shared by the
/// versions of the array that did not change it, and owned by no reference
/// count. Ownership follows the newest version: the array a node currently
/// publishes owns every chunk it holds; a version built from it hands the
/// chunks it keeps to the new version, and the chunks it replaces are
/// retired with the old version when the new one is published
/// ([`Children::settle`]), so each chunk is freed exactly once, after every
/// reader that could hold an array naming it. Copying an array therefore
/// copies plain pointers: no reference count is touched on a cold chunk when
/// a child is added, nor when the old array is freed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Chunk(*const [ChildEntry]);

// SAFETY: a chunk is an immutable boxed slice of `ChildEntry` (itself
// `Send + Sync`); it is read through arrays under epoch guards and freed
// once, by its owner (see above).
unsafe impl Send for Chunk {}
// SAFETY: as above; never mutated after construction.
unsafe impl Sync for Chunk {}

impl Chunk {
    fn new(entries: &[ChildEntry]) -> Chunk {
        let c = Chunk(Box::into_raw(Box::<[ChildEntry]>::from(entries)));
        #[cfg(loom)]
        crate::sync::probe::chunk_born(c.0.cast::<u8>() as usize);
        c
    }

    /// The chunk's entries, for as long as the array holding it is borrowed.
    fn entries(&self) -> &[ChildEntry] {
        #[cfg(loom)]
        crate::sync::probe::assert_chunk_live(self.0.cast::<u8>() as usize);
        // SAFETY: a chunk named by an array is freed only after that array
        // can no longer be read: a replaced chunk is retired together with
        // the version that named it (after the grace period of every guard
        // that could load it), and the chunks of a current array are freed
        // only when its node is gone or the tree is torn down, with no
        // reader left. `self` is borrowed from such an array.
        unsafe { &*self.0 }
    }

    /// Frees the chunk.
    ///
    /// # Safety
    /// Called once per chunk, by its owner, when no array that a reader can
    /// still hold names it.
    pub(crate) unsafe fn free(self) {
        #[cfg(loom)]
        crate::sync::probe::chunk_died(self.0.cast::<u8>() as usize);
        // SAFETY: the caller's contract; the pointer came from
        // `Box::into_raw`.
        drop(unsafe { Box::from_raw(self.0.cast_mut()) });
    }
}

/// A wide node's array: sorted chunks, each with its first hash.
#[derive(Debug)]
pub(crate) struct Chunked {
    /// Non-empty sorted chunks, each after its first hash (one index: a
    /// lookup finds the chunk and its pointer on the same line); every hash
    /// of chunk i is <= every hash of chunk i + 1.
    index: Vec<(u64, Chunk)>,
    /// Chunks of the version this one was built from that it no longer
    /// holds: retired when this version is published.
    replaced: SmallVec<[Chunk; 2]>,
}

/// An immutable array of children sorted by [`page_hash`], replaced
/// copy-on-write. A node without children holds no array at all; up to
/// `FLAT_MAX` children are one flat array (16 bytes each); wider nodes (a
/// system prompt with thousands of continuations) keep sorted chunks of at
/// most `CHUNK_MAX`, shared between versions (see [`Chunk`]), so adding or
/// removing a child copies one chunk and the chunk index rather than the
/// whole array.
///
/// Dropping an array frees its own allocation only, never a chunk: an old
/// version shares its chunks with the current one. The chunks of a current
/// array are freed by [`Children::free_chunks`] (node drop, teardown).
#[derive(Debug)]
pub(crate) enum Children {
    /// Up to `FLAT_MAX` entries.
    Flat(Vec<ChildEntry>),
    /// Sorted chunks.
    Chunked(Chunked),
}

impl Default for Children {
    fn default() -> Self {
        Children::Flat(Vec::new())
    }
}

/// What a node without children points at.
pub(crate) static NO_CHILDREN: Children = Children::Flat(Vec::new());

impl Children {
    /// One flat array.
    pub(crate) fn flat(entries: Vec<ChildEntry>) -> Children {
        Children::Flat(entries)
    }

    /// Whether there are no children.
    pub(crate) fn is_empty(&self) -> bool {
        match self {
            Children::Flat(v) => v.is_empty(),
            Children::Chunked(c) => c.index.is_empty(),
        }
    }

    fn index(&self) -> &[(u64, Chunk)] {
        match self {
            Children::Flat(_) => &[],
            Children::Chunked(c) => &c.index,
        }
    }

    /// Every entry, in hash order.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = &ChildEntry> {
        let flat: &[ChildEntry] = match self {
            Children::Flat(v) => v,
            Children::Chunked(_) => &[],
        };
        flat.iter()
            .chain(self.index().iter().flat_map(|(_, c)| c.entries().iter()))
    }

    /// The children filed under `hash` (usually one), in order.
    ///
    /// The searches start where a uniformly distributed hash would be
    /// (page hashes are 64-bit mixes) and widen from there, so a lookup in
    /// a wide node touches a line or two of the chunk index and of the
    /// chunk instead of a binary search's chain of misses; other
    /// distributions (token ids at page size 1) cost a binary search.
    pub(crate) fn with_hash(&self, hash: u64) -> impl Iterator<Item = &Node> {
        type Found<'a> = (&'a [ChildEntry], &'a [(u64, Chunk)], (u64, u64));
        let (flat, chunks, bounds): Found<'_> = match self {
            Children::Flat(v) => (v, &[], (0, u64::MAX)),
            Children::Chunked(c) => {
                // The first chunk that can hold `hash`: the one before the
                // first chunk starting above it, or an earlier one that ends
                // with it (equal hashes may straddle a boundary).
                let at = Children::first_chunk_for(&c.index, hash);
                let hi = c.index.get(at + 1).map_or(u64::MAX, |e| e.0);
                (&[], &c.index[at..], (c.index[at].0, hi))
            }
        };
        let lo = partition_near(flat, guess(hash, bounds, flat.len()), |(h, _)| *h < hash);
        let mut first = Some(bounds);
        flat[lo..]
            .iter()
            .chain(chunks.iter().flat_map(move |(_, ch)| {
                let ch = ch.entries();
                // The bounds are known for the first chunk only (the one
                // the hash falls in); a run of equal hashes continues at the
                // start of the next ones.
                let g = first.take().map_or(0, |b| guess(hash, b, ch.len()));
                let lo = partition_near(ch, g, |(h, _)| *h < hash);
                ch[lo..].iter()
            }))
            .skip_while(move |(h, _)| *h < hash)
            .take_while(move |(h, _)| *h == hash)
            // SAFETY: the entries are this array's, and arrays are read only
            // through `children_ref(guard)`, whose borrow (and so this
            // iterator's) the guard outlives.
            .map(|(_, c)| unsafe { c.node_unchecked() })
    }

    /// Every child with the hash it is filed under, in hash order.
    pub(crate) fn nodes(&self) -> impl DoubleEndedIterator<Item = (u64, &Node)> {
        // SAFETY: as in `with_hash`: the references live no longer than this
        // array's borrow, which its guard outlives.
        self.iter()
            .map(|(h, c)| (*h, unsafe { c.node_unchecked() }))
    }

    /// Chunked children from an index of non-empty sorted chunks with their
    /// first hashes (kept by the caller: recomputing them would touch every
    /// chunk, a cache miss each on a wide node).
    fn chunked(index: Vec<(u64, Chunk)>, replaced: SmallVec<[Chunk; 2]>) -> Children {
        Children::Chunked(Chunked { index, replaced })
    }

    /// The first chunk of `c` that can hold `hash` (see `with_hash`).
    fn first_chunk_for(index: &[(u64, Chunk)], hash: u64) -> usize {
        let g = guess(hash, (0, u64::MAX), index.len());
        let mut at = partition_near(index, g, |e| e.0 <= hash).saturating_sub(1);
        while at > 0 && index[at].0 == hash {
            at -= 1;
        }
        at
    }

    /// A copy with `child` added under `hash`.
    pub(crate) fn with_added(&self, hash: u64, child: NodePtr) -> Children {
        match self {
            Children::Flat(v) => {
                let mut entries = Vec::with_capacity(v.len() + 1);
                let at = v.partition_point(|(h, _)| *h <= hash);
                entries.extend_from_slice(&v[..at]);
                entries.push((hash, child));
                entries.extend_from_slice(&v[at..]);
                if entries.len() <= FLAT_MAX {
                    Children::Flat(entries)
                } else {
                    let index = entries
                        .chunks(CHUNK_MAX / 2)
                        .map(|p| (p[0].0, Chunk::new(p)))
                        .collect();
                    Children::chunked(index, SmallVec::new())
                }
            }
            Children::Chunked(ch) => {
                let c = ch.index.partition_point(|e| e.0 <= hash).saturating_sub(1);
                let old = ch.index[c].1.entries();
                let at = old.partition_point(|(h, _)| *h <= hash);
                let mut grown = Vec::with_capacity(old.len() + 1);
                grown.extend_from_slice(&old[..at]);
                grown.push((hash, child));
                grown.extend_from_slice(&old[at..]);
                let mut out = Vec::with_capacity(ch.index.len() + 1);
                out.extend_from_slice(&ch.index[..c]);
                if grown.len() > CHUNK_MAX {
                    let half = grown.len() / 2;
                    out.push((grown[0].0, Chunk::new(&grown[..half])));
                    out.push((grown[half].0, Chunk::new(&grown[half..])));
                } else {
                    out.push((grown[0].0, Chunk::new(&grown)));
                }
                out.extend_from_slice(&ch.index[c + 1..]);
                Children::chunked(out, smallvec::smallvec![ch.index[c].1])
            }
        }
    }

    /// A copy in which the entry of `old` (filed under `hash`) is replaced by
    /// `new`, or, with `new` = `None`, removed.
    pub(crate) fn with_changed(&self, hash: u64, old: &Node, new: Option<NodePtr>) -> Children {
        let change = |v: &[ChildEntry]| -> Vec<ChildEntry> {
            let mut out = Vec::with_capacity(v.len());
            for &(h, c) in v {
                if h == hash && std::ptr::eq(c.0, old) {
                    if let Some(n) = new {
                        out.push((h, n));
                    }
                } else {
                    out.push((h, c));
                }
            }
            out
        };
        match self {
            Children::Flat(v) => Children::Flat(change(v)),
            Children::Chunked(chunked) => {
                let n = chunked.index.len();
                let mut out: Vec<(u64, Chunk)> = Vec::with_capacity(n);
                let mut replaced = SmallVec::new();
                // Only the chunks that can hold `hash` are looked into (a
                // run of equal hashes may span several); the others are
                // kept without being touched.
                let from = Children::first_chunk_for(&chunked.index, hash);
                out.extend_from_slice(&chunked.index[..from]);
                let mut i = from;
                while i < n && chunked.index[i].0 <= hash {
                    let (first, chunk) = chunked.index[i];
                    let ch = chunk.entries();
                    if ch.iter().any(|(h, c)| *h == hash && std::ptr::eq(c.0, old)) {
                        let v = change(ch);
                        if let Some(e) = v.first() {
                            out.push((e.0, Chunk::new(&v)));
                        }
                        replaced.push(chunk);
                    } else {
                        out.push((first, chunk));
                    }
                    i += 1;
                }
                out.extend_from_slice(&chunked.index[i..]);
                Children::chunked(out, replaced)
            }
        }
    }

    /// Called when this version is published in place of the one it was
    /// built from: hands over the chunks it replaced, which the caller
    /// retires with the old version (they are freed after its grace period).
    pub(crate) fn settle(&mut self) -> SmallVec<[Chunk; 2]> {
        match self {
            Children::Flat(_) => SmallVec::new(),
            Children::Chunked(c) => std::mem::take(&mut c.replaced),
        }
    }

    /// Frees the chunks of this array, the current one of a node that no
    /// reader can reach any more.
    ///
    /// # Safety
    /// This array is (or was, until just now) the current array of its node,
    /// it was settled, and no reader can hold it or any older version.
    pub(crate) unsafe fn free_chunks(&mut self) {
        if let Children::Chunked(c) = self {
            debug_assert!(c.replaced.is_empty(), "an unsettled version");
            for (_, chunk) in c.index.drain(..) {
                // SAFETY: the current array owns its chunks (see `Chunk`);
                // the caller's contract says no reader remains.
                unsafe { chunk.free() };
            }
        }
    }

    /// All entries, for teardown: frees the chunks.
    ///
    /// # Safety
    /// As for [`free_chunks`](Self::free_chunks).
    pub(crate) unsafe fn into_entries(mut self) -> Vec<ChildEntry> {
        let entries = match &self {
            Children::Flat(v) => v.clone(),
            Children::Chunked(_) => self.iter().copied().collect(),
        };
        // SAFETY: the caller's contract.
        unsafe { self.free_chunks() };
        entries
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A node of the test's own: the leaves it builds live until the end
    /// of the test (it never releases them while using them).
    fn node(n: &NodePtr) -> &Node {
        // SAFETY: see above; no tree, no reclamation in these tests.
        unsafe { n.node_unchecked() }
    }
    use crate::tree::node::{ImageParts, ParentPtr};
    use crate::tree::values::DeviceValues;

    fn leaf(id: u64) -> NodePtr {
        NodePtr::link(Node::new(
            id,
            false,
            1,
            ImageParts {
                parent: ParentPtr(std::ptr::null()),
                key: &[1],
                values: DeviceValues::none(),
            },
            Children::default(),
            0,
        ))
    }

    /// The kept first hashes are the chunks' first hashes.
    fn assert_firsts(c: &Children) {
        if let Children::Chunked(ch) = c {
            for (first, chunk) in &ch.index {
                assert!(!chunk.entries().is_empty());
                assert_eq!(*first, chunk.entries()[0].0);
            }
        }
    }

    /// What publishing does, without readers: the replaced chunks are
    /// freed at once.
    fn settled(mut c: Children) -> Children {
        for chunk in c.settle() {
            // SAFETY: no reader in this test; each replaced chunk was owned
            // by the version just dropped and is named by no other.
            unsafe { chunk.free() };
        }
        c
    }

    #[test]
    fn wide_children_stay_sorted_and_findable() {
        let mut c = Children::default();
        let mut all = Vec::new();
        // 600 entries with colliding hashes every 7th, in scrambled order.
        for i in 0..600u64 {
            let h = (i * 7919) % 613 / 7 * 7;
            let n = leaf(i);
            c = settled(c.with_added(h, n));
            all.push((h, n));
        }
        assert!(matches!(c, Children::Chunked(..)));
        assert_firsts(&c);
        let hashes: Vec<u64> = c.iter().map(|e| e.0).collect();
        assert!(hashes.windows(2).all(|w| w[0] <= w[1]), "sorted by hash");
        assert_eq!(hashes.len(), 600);
        for (h, n) in &all {
            assert!(
                c.with_hash(*h).any(|x| std::ptr::eq(x, n.0)),
                "entry {} under {h}",
                node(n).id
            );
            assert!(c
                .with_hash(*h)
                .all(|x| all.iter().any(|(h2, y)| h2 == h && std::ptr::eq(x, y.0))));
        }
        // Remove every other entry, replace the rest.
        let mut fresh = Vec::new();
        for (i, (h, n)) in all.iter().enumerate() {
            c = if i % 2 == 0 {
                settled(c.with_changed(*h, node(n), None))
            } else {
                let f = leaf(10_000 + i as u64);
                fresh.push(f);
                settled(c.with_changed(*h, node(n), Some(f)))
            };
        }
        assert_eq!(c.iter().count(), 300);
        assert_firsts(&c);
        assert!(c.iter().all(|(_, n)| node(n).id >= 10_000));
        let hashes: Vec<u64> = c.iter().map(|e| e.0).collect();
        assert!(hashes.windows(2).all(|w| w[0] <= w[1]));
        for (i, (h, _)) in all.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
            assert!(c.with_hash(*h).any(|x| x.id == 10_000 + i as u64));
        }
        // SAFETY: the test's current array; no reader.
        unsafe { c.free_chunks() };
        for (_, n) in all {
            // SAFETY: linked once above, released once, not used after.
            unsafe { n.release() };
        }
        for n in fresh {
            // SAFETY: as above.
            unsafe { n.release() };
        }
    }

    #[test]
    fn partition_near_agrees_with_partition_point_from_any_guess() {
        let mut x = 0x1234_5678_9abc_def0u64;
        for n in [0usize, 1, 2, 3, 7, 64, 100] {
            let mut v: Vec<u64> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % 50
                })
                .collect();
            v.sort_unstable();
            for target in 0..52u64 {
                for g in [0, 1, n / 2, n.saturating_sub(1), n, n + 5] {
                    assert_eq!(
                        partition_near(&v, g, |&h| h < target),
                        v.partition_point(|&h| h < target),
                        "n {n} target {target} guess {g}"
                    );
                    assert_eq!(
                        partition_near(&v, g, |&h| h <= target),
                        v.partition_point(|&h| h <= target)
                    );
                }
            }
        }
        assert_eq!(guess(5, (0, u64::MAX), 10), 0);
        assert_eq!(guess(u64::MAX, (0, u64::MAX), 10), 9);
        assert_eq!(guess(u64::MAX / 2, (0, u64::MAX), 10), 4);
    }

    #[test]
    fn page_hash_is_exact_at_page_size_one() {
        assert_eq!(page_hash(&[7]), 7);
        assert_ne!(page_hash(&[1, 2]), page_hash(&[2, 1]));
    }
}
