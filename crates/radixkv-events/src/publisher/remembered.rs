//! `Remembered`: what one device's socket task remembers of the nodes it
//! has published, per sink and tier, the block ids of every resident node.

/// What one device's socket task remembers: per sink and tier, the block
/// ids of every node it has published as resident and not yet as removed.
/// A store is chained from its parent's last id and a removal names the
/// node's ids, so neither needs the node's path, and the cache's thread
/// does no lookup at all: the events reach the task in the cache's order
/// (a parent's store before its children's, a split between a node's
/// store and its removal; see `radixkv::events`), so the parent and the
/// node are always here. Bounded by what the tier holds: a removal takes
/// the node's entry, and a sink's cache going away forgets its nodes.
#[derive(Debug, Default)]
pub(super) struct Remembered {
    /// (sink tag, its nodes): one sink per cache, a few at most.
    pub(super) sinks: Vec<(u32, NodeIdMap)>,
}

/// (host tier?, node id) → the block ids of the node's pages.
type NodeIdMap = std::collections::HashMap<(bool, u64), Box<[u64]>, foldhash::fast::RandomState>;

impl Remembered {
    pub(super) fn of(&mut self, tag: u32) -> &mut NodeIdMap {
        let i = match self.sinks.iter().position(|(t, _)| *t == tag) {
            Some(i) => i,
            None => {
                self.sinks.push((tag, NodeIdMap::default()));
                self.sinks.len() - 1
            }
        };
        &mut self.sinks[i].1
    }

    pub(super) fn forget(&mut self, tag: u32) {
        self.sinks.retain(|(t, _)| *t != tag);
    }

    /// What is remembered of `tag`'s nodes, forgotten here.
    pub(super) fn take(&mut self, tag: u32) -> NodeIdMap {
        match self.sinks.iter().position(|(t, _)| *t == tag) {
            Some(i) => self.sinks.swap_remove(i).1,
            None => NodeIdMap::default(),
        }
    }

    pub(super) fn nodes(&self) -> usize {
        self.sinks.iter().map(|(_, m)| m.len()).sum()
    }
}
