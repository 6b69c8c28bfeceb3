//! A plain single-threaded radix cache with the same semantics as
//! [`RadixCache`](crate::RadixCache): the sequential model that property
//! tests and fuzzing compare the concurrent tree against, and the baseline
//! (behind a `Mutex` or `RwLock`) that benchmarks measure it against.
//!
//! It is written independently of the concurrent tree, for clarity rather
//! than speed: an arena of nodes, `BTreeMap` children, and eviction that
//! rescans for the smallest candidate each time. With a logical clock it
//! takes the same ticks (one counter per device) in the same order as
//! `RadixCache`, so eviction
//! orders and results agree exactly.
//!
//! ```
//! use radixkv::reference::SequentialCache;
//! use radixkv::EvictionPolicy;
//! let mut m = SequentialCache::new(1, 1, EvictionPolicy::Lru);
//! assert_eq!(m.insert(None, &[1, 2, 3], &[7, 8, 9], 0, 0), Ok(0));
//! let r = m.match_prefix(None, &[1, 2, 5], 0);
//! assert_eq!((r.len, r.values), (2, vec![7, 8]));
//! ```

use crate::EvictionPolicy;
use std::collections::BTreeMap;

#[derive(Debug, Clone)]
struct SeqNode {
    id: u64,
    is_root: bool,
    linked: bool,
    parent: Option<usize>,
    key: Vec<u32>,
    values: Vec<Option<Vec<u32>>>,
    children: BTreeMap<Vec<u32>, usize>,
    last_access: Vec<u64>,
    created: Vec<u64>,
    hits: Vec<u64>,
    hits_base: Vec<u64>,
    gens: Vec<u64>,
    pins: Vec<u64>,
    priority: i64,
    /// The deepest end depth its branch has reached (tlru's `L`).
    deepest: u64,
}

/// A handle to the end node of a model match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqHandle {
    node: Option<usize>,
    device: usize,
    gen: u64,
}

/// A model match result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqMatch {
    /// Tokens resident on the asked device.
    pub len: usize,
    /// Their values.
    pub values: Vec<u32>,
    /// Longest prefix resident on any device.
    pub any_len: usize,
    /// The device holding it (the asked one on a tie, else the lowest).
    pub any_device: Option<usize>,
    /// The end node.
    pub handle: SeqHandle,
}

/// Why a model operation failed (mirrors `CacheError`'s cases).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqError {
    /// Insert key not page-aligned.
    Unaligned,
    /// Insert values length differs from the key's.
    LengthMismatch,
    /// The handle's node left the tree on its device.
    Stale,
}

/// The sequential model.
#[derive(Debug, Clone)]
pub struct SequentialCache {
    ps: usize,
    devices: usize,
    policy: EvictionPolicy,
    nodes: Vec<SeqNode>,
    roots: Vec<(Option<String>, usize)>,
    clock: Vec<u64>,
    next_id: u64,
    /// Tlru's (threshold, next prompt estimate), in tokens.
    tlru: (u64, u64),
}

impl SequentialCache {
    /// An empty model. `page_size` and `devices` must be at least 1.
    pub fn new(page_size: usize, devices: usize, policy: EvictionPolicy) -> Self {
        SequentialCache {
            ps: page_size.max(1),
            devices: devices.max(1),
            policy,
            nodes: Vec::new(),
            roots: Vec::new(),
            clock: vec![1; devices.max(1)],
            next_id: 1,
            tlru: (0, 0),
        }
    }

    /// Tlru's budget `T` and next prompt estimate `Q`, in tokens (as
    /// `RadixCacheBuilder::tlru_threshold` and
    /// `RadixCacheBuilder::tlru_next_prompt_estimate`).
    pub fn with_tlru(mut self, threshold: u64, next_prompt_estimate: u64) -> Self {
        self.tlru = (threshold, next_prompt_estimate);
        self
    }

    /// Tokens on node `i`'s path before its key.
    fn start(&self, i: usize) -> u64 {
        let mut n = 0;
        let mut cur = self.nodes[i].parent;
        while let Some(p) = cur {
            n += self.nodes[p].key.len() as u64;
            cur = self.nodes[p].parent;
        }
        n
    }

