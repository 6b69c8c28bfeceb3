//! The in-batch prefix scratch tree: the token prefixes of the requests a
//! scheduler has already picked in this round, so it can tell which
//! waiting requests share a long prefix with them (SGLang's simulated
//! `waiting_queue_radix_tree`). Sequential, rebuilt on every call, and
//! deliberately small: a compressed radix tree over token ids, one root per
//! namespace, no values, no eviction.
//!
//! ```
//! use radixkv_engine::sched::scratch::PrefixSet;
//! let mut s = PrefixSet::default();
//! s.insert(None, &[1, 2, 3, 4]);
//! assert_eq!(s.match_len(None, &[1, 2, 9]), 2);
//! assert_eq!(s.match_len(Some("tenant"), &[1, 2, 9]), 0);
//! s.insert(None, &[1, 2, 7]);
//! assert_eq!(s.match_len(None, &[1, 2, 7, 7]), 3);
//! ```

use std::collections::HashMap;

/// One edge of the tree: the tokens it spells and the node it leads to.
#[derive(Debug, Default)]
struct Node {
    /// The tokens on the edge into this node (empty at a root).
    label: Vec<u32>,
    /// Children by their label's first token.
    children: HashMap<u32, usize>,
}

/// A set of token sequences answering "longest common prefix with any of
/// them" per namespace.
#[derive(Debug, Default)]
pub struct PrefixSet {
    nodes: Vec<Node>,
    roots: HashMap<Option<String>, usize>,
}

impl PrefixSet {
    /// The longest prefix of `tokens` that some inserted sequence of the
    /// same namespace starts with.
    pub fn match_len(&self, namespace: Option<&str>, tokens: &[u32]) -> usize {
        let Some(&root) = self.roots.get(&namespace.map(str::to_owned)) else {
            return 0;
        };
        let (mut at, mut matched) = (root, 0);
        loop {
            let Some(&child) = tokens
                .get(matched)
                .and_then(|t| self.nodes[at].children.get(t))
            else {
                return matched;
            };
            let label = &self.nodes[child].label;
            let common = common_prefix(label, &tokens[matched..]);
            matched += common;
            if common < label.len() {
                return matched;
            }
            at = child;
        }
    }

    /// Adds `tokens` to the namespace's sequences.
    pub fn insert(&mut self, namespace: Option<&str>, tokens: &[u32]) {
        let next = self.nodes.len();
        let root = *self
            .roots
            .entry(namespace.map(str::to_owned))
            .or_insert(next);
        if root == next {
            self.nodes.push(Node::default());
        }
        let (mut at, mut done) = (root, 0);
        while done < tokens.len() {
            let first = tokens[done];
            let Some(&child) = self.nodes[at].children.get(&first) else {
                let leaf = self.push(tokens[done..].to_vec());
                self.nodes[at].children.insert(first, leaf);
                return;
            };
            let common = common_prefix(&self.nodes[child].label, &tokens[done..]);
            if common < self.nodes[child].label.len() {
                // Split the edge: a new node holds the common part.
                let rest = self.nodes[child].label.split_off(common);
                let head = std::mem::replace(&mut self.nodes[child].label, rest);
                let mid = self.push(head);
                let rest_first = self.nodes[child].label[0];
                self.nodes[mid].children.insert(rest_first, child);
                self.nodes[at].children.insert(first, mid);
                at = mid;
            } else {
                at = child;
            }
            done += common;
        }
    }

    fn push(&mut self, label: Vec<u32>) -> usize {
        self.nodes.push(Node {
            label,
            children: HashMap::new(),
        });
        self.nodes.len() - 1
    }
}

/// Length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the plain definition: the longest common prefix with any
    /// inserted sequence.
    #[test]
    fn matches_the_longest_common_prefix_of_any_sequence() {
        let mut rng = crate::rng::SplitMix64::new(9);
        for _ in 0..200 {
            let mut s = PrefixSet::default();
            let mut all: Vec<Vec<u32>> = Vec::new();
            for _ in 0..8 {
                let n = rng.below(12);
                let seq: Vec<u32> = (0..n).map(|_| rng.below(3) as u32).collect();
                let probe: Vec<u32> = (0..rng.below(12)).map(|_| rng.below(3) as u32).collect();
                let want = all
                    .iter()
                    .map(|q| common_prefix(q, &probe))
                    .max()
                    .unwrap_or(0);
                assert_eq!(s.match_len(None, &probe), want, "{all:?} {probe:?}");
                s.insert(None, &seq);
                all.push(seq);
            }
            assert_eq!(s.match_len(Some("x"), &[0, 1, 2]), 0);
        }
    }
}
