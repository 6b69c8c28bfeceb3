//! Walks from a namespace's root along a key: the step to the child that
//! continues it (climbing past a split half done, never waiting for it),
//! `peek` (resident lengths per tier, writing nothing), `match_on` (one
//! tier's match, splitting the node it ends inside, as SGLang does), and
//! the climbs back up to the root that read a path's tokens or values.
//!
//! The protecting steps of the readers are here: [`reader_parent_check`]
//! (a child split under the reader is climbed past) and
//! [`reader_never_waits`] (nor is the splitter waited for).

use crate::sync::{spin_wait, Ordering};
use crate::tree::namespaces;
use crate::tree::node::{image_addr, page_hash, Node, NodeChildren, NodeImage};
use crate::tree::ops::split::Split;
use crate::tree::prefetch::{prefetch, prefetch_image, prefetch_line, prefetch_node_lines};
use crate::tree::protocol::lock::{LockFailed, Locking};
use crate::tree::state::Tree;
use crossbeam_epoch::{Guard, Shared};

/// The end node of a walk.
#[derive(Clone, Copy, Debug)]
pub(crate) enum End<'g> {
    /// The namespace root (nothing matched).
    Root,
    /// A node.
    Node(&'g Node),
}

/// What a match walk found.
#[derive(Debug)]
pub(crate) struct MatchWalk<'g> {
    pub(crate) end: End<'g>,
    /// Tokens resident on the asked tier.
    pub(crate) len: usize,
    /// Residency generation of `end` on the asked tier, as seen.
    pub(crate) generation: u64,
    /// Longest prefix resident on any device, and that device.
    pub(crate) any_len: usize,
    pub(crate) any_device: Option<usize>,
    /// Longest prefix resident on the host tier (0 without one).
    pub(crate) host_len: usize,
    /// Hits on the asked tier of the node the match ended on, this one
    /// included (0 for an empty match).
    pub(crate) hits: u64,
}

/// One step of a walk: the child of `cur` that continues the key, its
/// image, and how many of the key's tokens it matches (whole pages).
pub(crate) enum Step<'g> {
    None,
    Found(&'g Node, Shared<'g, NodeImage>, usize),
}

/// A child's key at least this long is compared while the next child
/// starts loading ([`Tree::common_prefix_ahead`]). A shorter key's compare
/// ends before what it asks for could arrive, and the extra lookup of the
/// next child would only lengthen the walk.
const AHEAD_MIN_TOKENS: usize = 128;

/// Length of the common prefix of `a` and `b` in whole pages.
pub(crate) fn common_prefix(a: &[u32], b: &[u32], page_size: usize) -> usize {
    const CHUNK: usize = 16;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    // The usual answer (the whole overlap matches: a key that runs through
    // this node) costs one memcmp; only a mismatch is then located.
    if a == b {
        return n - n % page_size;
    }
    let mut i = 0;
    // Whole chunks compare as one memcmp.
    while i + CHUNK <= n && a[i..i + CHUNK] == b[i..i + CHUNK] {
        i += CHUNK;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i - i % page_size
}

/// Splits can put nodes between a parent `cur` and a `child` a reader
/// found in `cur`'s children array (an array loaded before the split
/// published its successor). From `child`, follows image parent links up
/// to the node whose parent is `cur`, and returns it with its image: the
/// node a fresh read of `cur`'s children would have found. Each hop goes
/// one node closer to `cur`, and the nodes between were cut from `child`'s
/// key (every node holds at least one page), so the climb takes at most
/// as many hops as `child` had pages when the reader's array was current:
/// bounded, and never a wait for another thread.
///
/// Memory: every node on the way was linked at some moment after the
/// caller's guard was pinned (it was `child`'s or a climbed node's parent
/// in an image loaded under the guard, and a node is only unlinked after
/// its children are), so it is retired, if at all, after that pin, and
/// stays allocated while the guard lives.
///
/// `None` only if the links never reach `cur` (which the split protocol
/// rules out; a caller then treats the page as not found).
fn climb_to<'g>(
    cur: &Node,
    child: &'g Node,
    img: Shared<'g, NodeImage>,
    guard: &'g Guard,
) -> Option<(&'g Node, Shared<'g, NodeImage>)> {
    let (mut n, mut img) = (child, img);
    // A generous bound that the protocol never reaches (see above).
    for _ in 0..(1usize << 26) {
        // SAFETY: images are never null and are retired through the
        // reclaimer; `img` was loaded under `guard`.
        let parent = unsafe { img.deref() }.parent;
        if parent.is(cur) {
            return Some((n, img));
        }
        if parent.is_null() {
            return None;
        }
        // SAFETY: `parent` was the parent in an image loaded under `guard`,
        // so it was linked after the guard was pinned and is not freed
        // before the guard drops (see above).
        n = unsafe { &*parent.0 };
        img = n.image(guard);
        crate::pause::climbed();
    }
    debug_assert!(false, "a parent chain that never reaches the parent");
    None
}