    fn tick(&mut self, d: usize) -> u64 {
        let t = self.clock[d];
        self.clock[d] += 1;
        t
    }

    fn new_node(
        &mut self,
        is_root: bool,
        parent: Option<usize>,
        key: Vec<u32>,
        priority: i64,
    ) -> usize {
        let id = self.next_id;
        self.next_id += 1;
        let n = self.devices;
        self.nodes.push(SeqNode {
            id,
            is_root,
            linked: true,
            parent,
            key,
            values: vec![None; n],
            children: BTreeMap::new(),
            last_access: vec![0; n],
            created: vec![0; n],
            hits: vec![0; n],
            hits_base: vec![0; n],
            gens: vec![0; n],
            pins: vec![0; n],
            priority,
            deepest: 0,
        });
        self.nodes.len() - 1
    }

    fn resident(&self, i: usize, d: usize) -> bool {
        self.nodes[i].is_root || self.nodes[i].values[d].is_some()
    }

    fn root(&self, ns: Option<&str>) -> Option<usize> {
        self.roots
            .iter()
            .find(|(n, _)| n.as_deref() == ns)
            .map(|(_, r)| *r)
    }

    fn common(&self, a: &[u32], b: &[u32]) -> usize {
        let mut n = 0;
        while n < a.len() && n < b.len() && a[n] == b[n] {
            n += 1;
        }
        n / self.ps * self.ps
    }

    /// Splits `child` of `parent` after `k` tokens; the new upper node gets
    /// fresh stamps on `d` (a match's or an insert's split), or keeps the
    /// child's everywhere (`None`: a removal's).
    fn split(&mut self, parent: usize, child: usize, k: usize, d: Option<usize>) -> usize {
        let c = self.nodes[child].clone();
        let p = self.new_node(false, Some(parent), c.key[..k].to_vec(), c.priority);
        {
            let pn = &mut self.nodes[p];
            pn.values = c
                .values
                .iter()
                .map(|v| v.as_ref().map(|v| v[..k].to_vec()))
                .collect();
            pn.last_access = c.last_access.clone();
            pn.created = c.created.clone();
            pn.hits = c.hits.clone();
            pn.hits_base = c.hits_base.clone();
            pn.gens = c.values.iter().map(|v| u64::from(v.is_some())).collect();
            pn.deepest = c.deepest;
            pn.children.insert(c.key[k..k + self.ps].to_vec(), child);
        }
        if let Some(d) = d {
            let t1 = self.tick(d);
            let t2 = self.tick(d);
            self.nodes[p].last_access[d] = t1;
            self.nodes[p].created[d] = t2;
        }
        let cn = &mut self.nodes[child];
        cn.key = c.key[k..].to_vec();
        cn.values = c
            .values
            .iter()
            .map(|v| v.as_ref().map(|v| v[k..].to_vec()))
            .collect();
        cn.parent = Some(p);
        self.nodes[parent]
            .children
            .insert(c.key[..self.ps].to_vec(), p);
        p
    }

    /// Resident prefix length on every device; changes nothing.
    pub fn peek(&self, ns: Option<&str>, tokens: &[u32]) -> Vec<usize> {
        let tokens = &tokens[..tokens.len() / self.ps * self.ps];
        let mut out = vec![0; self.devices];
        let Some(mut cur) = self.root(ns) else {
            return out;
        };
        let mut pos = 0;
        while pos < tokens.len() {
            let Some(&c) = self.nodes[cur].children.get(&tokens[pos..pos + self.ps]) else {
                break;
            };
            let k = self.common(&self.nodes[c].key, &tokens[pos..]);
            for (e, o) in out.iter_mut().enumerate() {
                if *o == pos && self.resident(c, e) {
                    *o = pos + k;
                }
            }
            if k < self.nodes[c].key.len() {
                break;
            }
            pos += k;
            cur = c;
        }
        out
    }

