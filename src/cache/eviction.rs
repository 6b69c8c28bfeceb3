//! The eviction engine: per tier, a candidate heap of leaves in policy
//! order (lazily validated), the eviction loop over it (or, for the
//! policies ranked by a scan, over the tier's leaves), replica-aware
//! choice among the next candidates, the accounting of evicted values and
//! pages, eviction metrics, and reclamation of what evictions unlinked.
//! The background thread that calls it is `evictor`; the orders themselves
//! are `policy`; taking out one block and what continues it is
//! `evict_from`.

use super::ownership::{OwnedPages, Ownership};
use super::policy::{self, EvictionPolicy, LeafStats};
use super::{CacheError, Evicted, PrefixCopy, RadixCache, TokenKey};
use crate::device::Tier;
use crate::sync::{Arc, Ordering};
use crate::tree::node::{arc_of, Node, Values};
use crate::tree::ops::evict::{is_candidate, is_leaf_on};
use crate::tree::prefetch::prefetch_node;
use crossbeam_epoch::Guard;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A node in a candidate heap, ordered by address (only to break exact key
/// ties between two entries of the same node).
#[derive(Debug)]
struct ByAddr(Arc<Node>);

impl PartialEq for ByAddr {
    fn eq(&self, o: &Self) -> bool {
        Arc::ptr_eq(&self.0, &o.0)
    }
}
impl Eq for ByAddr {}
impl PartialOrd for ByAddr {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for ByAddr {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        Arc::as_ptr(&self.0).cmp(&Arc::as_ptr(&o.0))
    }
}

/// The evictor's per-device candidates: a heap of (key when pushed, node)
/// and the pinned leaves met on the last pass.
///
/// Lazy validation is exact for policies whose keys only grow while a node
/// waits (lru, lfu, fifo, priority): a popped entry whose key grew is pushed
/// back with its current key, so the first entry popped with an unchanged
/// key is the true minimum. Entries of nodes that stopped being leaves are
/// dropped; every transition into leafhood pushes again (an insert's new or
/// adopted node through the tree's lock-free inbox, a parent whose last
/// resident child was evicted here), so no candidate is ever missing.
///
/// For sieve the heap holds the hand's order instead (see
/// [`EvictionPolicy`]): keys are (round, creation stamp, stamp the visited
/// bit is judged against), which only the evictor changes, and `hand` is
/// the position of the last leaf evicted.
///
/// The same lock keeps the device's eviction metrics.
#[derive(Debug, Default)]
pub(super) struct Candidates {
    heap: BinaryHeap<Reverse<(policy::EvictionKey, ByAddr)>>,
    aside: Vec<Arc<Node>>,
    /// Sieve: (round, creation stamp) of the last leaf evicted.
    hand: (u64, u64),
    metrics: crate::metrics::EvictionRecorder,
}

/// Called on each victim leaf before it is claimed: writes it back to the
/// host tier and returns the tokens written.
type WriteBackHook<'a> = &'a mut dyn FnMut(&Node, &Guard) -> usize;

/// `out` with its values' room given back if far more was reserved than
/// used (fewer tokens were evictable than asked for: pinned leaves).
pub(super) fn fitted(mut out: Evicted) -> Evicted {
    if out.values.capacity() > 2 * out.values.len() + 4096 {
        out.values.shrink_to_fit();
    }
    out
}

/// Replica-aware eviction looks at this many candidates in policy order
/// and takes the first one also resident on another device.
const REPLICA_WINDOW: usize = 8;

impl Candidates {
    /// Drops the heap (a switch to a policy that ranks by a scan); the
    /// metrics stay.
    pub(super) fn clear(&mut self) {
        self.heap.clear();
        self.aside.clear();
        self.hand = (0, 0);
    }
}

impl<P: Ownership> RadixCache<P> {
    /// Evicts whole unpinned leaves of `tier` in policy order until at
    /// least `tokens` tokens are freed or nothing evictable is left, and
    /// returns their values. A parent whose last resident child goes
    /// becomes a candidate in turn. A node left with no residency on any
    /// device and no children leaves the tree.
    pub fn evict(&self, tier: impl Into<Tier>, tokens: usize) -> Result<Evicted, CacheError> {
        let t = self.slot(tier.into())?;
        self.evict_inner(t, tokens, None)
    }

    fn evict_inner(
        &self,
        d: usize,
        tokens: usize,
        mut hook: Option<WriteBackHook<'_>>,
    ) -> Result<Evicted, CacheError> {
        let mut out = Evicted::default();
        if tokens == 0 {
            return Ok(out);
        }
        let start = std::time::Instant::now();
        if self.pages.allocator_of(d).is_none() {
            // The values are returned (no allocator to give pages back to):
            // room for all of them at once, so that a large eviction does
            // not copy them over and over as the vector grows (measured:
            // a third of a W1 10 % eviction went to growing it).
            let resident = usize::try_from(self.tree.resident_tokens(d)).unwrap_or(usize::MAX);
            out.values
                .reserve(tokens.min(resident) + self.page_size() * 64);
        }
        // The evictor frees what earlier changes unlinked (see
        // `tree::reclaim`), so that matching threads never do.
        self.tree.reclaim();
        let guard = crossbeam_epoch::pin();
        // The kind is read under the device's eviction lock, which a policy
        // switch holds.
        let mut c = crate::sync::lock(&self.candidates[d]);
        if self.eviction_policy().keys_only_grow() && self.tree.notes_leaves() {
            self.evict_tracked(&mut c, d, tokens, &mut out, &mut hook, &guard);
            c.metrics
                .record_evict(out.leaves, out.tokens, out.pages, start.elapsed());
            return Ok(fitted(out));
        }
        // Ranked by a scan: the notes inserts leave are not needed (they
        // would only pile up). Dropped under the lock, while the policy is
        // still one that scans (a switch to a heap policy scans after it
        // drops notes: see `set_eviction_policy`); then the lock goes, so
        // that scan-ranked evictions run side by side as before.
        self.tree.drain_leaves(d, drop);
        // Read under the lock too: the whole call ranks by it, even if a
        // switch comes while it runs.
        let policy = self.eviction_policy();
        drop(c);
        let mut nodes: Vec<&Node> = self.tree.leaves(d, &guard);
        out.examined = nodes.len();
        let mut heap: BinaryHeap<_> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| Reverse((self.key_of(policy, n, d), i)))
            .collect();
        while out.tokens < tokens {
            let Some(Reverse((_, i))) = heap.pop() else {
                break;
            };
            if let Some(h) = hook.as_mut() {
                out.written_back += h(nodes[i], &guard);
            }
            let Some(ev) = self.tree.evict_leaf(nodes[i], d, &guard) else {
                continue;
            };
            self.account(&ev.values, d, &mut out);
            if is_leaf_on(ev.parent, d) {
                // Relaxed: as in `evict_tracked` (one evictor per device).
                let hits = ev.parent.slot(d).hits.load(Ordering::Relaxed);
                ev.parent.slot(d).hits_base.store(hits, Ordering::Relaxed);
            }
            if is_candidate(ev.parent, d) {
                heap.push(Reverse((self.key_of(policy, ev.parent, d), nodes.len())));
                nodes.push(ev.parent);
            }
        }
        crate::sync::lock(&self.candidates[d]).metrics.record_evict(
            out.leaves,
            out.tokens,
            out.pages,
            start.elapsed(),
        );
        Ok(fitted(out))
    }

    /// What eviction did on `tier` since the cache was built: calls,
    /// leaves, tokens and pages evicted, the latency histogram of `evict`
    /// calls, and the background evictor's wake-ups and time below the low
    /// watermark. Waits for an eviction in progress on that tier.
    ///
    /// ```
    /// use radixkv::{DeviceId, RadixCache, TokenKey};
    /// let c = RadixCache::builder().build().unwrap();
    /// c.insert(TokenKey::new(&[1, 2, 3]), DeviceId(0), &[4, 5, 6], 0).unwrap();
    /// c.evict(DeviceId(0), 1).unwrap();
    /// let m = c.eviction_metrics(DeviceId(0)).unwrap();
    /// assert_eq!((m.evict_calls, m.evicted_leaves, m.evicted_tokens), (1, 1, 3));
    /// assert_eq!(m.latency.count, 1);
    /// ```
    pub fn eviction_metrics(
        &self,
        tier: impl Into<Tier>,
    ) -> Result<crate::metrics::EvictionMetrics, CacheError> {
        let d = self.slot(tier.into())?;
        Ok(crate::sync::lock(&self.candidates[d]).metrics.metrics())
    }

    /// A copy of the latency histogram of `evict` calls on `tier` (the
    /// one [`eviction_metrics`](Self::eviction_metrics) summarizes), for
    /// exposition as buckets. Taken under the tier's eviction lock, so it
    /// waits for an eviction in progress there.
    ///
    /// ```
    /// use radixkv::{DeviceId, RadixCache, TokenKey};
    /// let c = RadixCache::builder().build().unwrap();
    /// c.insert(TokenKey::new(&[1, 2, 3]), DeviceId(0), &[4, 5, 6], 0).unwrap();
    /// c.evict(DeviceId(0), 1).unwrap();
    /// let h = c.eviction_latency(DeviceId(0)).unwrap();
    /// assert_eq!(h.len(), 1);
    /// assert_eq!(h.cumulative_counts(&[u64::MAX]), [1]);
    /// assert!(h.sum_ns() > 0);
    /// ```
    pub fn eviction_latency(
        &self,
        tier: impl Into<Tier>,
    ) -> Result<crate::metrics::LatencyHistogram, CacheError> {
        let d = self.slot(tier.into())?;
        Ok(crate::sync::lock(&self.candidates[d])
            .metrics
            .latency()
            .clone())
    }

    /// The background evictor's observations of device `d`.
    #[cfg(not(loom))]
    pub(crate) fn record_evictor(&self, d: usize, wakeup: bool, below_low: std::time::Duration) {
        let mut c = crate::sync::lock(&self.candidates[d]);
        if wakeup {
            c.metrics.record_wakeup();
        }
        c.metrics.add_time_below_low(below_low);
    }

    /// Frees the nodes, images and arrays that earlier changes unlinked
    /// and whose epoch grace period has passed, first letting
    /// crossbeam-epoch advance on this thread so that recent changes count
    /// too (it never waits: a reader pinned elsewhere only delays what it
    /// may still see). [`evict`](Self::evict) frees what is ready first,
    /// and inserts do once a few thousand objects wait, so that matching
    /// threads never pay for freeing memory; an application that neither
    /// evicts nor inserts for a while may call this from any thread to
    /// return that memory sooner. After evicting everything and
    /// `reclaim()`, a cache holds what an empty one does, within 64 KiB
    /// (`tests/memory.rs`).
    pub fn reclaim(&self) {
        self.tree.reclaim_all();
    }

    /// Adds one evicted leaf's values to `out`; with page ownership, returns
    /// its pages to the allocator instead of reporting the values.
    pub(super) fn account(&self, values: &Values, d: usize, out: &mut Evicted) {
        let before = out.values.len();
        values.append_to(&mut out.values, self.page_size());
        out.tokens += out.values.len() - before;
        out.leaves += 1;
        if let Some(a) = self.pages.allocator_of(d) {
            let ps = self.page_size();
            let pages: Vec<u32> = out.values[before..]
                .iter()
                .step_by(ps)
                .map(|&slot| slot / ps as u32)
                .collect();
            out.pages += pages.len();
            a.give_back(&pages);
            out.values.truncate(before);
        } else {
            out.leaf_ends.push(out.values.len());
        }
    }

    /// Eviction from the device's candidate heap: O(evicted · log leaves)
    /// plus the leaves inserted since the last call.
    fn evict_tracked(
        &self,
        c: &mut Candidates,
        d: usize,
        tokens: usize,
        out: &mut Evicted,
        hook: &mut Option<WriteBackHook<'_>>,
        guard: &crossbeam_epoch::Guard,
    ) {
        // New leaves and the pinned ones set aside earlier join the heap.
        // Many (tens of thousands after a burst of inserts) are appended to
        // the heap's own array, sized once for all, which is then heapified
        // in bulk: no second array of them to fill and then copy into the
        // heap's. A few, against a large heap, are pushed one by one.
        let joining = self.tree.noted_leaves(d) + c.aside.len();
        let queued = c.heap.len();
        let bulk = joining >= queued / 4;
        let mut fresh = if bulk {
            std::mem::take(&mut c.heap).into_vec()
        } else {
            Vec::new()
        };
        fresh.reserve(joining + 16);
        let hand = c.hand;
        // A node filed under its key as the node has it now, if a leaf.
        let visited = |n: Arc<Node>, fresh: &mut Vec<_>| {
            if is_leaf_on(&n, d) {
                fresh.push(Reverse((self.entry_key(hand, &n, d), ByAddr(n))));
            }
        };
        // A note is filed under a lower bound of its key, from what it
        // carries: taking thousands in visits none of the nodes (popping
        // validates each). Sieve ranks by the hand and visits the node.
        self.tree.drain_leaves(d, |note| {
            match self.eviction_policy().lower_bound(note.last_access) {
                Some(k) => fresh.push(Reverse((k, ByAddr(note.node)))),
                None => visited(note.node, &mut fresh),
            }
        });
        for n in std::mem::take(&mut c.aside) {
            visited(n, &mut fresh);
        }
        if bulk {
            out.examined += fresh.len() - queued;
            c.heap = BinaryHeap::from(fresh);
        } else {
            out.examined += fresh.len();
            c.heap.extend(fresh);
        }
        let replicas = self.replica_aware && self.devices() > 1;
        while out.tokens < tokens {
            let Some(first) = self.next_candidate(c, d, out, guard) else {
                break;
            };
            let (stored, n) = if replicas && !self.replicated(&first.1, d) {
                // Look a few candidates further for one with a replica; the
                // others go back unchanged (they were just validated).
                // On the stack: a vector here was an allocation per victim.
                let mut window: smallvec::SmallVec<[_; REPLICA_WINDOW]> =
                    smallvec::smallvec![first];
                while window.len() < REPLICA_WINDOW {
                    let Some(next) = self.next_candidate(c, d, out, guard) else {
                        break;
                    };
                    let found = self.replicated(&next.1, d);
                    window.push(next);
                    if found {
                        break;
                    }
                }
                let pick = if self.replicated(&window[window.len() - 1].1, d) {
                    window.len() - 1
                } else {
                    0
                };
                let chosen = window.swap_remove(pick);
                for (k, n) in window {
                    c.heap.push(Reverse((k, ByAddr(n))));
                }
                chosen
            } else {
                first
            };
            // The write-back, if any, completes before the victim is
            // claimed: its copy pins the victim's pages while they are read.
            if let Some(h) = hook.as_mut() {
                out.written_back += h(&n, guard);
            }
            // `n` was seen linked (not obsolete) under `guard` just above.
            let Some(ev) = self.tree.evict_leaf(&n, d, guard) else {
                c.aside.push(n); // lost a race with a pin or a new child
                continue;
            };
            if self.eviction_policy() == EvictionPolicy::Sieve {
                let (round, order, _) = stored.sieve_parts();
                c.hand = (round, order);
            }
            self.account(&ev.values, d, out);
            if is_leaf_on(ev.parent, d) {
                // SAFETY: `ev.parent` is a tree node reached under `guard`,
                // which is alive here.
                let p = unsafe { arc_of(ev.parent) };
                // Relaxed: written and read by this device's evictor, under
                // the candidates lock.
                let hits = p.slot(d).hits.load(Ordering::Relaxed);
                p.slot(d).hits_base.store(hits, Ordering::Relaxed);
                self.file_parent(c, p, d);
            }
        }
        // A heap that shrank a lot (after a large eviction) gives its peak
        // capacity back rather than hold it; amortized, since it must first
        // have emptied to a quarter.
        if c.heap.capacity() > 4 * c.heap.len() + 256 {
            c.heap.shrink_to(2 * c.heap.len());
        }
        if c.aside.capacity() > 4 * c.aside.len() + 256 {
            c.aside.shrink_to(2 * c.aside.len());
        }
    }

    /// The next valid candidate of the heap in policy order: a leaf on `d`,
    /// unpinned, whose key is current. Stale entries are dropped, pinned
    /// leaves set aside, grown keys pushed back; for sieve, a leaf hit since
    /// the hand last passed it gets its second chance here.
    /// Files `p`, a leaf on `d` since its children there were evicted,
    /// into the candidate heap under its own key (not a leaf note's bound).
    /// Under sieve its hits so far were passes through to those children:
    /// it joins right at the hand (the next candidate, like its coldest
    /// descendants) with its visited bit clear.
    pub(super) fn file_parent(&self, c: &mut Candidates, p: Arc<Node>, d: usize) {
        let mut k = self.entry_key(c.hand, &p, d);
        if self.eviction_policy() == EvictionPolicy::Sieve {
            // Relaxed: advisory ranking statistics, read under the
            // candidates lock.
            let last = p.slot(d).last_access.load(Ordering::Relaxed);
            k = policy::EvictionKey::sieve(c.hand.0, c.hand.1, last, p.id);
        }
        c.heap.push(Reverse((k, ByAddr(p))));
    }

    fn next_candidate(
        &self,
        c: &mut Candidates,
        d: usize,
        out: &mut Evicted,
        guard: &Guard,
    ) -> Option<(policy::EvictionKey, Arc<Node>)> {
        loop {
            let Reverse((stored, ByAddr(n))) = c.heap.pop()?;
            out.examined += 1;
            // The next candidates' lines start loading while this one is
            // validated and evicted (a cold node is a chain of misses: the
            // node, its slot, its image): the next top, whose node lines
            // were asked for one pop ago, in depth; its two children in the
            // heap, the likely ones after it, shallow.
            let next = c.heap.as_slice();
            for (i, Reverse((_, ByAddr(m)))) in next.iter().take(3).enumerate() {
                prefetch_node(m, d, i == 0, guard);
            }
            if !is_leaf_on(&n, d) {
                continue; // stale: evicted, unlinked or no longer a leaf
            }
            if n.slot(d).residency.load().pins() > 0 {
                c.aside.push(n); // a candidate again once unpinned
                continue;
            }
            if self.eviction_policy() == EvictionPolicy::Sieve {
                // An entry of a node evicted and cached again meanwhile is
                // older than its new one: harmless, it only offers the node
                // to the hand once more.
                let (round, order, seen) = stored.sieve_parts();
                let last = n.slot(d).last_access.load(Ordering::Relaxed);
                if last > seen {
                    // Visited: clear the bit, wait for the next round.
                    let k = policy::EvictionKey::sieve(round + 1, order, last, n.id);
                    c.heap.push(Reverse((k, ByAddr(n))));
                    continue;
                }
                return Some((stored, n));
            }
            let now = self.key_of(self.eviction_policy(), &n, d);
            if now != stored {
                // Keys only grow, so every other entry's node ranks at or
                // above its entry's key: if none of those is below `now`,
                // this node is the least and goes now; otherwise it goes
                // back under its true key. (Notes are filed under a lower
                // bound, so this is most pops: one heap operation, not two.)
                if c.heap.peek().is_some_and(|Reverse((top, _))| *top < now) {
                    c.heap.push(Reverse((now, ByAddr(n))));
                    continue;
                }
                return Some((now, n));
            }
            return Some((stored, n));
        }
    }

    /// Re-ranks device `d`'s candidates under the policy now (after a
    /// switch): every leaf on `d`, keyed afresh; the sieve hand restarts.
    /// The caller holds `c`'s lock.
    pub(super) fn rerank(&self, c: &mut Candidates, d: usize, guard: &Guard) {
        c.clear();
        for n in self.tree.leaves(d, guard) {
            // SAFETY: `n` is a tree node reached under `guard`, alive here.
            let n = unsafe { arc_of(n) };
            let k = self.entry_key(c.hand, &n, d);
            c.heap.push(Reverse((k, ByAddr(n))));
        }
    }

    /// Whether `n`'s tokens are also resident on a device other than `d`.
    fn replicated(&self, n: &Node, d: usize) -> bool {
        (0..self.devices()).any(|e| e != d && n.residency_on(e).resident())
    }

    /// The heap key of a leaf joining the candidates: its policy key, or for
    /// sieve its place relative to the hand (this round if the hand has not
    /// passed its creation stamp yet, otherwise the next).
    fn entry_key(&self, hand: (u64, u64), n: &Node, d: usize) -> policy::EvictionKey {
        self.ranked(hand, self.key_of(self.eviction_policy(), n, d))
    }

    /// A heap entry's key from a leaf's policy key (Sieve places it
    /// relative to the hand).
    fn ranked(&self, hand: (u64, u64), k: policy::EvictionKey) -> policy::EvictionKey {
        if self.eviction_policy() != EvictionPolicy::Sieve {
            return k;
        }
        let (_, created, seen) = k.sieve_parts();
        let round = if created > hand.1 { hand.0 } else { hand.0 + 1 };
        policy::EvictionKey::sieve(round, created, seen, k.id())
    }

    /// `n`'s key on `d` under `policy` (the caller reads the policy under
    /// the device's eviction lock: one policy for a whole eviction).
    fn key_of(&self, policy: EvictionPolicy, n: &Node, d: usize) -> policy::EvictionKey {
        let s = &n.slot(d);
        policy.key(&LeafStats {
            last_access: s.last_access.load(Ordering::Relaxed),
            created: s.created.load(Ordering::Relaxed),
            hits: s.hits.load(Ordering::Relaxed),
            hits_base: s.hits_base.load(Ordering::Relaxed),
            slru_threshold: self.slru_threshold,
            priority: n.priority.load(Ordering::Relaxed),
            id: n.id,
            // Counted up the path for tlru alone, which ranks by it (a
            // split that moves it files the node again:
            // `EvictionPolicy::keys_only_grow`).
            start: if policy == EvictionPolicy::Tlru {
                self.tree.start_of(n).unwrap_or(0)
            } else {
                0
            },
            // Relaxed: advisory, as the stamps.
            deepest: u64::from(n.deepest.load(Ordering::Relaxed)),
            tlru: self.tlru,
        })
    }
}

