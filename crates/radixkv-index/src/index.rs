//! [`KvIndex`]: what every worker holds, as its KV events say, in one
//! radixkv tree. Each (worker, data-parallel rank, medium) is a tier of the
//! tree; a prompt's score on a tier is the longest prefix resident there.
//!
//! The tree is keyed by blocks' per-block hashes ([`crate::local_hash`]:
//! XXH3-64 of a block's tokens, seeded by its namespace), two `u32` words a
//! block, not by their tokens: a prompt's score on a tier is the run of its
//! blocks' hashes held there. Tokens are hashed once when they arrive and
//! never kept; `/query_by_hash` walks the hashes it is given, and a query
//! by tokens hashes its whole blocks first. The index is as exact as those
//! 64-bit hashes, as Dynamo's (keyed the same way) is.
//!
//! A worker's events name blocks by the worker's own hash: a store gives
//! each new block's hash, its parent's hash and its tokens, a removal only
//! hashes. So each (worker, rank), a [`Source`], keeps its blocks by that
//! hash ([`SourceBlocks`]: parent, per-block hash, the media holding it,
//! a place in the tree). A store below a parent reads the parent's key
//! from the tree by climbing from the parent's place
//! ([`radixkv::RadixCache::place_path`], a step per node of the path),
//! or, with no place, from the source's blocks one by one. To take a
//! block out again (a block that leaves a medium takes the blocks
//! continuing it out of reach, as a prefix match on that worker stops there
//! too), the removal climbs from the block's place
//! ([`radixkv::RadixCache::evict_from_place`]): the end of the store that
//! brought it, or the place above a block removed below it, which the tree
//! gives back with each removal; a block whose place has left the tree is
//! found by its path from the root ([`radixkv::RadixCache::evict_from`]).
//! A block that a removal left with no medium but
//! whose children are still held stays known (its hash leads to theirs),
//! and when it is stored again, the children held on that medium are
//! reachable again.
//!
//! Namespaces: a store's `lora_name` and `cache_salt` seed its blocks'
//! hashes ([`local_hash::seed`]); a block below a parent is in its parent's
//! namespace. SGLang's default event format carries neither its
//! `extra_key` nor, for requests without a named LoRA adapter, anything
//! that tells its namespaces apart: their blocks share a namespace here, as
//! the events allow.
//!
//! Events of different sources are applied concurrently (the core's
//! writers; each source's own under its lock, in order); queries run on any
//! thread and never wait.

use crate::block::{bit, Block, Places};
use crate::decode::{BlockHash, Event, Medium, Stored};
use crate::local_hash;
use arc_swap::ArcSwap;
use radixkv::{CacheError, DeviceId, RadixCache, TokenKey, TreePlace};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

/// A worker's data-parallel rank: the publisher of one event stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Source {
    /// The worker (Dynamo's `instance_id`).
    pub worker: u64,
    /// Its data-parallel (or attention-DP) rank.
    pub rank: u32,
}

/// What applying an event found wrong (the event is skipped, or the part
/// of it from there on; the index keeps serving).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// A store whose blocks are not of the index's block size.
    #[error("a store of blocks of {got} tokens into an index of {want}")]
    BlockSize {
        /// The store's.
        got: usize,
        /// The index's.
        want: usize,
    },
    /// A store whose parent block this source never stored (or already
    /// cleared).
    #[error("a store below block {0:#x}, which this source does not hold")]
    UnknownParent(u64),
    /// A removal of a block this source never stored (or already removed).
    #[error("a removal of block {0:#x}, which this source does not hold on that medium")]
    UnknownBlock(u64),
    /// A block hash stored again with other tokens, in another namespace
    /// or under another parent.
    #[error("block {0:#x} stored again with other contents")]
    Conflict(u64),
    /// Every tier of the tree is taken.
    #[error("no tier left for another (worker, rank, medium): the index holds {0}")]
    NoTier(usize),
    /// The tree refused the change.
    #[error("the tree refused the change: {0}")]
    Tree(#[from] CacheError),
}

impl ApplyError {
    /// The kind of error, as a short phrase (for logging each kind once).
    pub fn cause(&self) -> &'static str {
        match self {
            ApplyError::BlockSize { .. } => "a store of another block size",
            ApplyError::UnknownParent(_) => "a store below an unknown parent",
            ApplyError::UnknownBlock(_) => "a removal of a block not held",
            ApplyError::Conflict(_) => "a block stored again with other contents",
            ApplyError::NoTier(_) => "no tier left",
            ApplyError::Tree(_) => "the tree refused a change",
        }
    }
}