/// The protecting step `reader_parent_check` (models `split_vs_reader`,
/// `split_vs_reader_at_page_size_two`, `split_below_a_table_vs_reader`): a
/// child whose image names another parent than `cur` was just split (a
/// node now sits between `cur` and it, and `cur`'s new children may not be
/// published yet: the splitter holds `cur`'s lock). The reader climbs the
/// child's parent links to the node that now hangs below `cur` (the
/// split's new prefix node, fully built before the child's image named it)
/// and compares against that node's key instead of the child's shortened
/// one. Its control takes the child as it found it.
fn reader_parent_check<'g>(
    cur: &Node,
    child: &'g Node,
    img: Shared<'g, NodeImage>,
    guard: &'g Guard,
) -> Option<(&'g Node, Shared<'g, NodeImage>)> {
    if crate::negative::removed("reader_parent_check") {
        return Some((child, img));
    }
    climb_to(cur, child, img, guard)
}

/// The protecting step `reader_never_waits` (`tests/parked_writer.rs`): a
/// reader that meets a split half done does not wait for the splitter to
/// publish `cur`'s new children ([`reader_parent_check`] climbs instead);
/// whether it waited. Its control waits, as readers once did, and the
/// caller reads `cur`'s children again.
fn reader_never_waits(cur: &Node, img: Shared<'_, NodeImage>, guard: &Guard) -> bool {
    if crate::negative::removed("reader_never_waits") {
        // SAFETY: images are never null and are retired through the
        // reclaimer; `img` was loaded under `guard`.
        if !unsafe { img.deref() }.parent.is(cur) {
            let seen = cur.children.load(Ordering::SeqCst, guard);
            // Bounded (past the test's 20 s, so the control still fails
            // it): a reader that read `seen` after the splitter published
            // would wait for a change that never comes, and the test,
            // which joins its readers, would never end.
            let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while cur.children.load(Ordering::SeqCst, guard) == seen
                && std::time::Instant::now() < until
            {
                spin_wait();
            }
            return true;
        }
    }
    false
}

/// Calls `visit` on `end` and each of its ancestors below the root, with
/// the image it read of each, `end`'s first, read under `guard` (from
/// which `end` was reached), and returns the root they lead to. `None` if
/// `visit` says so, or if a parent link is null before a root (a chain cut
/// by an unlink).
pub(super) fn climb_to_root<'g>(
    end: &'g Node,
    guard: &'g Guard,
    mut visit: impl FnMut(&'g Node, &'g NodeImage) -> Option<()>,
) -> Option<&'g Node> {
    let mut n = end;
    while !n.is_root {
        let img = n.image_ref(guard);
        visit(n, img)?;
        if img.parent.is_null() {
            return None;
        }
        // SAFETY: `n` was reached under `guard`, so its image's parent was
        // linked during the guard's life and is not freed before it (see
        // `ParentPtr`).
        n = unsafe { &*img.parent.0 };
    }
    Some(n)
}

