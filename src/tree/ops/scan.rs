//! Whole-tree scans, for what the hot paths do not keep counts of: every
//! node in pre-order, the unpinned leaves of a tier (eviction by a scan,
//! and re-ranking after a policy switch), the values resident on a tier
//! (the audit), and a tier's sizes. Exact in quiescent state; during
//! changes, a snapshot that may mix before and after.

use crate::tree::node::Node;
use crate::tree::ops::evict::is_candidate;
use crate::tree::state::Tree;
use crossbeam_epoch::Guard;

/// Per-tier figures from a scan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Scan {
    /// Tokens resident on the tier.
    pub(crate) total: usize,
    /// Tokens on a pinned node's path.
    pub(crate) protected: usize,
    /// Nodes resident on the tier.
    pub(crate) nodes: usize,
    /// Pins on the tier.
    pub(crate) pins: u64,
}

impl Tree {
    /// Every non-root node in pre-order, with the index of its parent in the
    /// list (`None` for children of a root).
    pub(crate) fn nodes<'g>(&self, guard: &'g Guard) -> Vec<(&'g Node, Option<usize>)> {
        let mut out = Vec::new();
        let mut stack: Vec<(&'g Node, Option<usize>)> = Vec::new();
        for (_, root) in self.roots.roots(guard) {
            for c in root.children_ref(guard).nodes().rev() {
                stack.push((c, None));
            }
        }
        while let Some((n, p)) = stack.pop() {
            let i = out.len();
            out.push((n, p));
            for c in n.children_ref(guard).nodes().rev() {
                stack.push((c, Some(i)));
            }
        }
        out
    }

    /// Unpinned leaves on `t` (eviction candidates), in one pass that
    /// does not descend below nodes not resident on `t` (I1: nothing below
    /// them is resident there either).
    pub(crate) fn leaves<'g>(&self, t: usize, guard: &'g Guard) -> Vec<&'g Node> {
        let mut out = Vec::new();
        let mut stack: Vec<&'g Node> = self
            .roots
            .roots(guard)
            .into_iter()
            .map(|(_, r)| r)
            .collect();
        while let Some(n) = stack.pop() {
            if is_candidate(n, t) {
                out.push(n);
                continue;
            }
            for c in n.children_ref(guard).nodes() {
                if c.resident(t) {
                    stack.push(c);
                }
            }
        }
        out
    }

    /// Every value resident on `t`, node by node (in whole pages).
    pub(crate) fn values_on(&self, t: usize, guard: &Guard) -> Vec<u32> {
        let mut out = Vec::new();
        for (n, _) in self.nodes(guard) {
            if let Some(v) = n.image_ref(guard).values.get(t) {
                v.append_to(&mut out, self.page_size());
            }
        }
        out
    }

    /// Sizes on `t` by a scan (exact in quiescent state).
    pub(crate) fn scan(&self, t: usize, guard: &Guard) -> Scan {
        let nodes = self.nodes(guard);
        let mut pinned_below = vec![false; nodes.len()];
        let mut s = Scan::default();
        for i in (0..nodes.len()).rev() {
            let (n, p) = nodes[i];
            let st = n.residency_on(t);
            if !st.resident() {
                continue;
            }
            let len = n.image_ref(guard).key.len();
            s.total += len;
            s.nodes += 1;
            s.pins += st.pins();
            if st.pins() > 0 || pinned_below[i] {
                s.protected += len;
                if let Some(p) = p {
                    pinned_below[p] = true;
                }
            }
        }
        s
    }
}