/// A map keyed by hashes that arrive already mixed (block hashes) or
/// that the sources choose: foldhash, seeded per process.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The blocks of one source, by hash, and buffers its changes reuse.
#[derive(Debug, Default)]
pub struct SourceBlocks {
    blocks: Map<BlockHash, Block>,
    /// The places in the tree its blocks climb from.
    places: Places,
    /// A path's key (two words a block), built for each insert and
    /// removal.
    path: Vec<u32>,
    /// A path's per-block hashes, leaf first (while building `path`).
    chain: Vec<u64>,
    /// The blocks of a long removal, for membership.
    removing: HashSet<BlockHash, foldhash::fast::RandomState>,
    /// Blocks visited building paths from the root ([`Self::fill_path`]).
    path_steps: u64,
}

/// Tree key words per block: a per-block hash as two `u32`s.
const WORDS: usize = 2;

/// Block hash `local` as key words ([`WORDS`], low first).
fn key_of(local: u64) -> [u32; WORDS] {
    [local as u32, (local >> 32) as u32]
}

/// Appends block hash `local` to key `path`.
fn push_key(path: &mut Vec<u32>, local: u64) {
    path.extend_from_slice(&key_of(local));
}

impl SourceBlocks {
    /// Blocks known (held on some medium, or leading to held ones).
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Fills `self.path` with the key from the root through block `h`;
    /// returns whether every block of the path is held on `m` (so that the
    /// tree has `h` resident on that medium's tier). `None` if `h` is
    /// unknown or its parents do not lead to a root.
    fn fill_path(&mut self, h: BlockHash, m: Medium) -> Option<bool> {
        self.chain.clear();
        self.path.clear();
        let mut on_m = true;
        let mut cur = h;
        loop {
            let b = self.blocks.get(&cur)?;
            self.path_steps += 1;
            self.chain.push(b.local);
            on_m &= b.media & bit(m) != 0;
            if self.chain.len() > self.blocks.len() {
                return None; // a cycle of hashes: not a path
            }
            match b.parent() {
                Some(p) => cur = p,
                None => break,
            }
        }
        for &local in self.chain.iter().rev() {
            push_key(&mut self.path, local);
        }
        Some(on_m)
    }

    /// `h` is no longer held on `m`; forgets it if it is held nowhere and
    /// leads to nothing, then its parent, likewise.
    fn unhold(&mut self, mut h: BlockHash, m: Medium) {
        if let Some(b) = self.blocks.get_mut(&h) {
            b.media &= !bit(m);
            if b.media == 0 {
                // Its node may leave the tree: not kept alive by it.
                self.places.leave(b);
            }
        }
        loop {
            let Some(b) = self.blocks.get(&h) else { return };
            if b.media != 0 || b.has_children() {
                return;
            }
            let parent = b.parent();
            self.blocks.remove(&h);
            let Some(p) = parent else { return };
            if let Some(pb) = self.blocks.get_mut(&p) {
                pb.remove_child(h);
            }
            h = p;
        }
    }
}

/// The tiers of the tree, by (source, medium).
#[derive(Debug, Default)]
struct Tiers {
    of: HashMap<(Source, Medium), usize>,
    by_tier: Vec<Option<(Source, Medium)>>,
}

/// Counts of what [`KvIndex::apply`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Events applied.
    pub events: u64,
    /// Blocks stored.
    pub stored: u64,
    /// Blocks removed.
    pub removed: u64,
    /// Events skipped (whole or in part; see [`ApplyError`]).
    pub skipped: u64,
}

/// The index of one model (and routing group): see the module docs.
pub struct KvIndex {
    block_size: usize,
    cache: RadixCache,
    tiers: Mutex<Tiers>,
    /// Who owns each tier, as `tiers.by_tier` was last published: what
    /// queries read, without taking the lock.
    owners: ArcSwap<Vec<Option<(Source, Medium)>>>,
    sources: Mutex<HashMap<Source, Arc<Mutex<SourceBlocks>>>>,
}

impl std::fmt::Debug for KvIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvIndex")
            .field("block_size", &self.block_size)
            .field("tiers", &self.cache.devices())
            .finish()
    }
}

/// One tier's answer to a query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Score {
    /// Whose.
    pub source: Source,
    /// Where.
    pub medium: Medium,
    /// Tokens of the prompt's longest prefix held there (whole blocks).
    pub tokens: usize,
}