    /// Match on device `d` (splits, stamps, counts hits), with the values.
    pub fn match_prefix(&mut self, ns: Option<&str>, tokens: &[u32], d: usize) -> SeqMatch {
        let mut m = self.match_walk(ns, tokens, d);
        if let Some(mut n) = m.handle.node {
            let mut segs = Vec::new();
            while !self.nodes[n].is_root {
                segs.push(self.nodes[n].values[d].clone().unwrap_or_default());
                n = self.nodes[n].parent.unwrap_or(n);
            }
            m.values = segs.into_iter().rev().flatten().collect();
        }
        m
    }

    /// Like [`match_prefix`](Self::match_prefix) without collecting the
    /// values (the same work as `RadixCache::match_prefix`).
    pub fn match_len(&mut self, ns: Option<&str>, tokens: &[u32], d: usize) -> usize {
        self.match_walk(ns, tokens, d).len
    }

    fn match_walk(&mut self, ns: Option<&str>, tokens: &[u32], d: usize) -> SeqMatch {
        let tokens = &tokens[..tokens.len() / self.ps * self.ps];
        let stamp = self.tick(d);
        let mut m = SeqMatch {
            len: 0,
            values: Vec::new(),
            any_len: 0,
            any_device: None,
            handle: SeqHandle {
                node: None,
                device: d,
                gen: 0,
            },
        };
        let Some(mut cur) = self.root(ns) else {
            return m;
        };
        let mut pos = 0;
        let mut on_d = true;
        while pos < tokens.len() {
            let Some(&c0) = self.nodes[cur].children.get(&tokens[pos..pos + self.ps]) else {
                break;
            };
            let mut c = c0;
            let k = self.common(&self.nodes[c].key, &tokens[pos..]);
            let full = k == self.nodes[c].key.len();
            if on_d && self.resident(c, d) {
                let la = &mut self.nodes[c].last_access[d];
                *la = (*la).max(stamp);
                if !full {
                    c = self.split(cur, c, k, Some(d));
                }
                self.nodes[c].hits[d] += 1;
                m.len = pos + k;
                m.handle.node = Some(c);
                m.handle.gen = self.nodes[c].gens[d];
            } else {
                on_d = false;
            }
            let best = if self.resident(c, d) {
                Some(d)
            } else {
                (0..self.devices).find(|&e| self.resident(c, e))
            };
            match best {
                Some(e) => {
                    m.any_len = pos + k;
                    m.any_device = Some(e);
                }
                None => break,
            }
            if !full {
                break;
            }
            pos += k;
            cur = c;
        }
        m
    }

    /// Insert on device `d`; returns the prefix length already cached there.
    pub fn insert(
        &mut self,
        ns: Option<&str>,
        tokens: &[u32],
        values: &[u32],
        d: usize,
        priority: i64,
    ) -> Result<usize, SeqError> {
        if !tokens.len().is_multiple_of(self.ps) {
            return Err(SeqError::Unaligned);
        }
        if tokens.len() != values.len() {
            return Err(SeqError::LengthMismatch);
        }
        if tokens.is_empty() {
            return Ok(0);
        }
        let stamp = self.tick(d);
        let root = match self.root(ns) {
            Some(r) => r,
            None => {
                let r = self.new_node(true, None, Vec::new(), 0);
                self.roots.push((ns.map(str::to_string), r));
                r
            }
        };
        self.nodes[root].priority = self.nodes[root].priority.max(priority);
        let mut cur = root;
        let mut pos = 0;
        let mut first_adopted = None;
        while pos < tokens.len() {
            let page = tokens[pos..pos + self.ps].to_vec();
            let Some(&c) = self.nodes[cur].children.get(&page) else {
                let leaf = self.new_node(false, Some(cur), tokens[pos..].to_vec(), priority);
                let t1 = self.tick(d);
                let t2 = self.tick(d);
                let ln = &mut self.nodes[leaf];
                ln.values[d] = Some(values[pos..].to_vec());
                ln.gens[d] = 1;
                ln.last_access[d] = t1;
                ln.created[d] = t2;
                self.nodes[cur].children.insert(page, leaf);
                // Its end depth raises its own and every ancestor's branch.
                let depth = tokens.len() as u64;
                let mut up = Some(leaf);
                while let Some(u) = up {
                    self.nodes[u].deepest = self.nodes[u].deepest.max(depth);
                    up = self.nodes[u].parent;
                }
                first_adopted.get_or_insert(pos);
                break;
            };
            let la = &mut self.nodes[c].last_access[d];
            *la = (*la).max(stamp);
            let k = self.common(&self.nodes[c].key, &tokens[pos..]);
            let node = if k < self.nodes[c].key.len() {
                self.split(cur, c, k, Some(d))
            } else {
                c
            };
            self.nodes[node].priority = self.nodes[node].priority.max(priority);
            if !self.resident(node, d) {
                let t1 = self.tick(d);
                let t2 = self.tick(d);
                let n = &mut self.nodes[node];
                n.values[d] = Some(values[pos..pos + k].to_vec());
                n.gens[d] += 1;
                n.last_access[d] = t1;
                n.created[d] = t2;
                first_adopted.get_or_insert(pos);
            }
            pos += k;
            cur = node;
        }
        Ok(first_adopted.unwrap_or(tokens.len()))
    }

