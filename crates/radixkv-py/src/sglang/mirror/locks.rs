//! The locks SGLang takes, on the shape: a lock's count along its path, its
//! core pin (`Lease`) and the sizes change together, checked first and
//! applied after, so a refused lock changes nothing.

use super::{Shape, ROOT};
use radixkv::Lease;

/// Why a lock or unlock was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LockRefused {
    /// The node is not in the tree (evicted).
    Gone,
    /// An unlock of a node that holds no lock of its own (its count is
    /// only its descendants').
    NotLocked,
    /// The mirror is broken: the first inconsistency.
    Broken(String),
}

impl Shape {
    /// Whether `id` can take a lock now: `Gone` if it is not in the tree.
    /// Checked before the core pin is taken, so that a refused lock leaves
    /// no pin behind.
    pub(crate) fn lockable(&self, id: u64) -> Result<(), LockRefused> {
        self.usable().map_err(LockRefused::Broken)?;
        if id != ROOT && !self.nodes.contains_key(&id) {
            return Err(LockRefused::Gone);
        }
        Ok(())
    }

    /// Locks the path root → `id` with `lease` (the core pin behind the
    /// lock, kept until the matching [`unlock`](Self::unlock)): the change
    /// of the evictable size (≤ 0). The root takes no lock (its lease is
    /// empty and dropped).
    pub(crate) fn lock(&mut self, id: u64, lease: Lease) -> Result<i64, LockRefused> {
        self.lockable(id)?;
        if id == ROOT {
            return Ok(0);
        }
        let Some(path) = self.path(id) else {
            return Err(self.refuse(format!("lock of node {id}: its path to the root is broken")));
        };
        // Checked first, applied after: a refused lock changes nothing.
        let mut moved = 0usize;
        for &n in &path {
            let node = &self.nodes[&n];
            if node.lock_ref == u64::MAX {
                return Err(
                    self.refuse(format!("lock of node {id}: node {n} holds 2^64 - 1 locks"))
                );
            }
            if node.lock_ref == 0 {
                moved = match moved.checked_add(node.len) {
                    Some(m) => m,
                    None => {
                        return Err(self.refuse(format!(
                            "lock of node {id}: its path holds over 2^64 tokens"
                        )))
                    }
                };
            }
        }
        let (Some(evictable), Some(protected), Ok(delta)) = (
            self.evictable.checked_sub(moved),
            self.protected.checked_add(moved),
            i64::try_from(moved),
        ) else {
            return Err(self.refuse(format!(
                "lock of node {id}: {moved} tokens to protect, but evictable {} protected {}",
                self.evictable, self.protected
            )));
        };
        for n in &path {
            if let Some(node) = self.nodes.get_mut(n) {
                node.lock_ref += 1;
            }
        }
        (self.evictable, self.protected) = (evictable, protected);
        self.leases.entry(id).or_default().push(lease);
        Ok(-delta)
    }

    /// Releases one lock of `id` (root → `id`): the change of the evictable
    /// size (≥ 0) and the lock's lease, for the caller to drop (the core
    /// unpin) before it lets the mirror go.
    pub(crate) fn unlock(&mut self, id: u64) -> Result<(i64, Option<Lease>), LockRefused> {
        self.usable().map_err(LockRefused::Broken)?;
        if id == ROOT {
            return Ok((0, None));
        }
        if !self.nodes.contains_key(&id) {
            return Err(LockRefused::Gone);
        }
        if self.leases.get(&id).is_none_or(Vec::is_empty) {
            return Err(LockRefused::NotLocked);
        }
        let Some(path) = self.path(id) else {
            return Err(self.refuse(format!(
                "unlock of node {id}: its path to the root is broken"
            )));
        };
        let mut moved = 0usize;
        for &n in &path {
            let node = &self.nodes[&n];
            match node.lock_ref {
                0 => {
                    return Err(self.refuse(format!(
                        "unlock of node {id}: node {n} on its path holds no lock"
                    )))
                }
                1 => {
                    moved = match moved.checked_add(node.len) {
                        Some(m) => m,
                        None => {
                            return Err(self.refuse(format!(
                                "unlock of node {id}: its path holds over 2^64 tokens"
                            )))
                        }
                    };
                }
                _ => {}
            }
        }
        let (Some(evictable), Some(protected), Ok(delta)) = (
            self.evictable.checked_add(moved),
            self.protected.checked_sub(moved),
            i64::try_from(moved),
        ) else {
            return Err(self.refuse(format!(
                "unlock of node {id}: {moved} tokens to release, but evictable {} protected {}",
                self.evictable, self.protected
            )));
        };
        for n in &path {
            if let Some(node) = self.nodes.get_mut(n) {
                node.lock_ref -= 1;
            }
        }
        (self.evictable, self.protected) = (evictable, protected);
        let lease = self.leases.get_mut(&id).and_then(Vec::pop);
        if self.leases.get(&id).is_some_and(Vec::is_empty) {
            self.leases.remove(&id);
        }
        Ok((delta, lease))
    }

    /// Marks the mirror broken with `what` and returns the refusal.
    fn refuse(&mut self, what: String) -> LockRefused {
        self.corrupt(|| what);
        LockRefused::Broken(self.usable().err().unwrap_or_default())
    }

    /// Test hook: breaks the mirror with `what`.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn break_with(&mut self, what: String) {
        self.corrupt(|| what);
    }
}
