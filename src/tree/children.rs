//! Children arrays: [`Children`], the immutable, hash-sorted array of a
//! node's children that is replaced copy-on-write (flat up to `FLAT_MAX`
//! entries, sorted chunks shared between versions beyond), and
//! [`page_hash`], the hash a child is filed under.

use super::node::{Node, NodePtr};
use crate::sync::Arc;

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

/// One child entry: the hash of the child's first page, and the child.
pub(crate) type ChildEntry = (u64, NodePtr);

/// Children arrays up to this size are one flat array.
const FLAT_MAX: usize = 64;
/// Chunks of a wide node's array split when they grow past this.
const CHUNK_MAX: usize = 64;

/// An immutable array of children sorted by [`page_hash`], replaced
/// copy-on-write. A node without children holds no array at all; up to
/// `FLAT_MAX` children are one flat array (16 bytes each); wider nodes (a
/// system prompt with thousands of continuations) keep sorted chunks of at
/// most `CHUNK_MAX`, shared between versions, so adding or removing a child
/// copies one chunk and the chunk index rather than the whole array.
#[derive(Debug)]
pub(crate) enum Children {
    /// Up to `FLAT_MAX` entries.
    Flat(Vec<ChildEntry>),
    /// Non-empty sorted chunks; every hash of chunk i is <= every hash of
    /// chunk i + 1.
    /// The second vector holds each chunk's first hash, contiguous, so a
    /// lookup touches one chunk only.
    Chunked(Vec<Arc<[ChildEntry]>>, Vec<u64>),
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
            Children::Chunked(c, _) => c.is_empty(),
        }
    }

    /// Every entry, in hash order.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = &ChildEntry> {
        let (flat, chunks): (&[ChildEntry], &[Arc<[ChildEntry]>]) = match self {
            Children::Flat(v) => (v, &[]),
            Children::Chunked(c, _) => (&[], c),
        };
        flat.iter().chain(chunks.iter().flat_map(|c| c.iter()))
    }

    /// The children filed under `hash` (usually one), in order.
    pub(crate) fn with_hash(&self, hash: u64) -> impl Iterator<Item = &Node> {
        let (flat, chunks): (&[ChildEntry], &[Arc<[ChildEntry]>]) = match self {
            Children::Flat(v) => (v, &[]),
            Children::Chunked(c, firsts) => {
                // The first chunk that can hold `hash`: the one before the
                // first chunk starting above it, or an earlier one that ends
                // with it (equal hashes may straddle a boundary).
                let mut at = firsts.partition_point(|&f| f <= hash).saturating_sub(1);
                while at > 0 && firsts[at] == hash {
                    at -= 1;
                }
                (&[], &c[at..])
            }
        };
        let lo = flat.partition_point(|(h, _)| *h < hash);
        flat[lo..]
            .iter()
            .chain(chunks.iter().flat_map(move |ch| {
                let lo = ch.partition_point(|(h, _)| *h < hash);
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

    /// Chunked children from non-empty sorted chunks.
    fn chunked(chunks: Vec<Arc<[ChildEntry]>>) -> Children {
        let firsts = chunks.iter().map(|ch| ch[0].0).collect();
        Children::Chunked(chunks, firsts)
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
                    Children::chunked(entries.chunks(CHUNK_MAX / 2).map(Arc::from).collect())
                }
            }
            Children::Chunked(chunks, firsts) => {
                let c = firsts.partition_point(|&f| f <= hash).saturating_sub(1);
                let old = &chunks[c];
                let at = old.partition_point(|(h, _)| *h <= hash);
                let mut grown = Vec::with_capacity(old.len() + 1);
                grown.extend_from_slice(&old[..at]);
                grown.push((hash, child));
                grown.extend_from_slice(&old[at..]);
                let mut out = Vec::with_capacity(chunks.len() + 1);
                out.extend_from_slice(&chunks[..c]);
                if grown.len() > CHUNK_MAX {
                    let half = grown.len() / 2;
                    out.push(Arc::from(&grown[..half]));
                    out.push(Arc::from(&grown[half..]));
                } else {
                    out.push(Arc::from(grown));
                }
                out.extend_from_slice(&chunks[c + 1..]);
                Children::chunked(out)
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
            Children::Chunked(chunks, _) => {
                let mut out: Vec<Arc<[ChildEntry]>> = Vec::with_capacity(chunks.len());
                for ch in chunks {
                    let touches = ch.first().is_some_and(|e| e.0 <= hash)
                        && ch.last().is_some_and(|e| e.0 >= hash)
                        && ch.iter().any(|(h, c)| *h == hash && std::ptr::eq(c.0, old));
                    if touches {
                        let v = change(ch);
                        if !v.is_empty() {
                            out.push(Arc::from(v));
                        }
                    } else {
                        out.push(Arc::clone(ch));
                    }
                }
                Children::chunked(out)
            }
        }
    }

    /// All entries, for teardown.
    pub(crate) fn into_entries(self) -> Vec<ChildEntry> {
        match self {
            Children::Flat(v) => v,
            Children::Chunked(c, _) => c.iter().flat_map(|ch| ch.iter().copied()).collect(),
        }
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
    use crate::tree::node::{Image, ParentPtr};

    fn leaf(id: u64) -> NodePtr {
        NodePtr::link(Node::new(
            id,
            false,
            Image {
                parent: ParentPtr(std::ptr::null()),
                key: Arc::from(&[1u32][..]),
                values: vec![None].into_boxed_slice(),
            },
            Children::default(),
            0,
        ))
    }

    #[test]
    fn wide_children_stay_sorted_and_findable() {
        let mut c = Children::default();
        let mut all = Vec::new();
        // 600 entries with colliding hashes every 7th, in scrambled order.
        for i in 0..600u64 {
            let h = (i * 7919) % 613 / 7 * 7;
            let n = leaf(i);
            c = c.with_added(h, n);
            all.push((h, n));
        }
        assert!(matches!(c, Children::Chunked(..)));
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
                c.with_changed(*h, node(n), None)
            } else {
                let f = leaf(10_000 + i as u64);
                fresh.push(f);
                c.with_changed(*h, node(n), Some(f))
            };
        }
        assert_eq!(c.iter().count(), 300);
        assert!(c.iter().all(|(_, n)| node(n).id >= 10_000));
        let hashes: Vec<u64> = c.iter().map(|e| e.0).collect();
        assert!(hashes.windows(2).all(|w| w[0] <= w[1]));
        for (i, (h, _)) in all.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
            assert!(c.with_hash(*h).any(|x| x.id == 10_000 + i as u64));
        }
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
    fn page_hash_is_exact_at_page_size_one() {
        assert_eq!(page_hash(&[7]), 7);
        assert_ne!(page_hash(&[1, 2]), page_hash(&[2, 1]));
    }
}