    fn is_candidate(&self, i: usize, d: usize) -> bool {
        let n = &self.nodes[i];
        n.linked
            && !n.is_root
            && n.values[d].is_some()
            && n.pins[d] == 0
            && n.children
                .values()
                .all(|&c| self.nodes[c].values[d].is_none())
    }

    fn key(&self, i: usize, d: usize) -> (i128, i128, i128, u64) {
        let n = &self.nodes[i];
        let la = n.last_access[d] as i128;
        let cr = n.created[d] as i128;
        let (a, b) = match self.policy {
            EvictionPolicy::Lru => (la, 0),
            EvictionPolicy::Lfu => (n.hits[d] as i128, la),
            EvictionPolicy::Fifo => (cr, 0),
            EvictionPolicy::Mru => (-la, 0),
            EvictionPolicy::Filo => (-cr, 0),
            EvictionPolicy::Priority => (n.priority as i128, la),
            EvictionPolicy::Slru => (i128::from(n.hits[d] > n.hits_base[d]), la),
            // Sieve's hand is the evictor's state, not a leaf's: the model
            // ranks sieve in creation order (what the hand does when no leaf
            // was hit); `EvictionPolicy::is_stateless` says so.
            EvictionPolicy::Sieve => (cr, 0),
            EvictionPolicy::Tlru => {
                let (threshold, estimate) = self.tlru;
                let needed = (n.deepest + estimate).saturating_sub(threshold);
                (i128::from(self.start(i) < needed), la)
            }
        };
        (a, b, cr, n.id)
    }

    /// Evicts whole unpinned leaves of `d`, smallest policy key first, until
    /// at least `tokens` are freed. Returns (tokens freed, values in order).
    pub fn evict(&mut self, d: usize, tokens: usize) -> (usize, Vec<u32>) {
        let mut freed = 0;
        let mut out = Vec::new();
        while freed < tokens {
            let Some(i) = (0..self.nodes.len())
                .filter(|&i| self.is_candidate(i, d))
                .min_by_key(|&i| self.key(i, d))
            else {
                break;
            };
            let vals = self.take_leaf(i, d);
            freed += vals.len();
            out.extend(vals);
            // A parent left with no resident child here is a leaf again: its
            // hits so far were passes through (slru's probation mark).
            if let Some(p) = self.nodes[i].parent {
                self.mark_leaf(p, d);
            }
        }
        (freed, out)
    }

    /// Takes leaf `i`'s values on `d`; a node then resident nowhere, with
    /// no children, leaves the tree.
    fn take_leaf(&mut self, i: usize, d: usize) -> Vec<u32> {
        let vals = self.nodes[i].values[d].take().unwrap_or_default();
        let n = &self.nodes[i];
        if n.values.iter().all(Option::is_none) && n.children.is_empty() {
            let page = n.key[..self.ps].to_vec();
            if let Some(p) = n.parent {
                self.nodes[p].children.remove(&page);
            }
            self.nodes[i].linked = false;
        }
        vals
    }

    /// Node `p`, if a leaf on `d` now, starts counting hits afresh there
    /// (its hits so far were passes through: slru's probation mark).
    fn mark_leaf(&mut self, p: usize, d: usize) {
        let pn = &self.nodes[p];
        let leaf = !pn.is_root
            && pn.values[d].is_some()
            && pn
                .children
                .values()
                .all(|&c| self.nodes[c].values[d].is_none());
        if leaf {
            self.nodes[p].hits_base[d] = self.nodes[p].hits[d];
        }
    }