impl RadixCache<OwnedPages> {
    /// [`evict`](RadixCache::evict) with write-back to the host tier: before a
    /// victim leaf of `tier` (a device) is evicted, the part of its path (root to
    /// the leaf) that the host tier does not hold yet is copied there,
    /// ancestors included, so the host's residency stays prefix-closed and
    /// loadable. `write` moves the KV of each [`PrefixCopy`] (device →
    /// host, run by run) and says whether it succeeded; a copy that fails
    /// is cancelled and the victim evicted anyway. The victim's pages are
    /// pinned by the copy while `write` runs, so no other evictor can free
    /// (and reuse) them mid-copy; it is claimed for eviction only after the
    /// copy completed (loom model `write_back_vs_evict`). Needs a host tier
    /// ([`CacheError::NoHostTier`] otherwise); [`Evicted::written_back`]
    /// counts the tokens copied.
    ///
    /// ```
    /// use radixkv::{DeviceId, RadixCache, TokenKey};
    /// use std::sync::Arc;
    /// let c = Arc::new(
    ///     RadixCache::builder().page_size(2).pages_per_device(16).host_pages(64).build()?,
    /// );
    /// let span = c.alloc(DeviceId(0), 4)?;
    /// c.insert_pages(TokenKey::new(&[1, 2, 3, 4]), span, 0)?;
    /// let ev = c.evict_with_write_back(DeviceId(0), 4, |copy| {
    ///     // move copy.runs() from device 0 to the host here
    ///     copy.range().len() > 0
    /// })?;
    /// assert_eq!((ev.tokens, ev.written_back), (4, 4));
    /// let t = c.peek_tiers(TokenKey::new(&[1, 2, 3, 4]));
    /// assert_eq!((t.devices[0], t.host), (0, 4)); // gone from the GPU, kept on the host
    /// c.audit();
    /// # Ok::<(), radixkv::CacheError>(())
    /// ```
    pub fn evict_with_write_back(
        self: &Arc<Self>,
        tier: impl Into<Tier>,
        tokens: usize,
        mut write: impl FnMut(&PrefixCopy) -> bool,
    ) -> Result<Evicted, CacheError> {
        let tier = tier.into();
        self.check_copy(tier, Tier::Host)?;
        let t = self.slot(tier)?;
        let mut hook = |n: &Node, guard: &Guard| -> usize {
            let Some((ns, path)) = self.tree.path_of(n, guard) else {
                return 0;
            };
            let key = TokenKey::new(&path).in_namespace(ns.as_deref());
            // A copy that cannot be planned (the host full of pinned pages)
            // is skipped: the victim goes as without a host tier.
            let Ok(Some(copy)) = self.copy_prefix(key, tier, Tier::Host) else {
                return 0;
            };
            let n = copy.range().len();
            if write(&copy) && copy.complete().is_ok() {
                n
            } else {
                0
            }
        };
        self.evict_inner(t, tokens, Some(&mut hook))
    }
}