/// Tokens up to which the index's values (`0, 1, …`) come from one
/// shared run instead of a vector built per insert.
const SHARED_VALUES: usize = 1 << 16;

/// `0, 1, …, SHARED_VALUES - 1`.
fn shared_values() -> &'static [u32] {
    static VALUES: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    VALUES.get_or_init(|| (0..SHARED_VALUES as u32).collect())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The per-block hash seed of a namespace ([`TokenKey::namespace_for`]'s
/// form): its LoRA name and cache salt, as [`local_hash::seed`] takes them.
fn namespace_seed(namespace: Option<&str>) -> u64 {
    let (lora_name, cache_salt) = namespace.map_or((None, None), TokenKey::namespace_parts);
    local_hash::seed(lora_name, cache_salt)
}

impl KvIndex {
    /// An empty index of blocks of `block_size` tokens (at least 1) with
    /// room for `max_tiers` (worker, rank, medium) tiers (at most
    /// [`radixkv::cache::MAX_DEVICES`]).
    pub fn new(block_size: usize, max_tiers: usize) -> Result<KvIndex, CacheError> {
        if block_size == 0 {
            return Err(CacheError::InvalidConfig(
                "a block size of 0 tokens".to_owned(),
            ));
        }
        let cache = RadixCache::builder()
            .page_size(WORDS)
            .devices(max_tiers)
            // Removals come by key (`evict_from`), never by the policy:
            // no candidate notes to pile up.
            .candidate_heap(false)
            .build()?;
        Ok(KvIndex {
            block_size,
            cache,
            tiers: Mutex::new(Tiers {
                of: HashMap::new(),
                by_tier: vec![None; max_tiers],
            }),
            owners: ArcSwap::from_pointee(vec![None; max_tiers]),
            sources: Mutex::new(HashMap::new()),
        })
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    fn source(&self, s: Source) -> Arc<Mutex<SourceBlocks>> {
        Arc::clone(lock(&self.sources).entry(s).or_default())
    }

    /// The tier of (`s`, `m`), taken if it has none.
    fn tier(&self, s: Source, m: Medium) -> Result<usize, ApplyError> {
        let mut t = lock(&self.tiers);
        if let Some(&i) = t.of.get(&(s, m)) {
            return Ok(i);
        }
        let Some(i) = t.by_tier.iter().position(Option::is_none) else {
            return Err(ApplyError::NoTier(t.by_tier.len()));
        };
        t.by_tier[i] = Some((s, m));
        t.of.insert((s, m), i);
        self.owners.store(Arc::new(t.by_tier.clone()));
        Ok(i)
    }

    fn existing_tier(&self, s: Source, m: Medium) -> Option<usize> {
        lock(&self.tiers).of.get(&(s, m)).copied()
    }

    /// Applies `events` of source `s`, in order; what could not be applied
    /// is returned with each event's index (the rest is applied).
    pub fn apply(&self, s: Source, events: &[Event]) -> (Applied, Vec<(usize, ApplyError)>) {
        let src = self.source(s);
        let mut blocks = lock(&src);
        let mut done = Applied::default();
        let mut errors = Vec::new();
        for (i, e) in events.iter().enumerate() {
            let r = match e {
                Event::Stored(st) => self.store(s, &mut blocks, st).map(|n| done.stored += n),
                Event::Removed { hashes, medium } => self
                    .remove(s, &mut blocks, hashes, *medium)
                    .map(|n| done.removed += n),
                Event::Cleared => {
                    self.clear_locked(s, &mut blocks);
                    Ok(())
                }
            };
            match r {
                Ok(()) => done.events += 1,
                Err(e) => {
                    done.skipped += 1;
                    errors.push((i, e));
                }
            }
        }
        (done, errors)
    }

    fn store(&self, s: Source, blocks: &mut SourceBlocks, st: &Stored) -> Result<u64, ApplyError> {
        let bs = self.block_size;
        if st.block_size != bs {
            return Err(ApplyError::BlockSize {
                got: st.block_size,
                want: bs,
            });
        }
        let t = self.tier(s, st.medium)?;
        // The new blocks are resident on the tier only below a parent that
        // is (a block held on a medium its parent is not on is out of reach
        // there until the parent comes).
        let (seed, reachable) = match st.parent {
            None => {
                blocks.path.clear();
                let seed = local_hash::seed(st.lora_name.as_deref(), st.cache_salt.as_deref());
                (seed, true)
            }
            Some(p) => {
                let pb = blocks
                    .blocks
                    .get(&p)
                    .ok_or(ApplyError::UnknownParent(p.0))?;
                let (seed, end, page, slot) = (
                    pb.seed,
                    pb.depth as usize * WORDS,
                    key_of(pb.local),
                    pb.place,
                );
                // From the parent's place, the key is read from the tree
                // (a step per node of the path, not per block), and the
                // tier holds it exactly when every block of it is held on
                // the medium (the tree holds a source's block on its tier
                // when, and only when, the block is reachable there).
                blocks.path.clear();
                let from_place = match blocks.places.get(slot) {
                    Some(place) if end <= place.len() => self.cache.place_path(
                        place,
                        end,
                        &page,
                        DeviceId(t as u32),
                        &mut blocks.path,
                    )?,
                    _ => None,
                };
                let reachable = match from_place {
                    Some(held) => held,
                    None => blocks
                        .fill_path(p, st.medium)
                        .ok_or(ApplyError::UnknownParent(p.0))?,
                };
                (seed, reachable)
            }
        };
        let base = blocks.path.len();
        // The first block of the chain not held on the medium before: from
        // there on, blocks held there below the chain's were out of reach.
        let mut first_new = None;
        // Those blocks take the place where the chain ends in the tree.
        let slot = blocks.places.open();
        let mut parent = st.parent;
        for (i, (h, tokens)) in st.hashes.iter().zip(st.tokens.chunks(bs)).enumerate() {
            let local = local_hash::block_hash(tokens, seed);
            match blocks.blocks.get_mut(h) {
                Some(b) => {
                    if b.parent() != parent || b.local != local {
                        blocks.places.close(slot);
                        return Err(ApplyError::Conflict(h.0));
                    }
                    if b.media & bit(st.medium) == 0 {
                        first_new.get_or_insert(i);
                    }
                    if first_new.is_some() {
                        blocks.places.point(b, slot);
                    }
                    b.media |= bit(st.medium);
                }
                None => {
                    first_new.get_or_insert(i);
                    let mut b = Block::new(
                        parent,
                        local,
                        seed,
                        u32::try_from(base / WORDS + i + 1).unwrap_or(u32::MAX),
                        bit(st.medium),
                    );
                    blocks.places.point(&mut b, slot);
                    blocks.blocks.insert(*h, b);
                    if let Some(pb) = parent.and_then(|p| blocks.blocks.get_mut(&p)) {
                        pb.add_child(*h);
                    }
                }
            }
            push_key(&mut blocks.path, local);
            parent = Some(*h);
        }
        let r = if reachable {
            let path = std::mem::take(&mut blocks.path);
            let r = self.insert_path(&path, t).and_then(|place| {
                blocks.places.set(slot, place);
                // Blocks held on this medium below the chain's blocks that
                // were not (children other than the chain's next), out of
                // reach while those were missing there, are reachable again.
                let Some(first) = first_new else {
                    return Ok(());
                };
                for (i, h) in st.hashes.iter().enumerate().skip(first) {
                    let next = st.hashes.get(i + 1);
                    let others = blocks
                        .blocks
                        .get(h)
                        .is_some_and(|b| b.children().any(|c| Some(&c) != next));
                    if others {
                        let mut p = path[..base + (i + 1) * WORDS].to_vec();
                        self.reattach(blocks, *h, next, st.medium, t, &mut p)?;
                    }
                }
                Ok(())
            });
            blocks.path = path;
            r
        } else {
            Ok(())
        };
        // Freed unless a block took it.
        blocks.places.close(slot);
        r?;
        Ok(st.hashes.len() as u64)
    }

    /// Inserts `path` into tier `t`; returns where it ends in the tree.
    fn insert_path(&self, path: &[u32], t: usize) -> Result<Option<TreePlace>, ApplyError> {
        // The values are the index's own, one run (0, 1, 2, ...): the tree
        // stores them in one inline word pair per node and tier.
        let key = TokenKey::new(path);
        let d = DeviceId(t as u32);
        let (_, place) = match shared_values().get(..path.len()) {
            Some(values) => self.cache.insert_placed(key, d, values, 0)?,
            None => {
                let values: Vec<u32> = (0..path.len() as u32).collect();
                self.cache.insert_placed(key, d, &values, 0)?
            }
        };
        Ok(place)
    }

    /// Inserts again the blocks below `h` (but `skip`) that this source
    /// holds on `m` into tier `t` (depth first); `path` ends with `h`'s key
    /// and is restored.
    fn reattach(
        &self,
        blocks: &SourceBlocks,
        h: BlockHash,
        skip: Option<&BlockHash>,
        m: Medium,
        t: usize,
        path: &mut Vec<u32>,
    ) -> Result<(), ApplyError> {
        let Some(kids) = blocks.blocks.get(&h).map(Block::children) else {
            return Ok(());
        };
        for k in kids {
            let Some(b) = blocks.blocks.get(&k) else {
                continue;
            };
            if b.media & bit(m) == 0 || Some(&k) == skip {
                continue;
            }
            push_key(path, b.local);
            self.insert_path(path, t)?;
            self.reattach(blocks, k, None, m, t, path)?;
            path.truncate(path.len() - WORDS);
        }
        Ok(())
    }

    fn remove(
        &self,
        s: Source,
        blocks: &mut SourceBlocks,
        hashes: &[BlockHash],
        m: Medium,
    ) -> Result<u64, ApplyError> {
        let mut n = 0;
        let mut unknown = None;
        let tier = self.existing_tier(s, m);
        // Membership in this removal (a set once a linear search costs more).
        let mut set = std::mem::take(&mut blocks.removing);
        set.clear();
        let long = hashes.len() > 32;
        if long {
            set.extend(hashes.iter().copied());
        }
        let removed_here = |p: &BlockHash| match long {
            true => set.contains(p),
            false => hashes.contains(p),
        };
        for h in hashes {
            let held = blocks.blocks.get(h).filter(|b| b.media & bit(m) != 0);
            let (Some(t), Some(b)) = (tier, held) else {
                unknown.get_or_insert(h.0);
                continue;
            };
            // A block whose parent this removal also takes goes out of the
            // tree with its parent's subtree: already, where the parent
            // came first (SGLang lists a node's blocks from the top), or
            // when it comes (leaves first); and a parent this removal names
            // but the tier did not hold left the block out of reach there
            // already. Otherwise it leaves the tier here. (Asking whether
            // the parent is still held would walk to the root once per
            // block of a top-down removal: its square.)
            let with_parent = b.parent().is_some_and(|p| removed_here(&p));
            if !with_parent {
                if let Err(e) = self.take_out(blocks, *h, m, t) {
                    blocks.removing = set;
                    return Err(e);
                }
            }
            blocks.unhold(*h, m);
            n += 1;
        }
        blocks.removing = set;
        match unknown {
            // The others were removed.
            Some(h) => Err(ApplyError::UnknownBlock(h)),
            None => Ok(n),
        }
    }

    /// Takes block `h` (held on `m`) and the blocks below it out of tier
    /// `t`, from the block's place when it has one still in the tree,
    /// otherwise by its path from the root; the block above it takes the
    /// place the tree gives back (the next removal of a chain taken from
    /// its end climbs from there).
    fn take_out(
        &self,
        blocks: &mut SourceBlocks,
        h: BlockHash,
        m: Medium,
        t: usize,
    ) -> Result<(), ApplyError> {
        let d = DeviceId(t as u32);
        let Some(b) = blocks.blocks.get(&h) else {
            return Ok(());
        };
        let (parent, end) = (b.parent(), b.depth as usize * WORDS);
        let page = key_of(b.local);
        // A block out of reach on the tier (a block above it not held
        // there) has nothing in the tree there: the climb finds its page
        // not resident on the tier and takes nothing, as the walk would.
        let placed = match blocks.places.get(b.place) {
            Some(place) if end <= place.len() => {
                self.cache.evict_from_place(place, end, &page, d)?
            }
            _ => None,
        };
        let above = match placed {
            Some(e) => e.above,
            None => match blocks.fill_path(h, m) {
                Some(true) => {
                    self.cache
                        .evict_from_with_place(TokenKey::new(&blocks.path), d)?
                        .above
                }
                // Out of reach on the tier already when a block above it
                // is not held there: the tree holds nothing of it.
                _ => None,
            },
        };
        if let (Some(p), Some(above)) = (parent, above) {
            if let Some(pb) = blocks.blocks.get_mut(&p) {
                if pb.media != 0 {
                    let slot = blocks.places.open();
                    blocks.places.set(slot, Some(above));
                    blocks.places.point(pb, slot);
                    blocks.places.close(slot);
                }
            }
        }
        Ok(())
    }

    /// Everything source `s` held is gone (`AllBlocksCleared`, a restart,
    /// or the worker left).
    pub fn clear(&self, s: Source) {
        let src = self.source(s);
        let mut blocks = lock(&src);
        self.clear_locked(s, &mut blocks);
    }

    fn clear_locked(&self, s: Source, blocks: &mut SourceBlocks) {
        for m in Medium::ALL {
            if let Some(t) = self.existing_tier(s, m) {
                let _ = self.cache.evict(DeviceId(t as u32), usize::MAX);
            }
        }
        *blocks = SourceBlocks::default();
    }

    /// Removes source `s` (a worker unregistered): clears it and frees its
    /// tiers for others.
    pub fn forget(&self, s: Source) {
        self.clear(s);
        lock(&self.sources).remove(&s);
        let mut t = lock(&self.tiers);
        for m in Medium::ALL {
            if let Some(i) = t.of.remove(&(s, m)) {
                t.by_tier[i] = None;
            }
        }
        self.owners.store(Arc::new(t.by_tier.clone()));
    }

    /// The longest prefix of `tokens` (whole blocks, in namespace
    /// `namespace`: [`TokenKey::namespace_for`] of a LoRA name and a cache
    /// salt) that each (source, medium) holds, for every tier that holds
    /// any; a walk of the tree that takes no lock and writes nothing.
    pub fn scores(&self, tokens: &[u32], namespace: Option<&str>) -> Vec<Score> {
        self.scores_by_hash(&self.block_hashes(tokens, namespace))
    }

    /// The per-block hashes of `tokens`' whole blocks in `namespace`
    /// ([`crate::local_hash`], seeded by the namespace's parts): the blocks
    /// [`KvIndex::scores`] walks, and what [`KvIndex::scores_by_hash`]
    /// takes.
    pub fn block_hashes(&self, tokens: &[u32], namespace: Option<&str>) -> Vec<u64> {
        local_hash::block_hashes(tokens, self.block_size, namespace_seed(namespace))
    }

    /// [`KvIndex::scores`] of the prompt whose blocks have the per-block
    /// hashes `hashes` ([`crate::local_hash`]: what Dynamo's routers send).
    pub fn scores_by_hash(&self, hashes: &[u64]) -> Vec<Score> {
        if cfg!(target_endian = "little") {
            // A hash's two key words, low first, are its bytes in memory.
            self.scores_of_key(bytemuck::cast_slice(hashes))
        } else {
            let mut key = Vec::with_capacity(hashes.len() * WORDS);
            for &h in hashes {
                push_key(&mut key, h);
            }
            self.scores_of_key(&key)
        }
    }

    fn scores_of_key(&self, key: &[u32]) -> Vec<Score> {
        let lens = self.cache.peek(TokenKey::new(key));
        let owners = self.owners.load();
        lens.iter()
            .enumerate()
            .filter(|&(_, &n)| n > 0)
            .filter_map(|(t, &n)| {
                owners
                    .get(t)
                    .copied()
                    .flatten()
                    .map(|(source, medium)| Score {
                        source,
                        medium,
                        tokens: n / WORDS * self.block_size,
                    })
            })
            .collect()
    }

    /// Blocks held, summed over the tiers (a block two tiers hold counts
    /// twice); only blocks a prefix match can reach count: see the module
    /// docs.
    pub fn held_blocks(&self) -> usize {
        (0..self.cache.devices())
            .map(|t| self.cache.resident_tokens(DeviceId(t as u32)).unwrap_or(0) / WORDS)
            .sum()
    }

    /// Nodes of the tree (namespace roots included).
    pub fn tree_nodes(&self) -> u64 {
        self.cache.node_count()
    }

    /// Blocks source `s` knows (held, or leading to held ones).
    pub fn known_blocks(&self, s: Source) -> usize {
        lock(&self.sources).get(&s).map_or(0, |b| lock(b).len())
    }

    /// Blocks visited so far walking from a block of source `s` up to its
    /// root, which a store below a parent and a removal (of a block whose
    /// parent it does not also remove) do once each when the block's
    /// place has left the tree: what an event's depth costs. For tests
    /// and benchmarks.
    pub fn path_steps(&self, s: Source) -> u64 {
        lock(&self.sources)
            .get(&s)
            .map_or(0, |b| lock(b).path_steps)
    }

    /// Checks the tree's invariants (see [`RadixCache::check`]) and each
    /// source's count of the places its blocks share.
    pub fn check(&self) -> Result<(), String> {
        self.cache.check()?;
        let sources: Vec<_> = lock(&self.sources).values().cloned().collect();
        for src in sources {
            let b = lock(&src);
            b.places.check(b.blocks.values())?;
        }
        Ok(())
    }
}