impl Tree {
    /// The child of `cur` that continues `rest` (whose first page it must
    /// start with), if any.
    pub(crate) fn step<'g>(&self, cur: &Node, rest: &[u32], guard: &'g Guard) -> Step<'g> {
        self.step_with(cur, rest, false, guard)
    }

    /// [`step`](Self::step) for a walk that goes on past the child it finds
    /// whenever it can (a read-only walk): `ahead` starts loading the
    /// child after it while the child's key is compared.
    fn step_with<'g>(&self, cur: &Node, rest: &[u32], ahead: bool, guard: &'g Guard) -> Step<'g> {
        let ps = self.page_size();
        let page = &rest[..ps];
        for child in cur.children_ref(guard).with_hash(page_hash(page)) {
            let img = child.image(guard);
            if let Some(step) = self.step_into(cur, child, img, rest, ahead, guard) {
                return step;
            }
        }
        Step::None
    }

    /// Checks one candidate child of `cur` for `rest`; `None` if its first
    /// page is another one (a hash collision).
    fn step_into<'g>(
        &self,
        cur: &Node,
        child: &'g Node,
        img: Shared<'g, NodeImage>,
        rest: &[u32],
        ahead: bool,
        guard: &'g Guard,
    ) -> Option<Step<'g>> {
        if reader_never_waits(cur, img, guard) {
            return Some(self.step_with(cur, rest, ahead, guard));
        }
        let Some((child, img)) = reader_parent_check(cur, child, img, guard) else {
            return Some(Step::None);
        };
        // SAFETY: images are never null and are retired through the
        // reclaimer; `img` was loaded under `guard`.
        let r = unsafe { img.deref() };
        // Candidates share the hash (or, in a table, a 32-bit tag) of the
        // first page; the page itself decides.
        let ps = self.page_size();
        if r.key.get(..ps) != Some(&rest[..ps]) {
            return None;
        }
        let k = if ahead {
            self.common_prefix_ahead(child, &r.key, rest, guard)
        } else {
            common_prefix(&r.key, rest, ps)
        };
        Some(Step::Found(child, img, k))
    }

    /// [`common_prefix`] of `child`'s `key` and `rest`, while the child
    /// that continues `rest` below `child` starts loading, one step of its
    /// chain of misses per quarter of the key compared: before the first,
    /// the query's page after `key` and `child`'s children array or table;
    /// then the slot of that page's hash there; then the child it holds
    /// (node lines); then that child's image (its head and the first
    /// tokens of its key). The walk's next step finds them in the cache or
    /// on their way instead of taking the misses one after another after
    /// the compare. Only for keys of at least [`AHEAD_MIN_TOKENS`]; hints,
    /// nothing the answer depends on.
    fn common_prefix_ahead<'g>(
        &self,
        child: &'g Node,
        key: &[u32],
        rest: &[u32],
        guard: &'g Guard,
    ) -> usize {
        let ps = self.page_size();
        let len = key.len();
        let next_page = match rest.get(len..len + ps) {
            Some(page) if len >= AHEAD_MIN_TOKENS && !cfg!(loom) => page,
            _ => return common_prefix(key, rest, ps),
        };
        let kids = child.children_ref(guard);
        prefetch(next_page);
        prefetch_line((kids as *const NodeChildren).cast());
        // Page-aligned quarters (the key is whole pages, `rest` longer).
        let quarter = (len / 4).div_ceil(ps) * ps;
        let (mut done, mut hash, mut next, mut stage) = (0, 0, None, 0);
        loop {
            let end = (done + quarter).min(len);
            let k = common_prefix(&key[done..end], &rest[done..end], ps);
            if k < end - done || end == len {
                return done + k;
            }
            done = end;
            match stage {
                0 => {
                    hash = page_hash(next_page);
                    for at in kids.probe_addrs(hash) {
                        prefetch_line(at);
                    }
                }
                1 => {
                    next = kids.with_hash(hash).next();
                    if let Some(n) = next {
                        prefetch_node_lines(n);
                    }
                }
                2 => {
                    if let Some(n) = next {
                        prefetch_image(n, 16, guard);
                    }
                }
                _ => {}
            }
            stage += 1;
        }
    }

    /// The device to report for the any-device answer at `node` (devices
    /// only, not the host tier).
    fn best_device(&self, node: &Node, preferred: usize) -> Option<usize> {
        if preferred < self.devices() && node.resident(preferred) {
            return Some(preferred);
        }
        (0..self.devices()).find(|&e| node.resident(e))
    }

    /// Lengths resident on every tier for `tokens`; writes nothing.
    pub(crate) fn peek(&self, ns: Option<&str>, tokens: &[u32], guard: &Guard) -> Vec<usize> {
        let mut out = vec![0; self.tiers()];
        let tokens = &tokens[..tokens.len() - tokens.len() % self.page_size()];
        prefetch(tokens);
        let Some(mut cur) = self.find_root(ns, guard) else {
            return out;
        };
        let mut pos = 0;
        while pos < tokens.len() {
            let (child, img, k) = match self.step_with(cur, &tokens[pos..], true, guard) {
                Step::None => break,
                Step::Found(c, i, k) => (c, i, k),
            };
            // A reader may be preempted between loading an image and
            // reading it; loom preempts only at atomic operations, so the
            // model gets a scheduling point here (a replaced image must
            // outlive the reader that loaded it:
            // `replaced_image_outlives_its_reader`).
            crate::sync::model_point();
            crate::sync::probe::assert_live(image_addr(img));
            // SAFETY: loaded under `guard`, retired through the reclaimer.
            let r = unsafe { img.deref() };
            let mut any = false;
            // Prefix-closed residency: a tier counts here only if it
            // covered everything before. Residency as the image has it (the
            // tiers with values, published with it, walked in one line,
            // rather than one state word per tier, each on a line of its
            // own): it agrees with the state words whenever no change of
            // this node is in flight, and during one it is either side of
            // the change, which a routing answer may be. A leaf that left
            // the tree keeps its last image: a reader that reached it
            // before it left counts it, as had it read a moment earlier.
            for (e, _) in r.values.iter() {
                if let Some(o) = out.get_mut(e) {
                    if *o == pos {
                        *o = pos + k;
                        any = true;
                    }
                }
            }
            if !any || k < r.key.len() {
                break;
            }
            pos += k;
            cur = child;
        }
        out
    }

    /// The longest prefix of `tokens` resident on `t`, splitting the node
    /// it ends inside (SGLang), stamping `t`'s slots with `stamp` and
    /// counting hits; also the longest prefix resident on any device.
    pub(crate) fn match_on<'g>(
        &self,
        ns: Option<&str>,
        tokens: &[u32],
        t: usize,
        stamp: u64,
        guard: &'g Guard,
    ) -> MatchWalk<'g> {
        let tokens = &tokens[..tokens.len() - tokens.len() % self.page_size()];
        let mut w = MatchWalk {
            end: End::Root,
            len: 0,
            generation: 0,
            any_len: 0,
            any_device: None,
            host_len: 0,
            hits: 0,
        };
        let Some(mut cur) = self.find_root(ns, guard) else {
            return w;
        };
        let mut pos = 0;
        let mut on_t = true;
        let host = self.host();
        let mut on_host = host.is_some();
        while pos < tokens.len() {
            let (mut child, img, k) = match self.step(cur, &tokens[pos..], guard) {
                Step::None => break,
                Step::Found(c, i, k) => (c, i, k),
            };
            // SAFETY: loaded under `guard`, retired through the reclaimer.
            let full = k == unsafe { img.deref() }.key.len();
            if on_t && child.resident(t) {
                child.stamp(t, stamp);
                let mut split = true;
                if !full {
                    // A match never waits for a lock: it splits only if
                    // both locks are free now. Otherwise its answer on `t`
                    // ends at `cur`, the longest prefix it can report
                    // without splitting.
                    let s = Split {
                        parent: cur,
                        child,
                        seen: img,
                        at: k,
                        tier: Some(t),
                        priority: None,
                        locking: Locking::Try,
                    };
                    match self.split(s, guard) {
                        Ok(p) => child = p,
                        Err(LockFailed::Busy) => split = false,
                        Err(LockFailed::Changed) => continue,
                    }
                }
                let st = child.residency_on(t);
                if split && st.resident() {
                    // Relaxed suffices: hit counts are statistics for
                    // eviction keys, read in quiescent state or tolerated
                    // stale.
                    let hits = &child.slot(t).hits;
                    w.hits = if self.hits_on_match() {
                        hits.fetch_add(1, Ordering::Relaxed) + 1
                    } else {
                        hits.load(Ordering::Relaxed)
                    };
                    w.end = End::Node(child);
                    w.len = pos + k;
                    w.generation = st.generation();
                } else {
                    on_t = false;
                }
            } else {
                on_t = false;
            }
            // The host tier, prefix-closed like a device: its prefix goes
            // on while every node so far is resident there.
            on_host = on_host && host.is_some_and(|h| child.resident(h));
            if on_host {
                w.host_len = pos + k;
            }
            match self.best_device(child, t) {
                Some(e) => {
                    w.any_len = pos + k;
                    w.any_device = Some(e);
                }
                None if on_host => {}
                None => break,
            }
            if !full {
                break;
            }
            pos += k;
            cur = child;
        }
        if w.any_device.is_none() && w.len > 0 && t < self.devices() {
            w.any_device = Some(t);
            w.any_len = w.len;
        }
        w
    }

    /// The node of namespace `ns` that starts at `start` and holds the page
    /// `tokens[start..start + page]`, where the tree holds all of
    /// `tokens[..start + page]`: a node that holds that page and starts
    /// before it is split there first (a writer's split, waiting for the
    /// locks). With it, the node above it that ends at `start` (the
    /// namespace's root for `start` 0). `None` if the tree does not hold
    /// those tokens.
    pub(crate) fn node_starting_at<'g>(
        &self,
        ns: Option<&str>,
        tokens: &[u32],
        start: usize,
        guard: &'g Guard,
    ) -> Option<(&'g Node, &'g Node)> {
        let ps = self.page_size();
        let end = start + ps;
        debug_assert!(start.is_multiple_of(ps) && end <= tokens.len());
        'walk: loop {
            let mut cur = self.find_root(ns, guard)?;
            let mut pos = 0;
            loop {
                let Step::Found(child, img, k) = self.step(cur, &tokens[pos..end], guard) else {
                    return None;
                };
                // SAFETY: loaded under `guard`, retired through the reclaimer.
                let len = unsafe { img.deref() }.key.len();
                if pos == start {
                    return Some((child, cur));
                }
                if pos + len <= start {
                    if k < len {
                        return None; // the key leaves this node before `start`
                    }
                    pos += len;
                    cur = child;
                    continue;
                }
                // `child` holds `start`, and begins before it.
                if pos + k < end {
                    return None; // the page at `start` is not this node's
                }
                let s = Split {
                    parent: cur,
                    child,
                    seen: img,
                    at: start - pos,
                    tier: None,
                    priority: None,
                    locking: Locking::Wait,
                };
                match self.split(s, guard) {
                    // The node object keeps the lower part: it starts at
                    // `start` now, below the new node of the upper part.
                    Ok(upper) => return Some((child, upper)),
                    Err(_) => continue 'walk,
                }
            }
        }
    }

    /// The namespace and tokens of root → `node`, read from the images
    /// under `guard` (a snapshot: a concurrent split changes no tokens of
    /// the path, only where they are cut). `None` for a root, or a node
    /// whose parent chain was cut meanwhile (unlinked).
    pub(crate) fn path_of(&self, node: &Node, guard: &Guard) -> Option<(Option<String>, Vec<u32>)> {
        if node.is_root {
            return None;
        }
        let mut segs: Vec<&[u32]> = Vec::new();
        let root = climb_to_root(node, guard, |_, img| {
            segs.push(&img.key);
            Some(())
        })?;
        let ns = namespaces::name_of(&root.image_ref(guard).key);
        let mut tokens = Vec::with_capacity(segs.iter().map(|s| s.len()).sum());
        for s in segs.iter().rev() {
            tokens.extend_from_slice(s);
        }
        Some((ns, tokens))
    }

    /// Reads the values of root → `end` on `t`. Only sound to rely on while
    /// `end` is pinned on `t`. Returns `None` if the path does not add up to
    /// `len` tokens (the caller then re-walks).
    pub(crate) fn path_values(
        &self,
        end: &Node,
        t: usize,
        len: usize,
        guard: &Guard,
    ) -> Option<Vec<u32>> {
        // `end` is pinned on `t` (caller's contract), so it and its
        // ancestors are resident on `t` and linked during `guard`.
        let ps = self.page_size();
        let mut segs = Vec::new();
        let mut total = 0;
        climb_to_root(end, guard, |_, img| {
            let v = img.values.get(t)?;
            total += v.tokens(ps);
            segs.push(v);
            Some(())
        })?;
        if total != len {
            return None;
        }
        let mut out = Vec::with_capacity(total);
        for s in segs.iter().rev() {
            s.append_to(&mut out, ps);
        }
        Some(out)
    }
}
