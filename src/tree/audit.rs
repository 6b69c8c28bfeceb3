//! The audit of the tree: [`Tree::check`] walks every node in quiescent
//! state and verifies the invariants I1 (prefix-closed residency), I4
//! (shape: page-aligned keys, children filed under their first page,
//! values matching keys, resident-children counts), I5 (every node
//! reachable once, one root per namespace), I8 (while depths are tracked
//! for tlru, no node records a shallower branch than a child of it) and
//! the tree's own gauges. It takes no part in the concurrent protocol.

use crate::sync::Ordering;
use crate::tree::namespaces;
use crate::tree::node::{page_hash, Node};
use crate::tree::state::Tree;
use crossbeam_epoch::Guard;

impl Tree {
    /// Checks I1, I4, I5, I8 and the tree's own counters. `Err` names the
    /// first violation. Meaningful in quiescent state only.
    pub(crate) fn check(&self, guard: &Guard) -> Result<(), String> {
        let ps = self.page_size();
        let mut seen = std::collections::HashSet::new();
        let mut tokens = vec![0u64; self.tiers()];
        let mut count = 0u64;
        let mut stack: Vec<&Node> = Vec::new();
        for (ns, root) in self.roots.roots(guard) {
            if !seen.insert(root.id) {
                return Err(format!("I5: root of namespace {ns:?} appears twice"));
            }
            if namespaces::name_of(&root.image_ref(guard).key).as_deref() != ns {
                return Err(format!("the root of namespace {ns:?} names another"));
            }
            if root.children_ref(guard).is_empty() {
                return Err(format!(
                    "namespace {ns:?} has an empty root (it should have been reclaimed)"
                ));
            }
            stack.push(root);
        }
        while let Some(n) = stack.pop() {
            let img = n.image_ref(guard);
            if n.is_obsolete() {
                return Err(format!("node {} is linked but marked obsolete", n.id));
            }
            if !n.is_root {
                count += 1;
                if img.key.is_empty() || img.key.len() % ps != 0 {
                    return Err(format!(
                        "I4: node {} has a key of {} tokens (page size {ps})",
                        n.id,
                        img.key.len()
                    ));
                }
                if !n.resident_anywhere() && n.children_ref(guard).is_empty() {
                    return Err(format!(
                        "node {} has no residency and no children but is linked",
                        n.id
                    ));
                }
            }
            // SAFETY: `n` is linked (reached from a root under `guard`).
            let parent = (!img.parent.is_null()).then(|| unsafe { &*img.parent.0 });
            for (e, tokens_e) in tokens.iter_mut().enumerate() {
                let st = n.slot(e).residency.load();
                if n.is_root {
                    continue;
                }
                match (img.values.get(e), st.resident()) {
                    (Some(v), true) => {
                        let nv = v.tokens(ps);
                        if nv != img.key.len() {
                            return Err(format!(
                                "I4: node {} holds {nv} values for {} tokens on {}",
                                n.id,
                                img.key.len(),
                                self.tier_of(e)
                            ));
                        }
                        *tokens_e += nv as u64;
                        if let Some(p) = parent {
                            if !p.resident(e) {
                                return Err(format!(
                                    "I1: node {} is resident on {} but its parent {} is not",
                                    n.id,
                                    self.tier_of(e),
                                    p.id
                                ));
                            }
                        }
                    }
                    (None, false) => {}
                    (v, r) => {
                        return Err(format!(
                            "node {} on {}: values present = {}, RESIDENT = {r}",
                            n.id,
                            self.tier_of(e),
                            v.is_some()
                        ))
                    }
                }
            }
            let children = n.children_ref(guard);
            let mut resident_children = vec![0u32; self.tiers()];
            let mut pages = std::collections::HashSet::new();
            children
                .check(
                    |c| c.image_ref(guard).key.get(..ps).map_or(0, page_hash),
                    |c| c.id,
                )
                .map_err(|e| format!("I4: children of node {}: {e}", n.id))?;
            for c in children.nodes() {
                let cimg = c.image_ref(guard);
                if !cimg.parent.is(n) {
                    return Err(format!("node {}'s parent link is not node {}", c.id, n.id));
                }
                if cimg.key.len() < ps {
                    return Err(format!("I4: node {} is shorter than a page", c.id));
                }
                if !pages.insert(&cimg.key[..ps]) {
                    return Err(format!(
                        "I4: two children of node {} start with the same page",
                        n.id
                    ));
                }
                if !seen.insert(c.id) {
                    return Err(format!("I5: node {} is reachable twice", c.id));
                }
                let (deep, below) = (
                    n.deepest.load(Ordering::SeqCst),
                    c.deepest.load(Ordering::SeqCst),
                );
                if self.tracks_depths() && !n.is_root && deep < below {
                    return Err(format!(
                        "I8: node {} records a branch {deep} tokens deep, its child {} one of {below}",
                        n.id, c.id
                    ));
                }
                for (e, r) in resident_children.iter_mut().enumerate() {
                    if c.residency_on(e).resident() {
                        *r += 1;
                    }
                }
                stack.push(c);
            }
            if !n.is_root {
                for (e, r) in resident_children.iter().enumerate() {
                    let counted = n.slot(e).resident_children.load(Ordering::SeqCst);
                    if counted != *r {
                        return Err(format!(
                            "node {} counts {counted} resident children on {}, has {r}",
                            n.id,
                            self.tier_of(e)
                        ));
                    }
                }
            }
        }
        for (e, t) in tokens.iter().enumerate() {
            let g = self.resident_tokens(e);
            if g != *t {
                return Err(format!(
                    "resident-token gauge of {} is {g}, the tree holds {t}",
                    self.tier_of(e)
                ));
            }
        }
        if count != self.node_count() {
            return Err(format!(
                "node gauge is {}, the tree has {count}",
                self.node_count()
            ));
        }
        Ok(())
    }
}
