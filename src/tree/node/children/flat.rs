//! A node's children up to `FLAT_MAX`: one array of (page hash, child)
//! sorted by hash, replaced copy-on-write under the node's lock (a reader
//! holds whichever array it loaded, whole). This file holds the search
//! (from where a uniformly spread hash would sit) and the successors an
//! add, a replacement or a removal publishes.

use crate::tree::node::ptr::Link;

/// One entry of a flat array: the hash of the child's first page, and the
/// child.
pub(crate) type ChildEntry<N> = (u64, Link<N>);

/// Where `hash` would sit among `n` sorted hashes spread evenly over
/// `lo..=hi`.
pub(super) fn guess(hash: u64, (lo, hi): (u64, u64), n: usize) -> usize {
    if n == 0 || hash <= lo {
        return 0;
    }
    let span = u128::from(hi - lo) + 1;
    (u128::from(hash - lo) * n as u128 / span) as usize
}

/// `s.partition_point(p)` (`p` true on a prefix of `s`), searched outward
/// from `guess`: a few probes when the guess is close, O(log n) anyway.
pub(super) fn partition_near<T>(s: &[T], guess: usize, p: impl Fn(&T) -> bool) -> usize {
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

/// The entries filed under `hash` (usually one).
pub(super) fn with_hash<N>(v: &[ChildEntry<N>], hash: u64) -> &[ChildEntry<N>] {
    let lo = partition_near(v, guess(hash, (0, u64::MAX), v.len()), |(h, _)| *h < hash);
    let n = v[lo..].iter().take_while(|(h, _)| *h == hash).count();
    &v[lo..lo + n]
}

/// `v` with `child` filed under `hash`.
pub(super) fn added<N>(v: &[ChildEntry<N>], hash: u64, child: Link<N>) -> Vec<ChildEntry<N>> {
    let mut entries = Vec::with_capacity(v.len() + 1);
    let at = v.partition_point(|(h, _)| *h <= hash);
    entries.extend_from_slice(&v[..at]);
    entries.push((hash, child));
    entries.extend_from_slice(&v[at..]);
    entries
}

/// `v` with the entry of the child at `old` (filed under `hash`) linking
/// `new` instead.
pub(super) fn replaced<N>(
    v: &[ChildEntry<N>],
    hash: u64,
    old: usize,
    new: Link<N>,
) -> Vec<ChildEntry<N>> {
    v.iter()
        .map(|&(h, c)| {
            if h == hash && c.addr() == old {
                (h, new)
            } else {
                (h, c)
            }
        })
        .collect()
}

/// `v` without the entry of the child at `old` (filed under `hash`), or
/// `None` if it is not there.
pub(super) fn removed<N>(v: &[ChildEntry<N>], hash: u64, old: usize) -> Option<Vec<ChildEntry<N>>> {
    let at = v.iter().position(|&(h, c)| h == hash && c.addr() == old)?;
    let mut rest = v.to_vec();
    rest.remove(at);
    Some(rest)
}