    /// `RadixCache::evict_from`: takes `d`'s residency from the last page
    /// of `tokens` (whole pages) and every page below it on `d`, splitting
    /// the node that holds that page and begins before it (when the tree
    /// holds all of `tokens`); pinned nodes and their ancestors stay.
    /// Returns (tokens freed, values, in an order of the model's own).
    pub fn evict_from(&mut self, ns: Option<&str>, tokens: &[u32], d: usize) -> (usize, Vec<u32>) {
        let ps = self.ps;
        if tokens.is_empty() || !tokens.len().is_multiple_of(ps) {
            return (0, Vec::new());
        }
        let (start, end) = (tokens.len() - ps, tokens.len());
        let Some(mut cur) = self.root(ns) else {
            return (0, Vec::new());
        };
        let mut pos = 0;
        let top = loop {
            let Some(&c) = self.nodes[cur].children.get(&tokens[pos..pos + ps]) else {
                return (0, Vec::new());
            };
            let len = self.nodes[c].key.len();
            let k = self.common(&self.nodes[c].key, &tokens[pos..end]);
            if pos == start {
                break c;
            }
            if pos + len <= start {
                if k < len {
                    return (0, Vec::new());
                }
                pos += len;
                cur = c;
                continue;
            }
            if pos + k < end {
                return (0, Vec::new());
            }
            self.split(cur, c, start - pos, None);
            break c;
        };
        if self.nodes[top].values[d].is_none() {
            return (0, Vec::new());
        }
        let mut order = Vec::new();
        let mut stack = vec![top];
        while let Some(i) = stack.pop() {
            order.push(i);
            for &c in self.nodes[i].children.values() {
                if self.nodes[c].values[d].is_some() {
                    stack.push(c);
                }
            }
        }
        let (mut freed, mut out) = (0, Vec::new());
        let mut parents = Vec::new();
        for i in order.into_iter().rev() {
            if !self.is_candidate(i, d) {
                continue;
            }
            parents.extend(self.nodes[i].parent);
            let vals = self.take_leaf(i, d);
            freed += vals.len();
            out.extend(vals);
        }
        // A node above an evicted one that is a leaf on `d` now, as after an
        // eviction.
        for p in parents {
            self.mark_leaf(p, d);
        }
        (freed, out)
    }

    /// Pins the end node of a model match.
    pub fn pin(&mut self, h: &SeqHandle) -> Result<(), SeqError> {
        let Some(i) = h.node else {
            return Ok(());
        };
        let n = &mut self.nodes[i];
        if !n.linked || n.values[h.device].is_none() || n.gens[h.device] != h.gen {
            return Err(SeqError::Stale);
        }
        n.pins[h.device] += 1;
        Ok(())
    }

    /// Releases a pin taken by [`pin`](Self::pin) with the same handle.
    pub fn unpin(&mut self, h: &SeqHandle) {
        if let Some(i) = h.node {
            let p = &mut self.nodes[i].pins[h.device];
            *p = p.saturating_sub(1);
        }
    }

    /// (evictable, protected, total, nodes) on device `d`.
    pub fn sizes(&self, d: usize) -> (usize, usize, usize, usize) {
        let (mut total, mut protected, mut nodes) = (0, 0, 0);
        for (i, n) in self.nodes.iter().enumerate() {
            if !n.linked || n.is_root || n.values[d].is_none() {
                continue;
            }
            total += n.key.len();
            nodes += 1;
            if self.pinned_in_subtree(i, d) {
                protected += n.key.len();
            }
        }
        (total - protected, protected, total, nodes)
    }

    fn pinned_in_subtree(&self, i: usize, d: usize) -> bool {
        let mut stack = vec![i];
        while let Some(j) = stack.pop() {
            if self.nodes[j].pins[d] > 0 {
                return true;
            }
            stack.extend(self.nodes[j].children.values().copied());
        }
        false
    }

    /// Linked non-root nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.iter().filter(|n| n.linked && !n.is_root).count()
    }
}
