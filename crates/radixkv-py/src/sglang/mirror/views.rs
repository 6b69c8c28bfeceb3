//! What the shape answers by walking it: SGLang's dfs-weight order of a
//! waiting queue, the outline `pretty_print` shows, and the audit of the
//! shape against itself and the core.

use super::{Shape, ROOT};
use std::collections::HashMap;

impl Shape {
    /// SGLang's dfs-weight order of requests whose match ended at `ends`
    /// (node ids; `ROOT` for none): indices into `ends`. A node's weight is
    /// its requests and its subtree's; from the root, children are visited
    /// heaviest first (ties in the order they joined), and a node's own
    /// requests follow its subtrees. Requests at the root, and any whose
    /// node left the tree, come last in queue order.
    pub(crate) fn dfs_weight_order(&self, ends: &[u64]) -> Vec<usize> {
        let mut own: HashMap<u64, Vec<usize>> = HashMap::new();
        let mut tail = Vec::new();
        for (i, &id) in ends.iter().enumerate() {
            if id != ROOT && self.nodes.contains_key(&id) {
                own.entry(id).or_default().push(i);
            } else {
                tail.push(i);
            }
        }
        // Weights: each request counts on its node and every ancestor.
        let mut weight: HashMap<u64, usize> = HashMap::new();
        for (&id, reqs) in &own {
            let mut cur = id;
            while cur != ROOT {
                *weight.entry(cur).or_default() += reqs.len();
                cur = self.nodes.get(&cur).map_or(ROOT, |n| n.parent);
            }
        }
        let mut order = Vec::with_capacity(ends.len());
        // Post-order over weighted nodes only (a zero-weight subtree holds
        // no request): (node, children visited).
        let mut stack: Vec<(u64, bool)> = vec![(ROOT, false)];
        while let Some((id, visited)) = stack.pop() {
            if visited {
                if let Some(reqs) = own.get(&id) {
                    order.extend_from_slice(reqs);
                }
                continue;
            }
            stack.push((id, true));
            let Some(n) = self.nodes.get(&id) else {
                continue;
            };
            let mut kids: Vec<(usize, u64)> = n
                .children
                .values()
                .filter_map(|c| weight.get(c).map(|&w| (w, *c)))
                .collect();
            // Stable: equal weights keep the order they joined.
            kids.sort_by_key(|k| std::cmp::Reverse(k.0));
            for &(_, c) in kids.iter().rev() {
                stack.push((c, false));
            }
        }
        order.extend(tail);
        order
    }

    /// The tree depth-first, children in the order they joined: (depth,
    /// tokens, lock count) per node (SGLang's `pretty_print`).
    pub(crate) fn outline(&self) -> Vec<(usize, usize, u64)> {
        let mut out = Vec::new();
        let mut stack = vec![(ROOT, 0usize)];
        while let Some((id, depth)) = stack.pop() {
            let Some(n) = self.nodes.get(&id) else {
                continue;
            };
            if id != ROOT {
                out.push((depth, n.len, n.lock_ref));
            }
            for &c in n.children.values().rev() {
                stack.push((c, depth + 1));
            }
        }
        out
    }

    /// Checks the mirror against itself and against `resident` (the
    /// tokens the core holds): the first violation, if any.
    pub(crate) fn check(&self, resident: usize) -> Option<String> {
        if let Some(b) = &self.broken {
            return Some(b.clone());
        }
        let mut total = 0;
        let (mut evictable, mut protected) = (0, 0);
        for (&id, n) in &self.nodes {
            if id == ROOT {
                continue;
            }
            total += n.len;
            if n.lock_ref == 0 {
                evictable += n.len;
            } else {
                protected += n.len;
            }
            let Some(p) = self.nodes.get(&n.parent) else {
                return Some(format!("node {id}: parent {} is not in the tree", n.parent));
            };
            if p.children.get(&n.slot) != Some(&id) {
                return Some(format!("node {id}: not among its parent's children"));
            }
            let below: u64 = n
                .children
                .values()
                .filter_map(|c| self.nodes.get(c))
                .map(|c| c.lock_ref)
                .sum();
            if n.lock_ref < below {
                return Some(format!(
                    "node {id}: {} locks, its children {below}",
                    n.lock_ref
                ));
            }
            let own = self.leases.get(&id).map_or(0, Vec::len) as u64;
            if n.lock_ref - below != own {
                return Some(format!(
                    "node {id}: {} locks of its own, {own} pins behind them",
                    n.lock_ref - below
                ));
            }
        }
        if let Some(id) = self.leases.keys().find(|id| !self.nodes.contains_key(id)) {
            return Some(format!("pins held for node {id}, which is not in the tree"));
        }
        if (evictable, protected) != (self.evictable, self.protected) {
            return Some(format!(
                "sizes: evictable {} protected {} counted, {evictable} and {protected} in the tree",
                self.evictable, self.protected
            ));
        }
        if total != resident {
            return Some(format!(
                "the mirror holds {total} tokens, the cache {resident}"
            ));
        }
        None
    }
}
