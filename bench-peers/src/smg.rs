//! SMG's chain-native index (`smg-radix-tree` 0.1.0, imported as
//! `radix_tree`), driven through its public API with the blocks CRTC gets:
//! each block's content hash is Dynamo's local hash of its tokens, its
//! key (the removal key) Dynamo's sequence hash. One holder per device.
//!
//! The tree is single-writer (`&mut self` stores and removals, `&self`
//! queries with a caller-owned scratch). One thread drives it directly;
//! two threads go through a `std::sync::RwLock`, as SMG's own index
//! service (`smg-radix-index`'s engine) holds each keyspace's tree:
//! queries on the read side, stores and removals on the write side.

use crate::dynamo;
use crate::workload::{contents, Request};
use radix_tree::{Config, HolderId, Overlap, OverlapScratch, RadixTree};
use std::cell::RefCell;
use std::sync::RwLock;

/// A tree with one holder per device.
pub(crate) struct Smg {
    pub tree: RadixTree,
    holders: Vec<HolderId>,
}

thread_local! {
    /// Each querying thread's scratch and answer rows, warm after the
    /// first query (SMG's service keeps them per caller the same way).
    static SCRATCH: RefCell<(OverlapScratch, Vec<Overlap>)> = RefCell::default();
}

impl Smg {
    pub fn new(devices: usize) -> Smg {
        let mut tree = RadixTree::new(Config::default());
        let holders = (0..devices)
            .map(|d| tree.create_holder(&format!("device-{d}")))
            .collect();
        Smg { tree, holders }
    }

    /// Stores `r`'s full key on its device, from the root (as the other
    /// indexes get it). `pairs` is a reused buffer.
    pub fn store(&mut self, r: &Request, pairs: &mut Vec<(u64, u64)>) {
        pairs.clear();
        pairs.extend(r.seq.iter().copied().zip(r.content.iter().copied()));
        self.tree
            .store(self.holders[r.device], None, pairs)
            .expect("smg store");
    }

    /// Removes the blocks with sequence hashes `keys` from `device`.
    pub fn remove(&mut self, device: usize, keys: &[u64]) {
        self.tree.remove(self.holders[device], keys);
    }

    /// Blocks of `contents`' longest prefix each device holds.
    pub fn per_device(&self, contents: &[u64]) -> Vec<usize> {
        SCRATCH.with(|s| {
            let (scratch, out) = &mut *s.borrow_mut();
            self.tree.overlap(contents, scratch, out);
            let mut per = vec![0; self.holders.len()];
            for row in out.iter() {
                if let Some(d) = self.holders.iter().position(|&h| h == row.holder) {
                    per[d] = row.depth as usize;
                }
            }
            per
        })
    }

    /// The query as a router runs it: the answer rows only, in the
    /// thread's scratch (no per-device vector).
    pub fn query(&self, contents: &[u64]) -> usize {
        SCRATCH.with(|s| {
            let (scratch, out) = &mut *s.borrow_mut();
            self.tree.overlap(contents, scratch, out);
            out.len()
        })
    }

    /// [`Smg::query`] from tokens: Dynamo's local hashes computed inside.
    pub fn query_tokens(&self, tokens: &[u32], page: u32) -> usize {
        let hs = contents(&dynamo::local_hashes(tokens, page));
        self.query(&hs)
    }

    /// The structure's own accounting of its size (`Stats::bytes_estimate`).
    pub fn bytes_estimate(&self) -> u64 {
        self.tree.stats().bytes_estimate
    }
}

/// Builds a tree holding `reqs`.
pub(crate) fn built(devices: usize, reqs: &[Request]) -> Smg {
    let mut s = Smg::new(devices);
    let mut pairs = Vec::new();
    for r in reqs {
        s.store(r, &mut pairs);
    }
    s
}

/// The lock the two-thread phases go through.
pub(crate) type Shared = RwLock<Smg>;
