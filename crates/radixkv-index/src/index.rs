//! [`KvIndex`]: what every worker holds, as its KV events say, in one
//! radixkv tree. Each (worker, data-parallel rank, medium) is a tier of the
//! tree; a prompt's score on a tier is the longest prefix resident there.
//!
//! A worker's events name blocks by hash: a store gives each new block's
//! hash, its parent's hash and its tokens, a removal only hashes. So each
//! (worker, rank), a [`Source`], keeps its blocks by hash ([`SourceBlocks`]:
//! parent, tokens, namespace, the media holding it), from which a block's
//! whole path is read to insert it, or to take it out again
//! ([`radixkv::RadixCache::evict_from`]: a block that leaves a medium takes
//! the blocks continuing it out of reach, as a prefix match on that worker
//! stops there too). A block that a removal left with no medium but whose
//! children are still held stays known (its tokens lead to theirs), and
//! when it is stored again, the children held on that medium are reachable
//! again.
//!
//! Namespaces: a store's `lora_name` and `cache_salt` name the namespace by
//! the core's rule ([`radixkv::TokenKey::namespace_for`]); a block below a
//! parent is in its parent's namespace. SGLang's default event format
//! carries neither its `extra_key` nor, for requests without a named LoRA
//! adapter, anything that tells its namespaces apart: their blocks share a
//! namespace here, as the events allow.
//!
//! Events of different sources are applied concurrently (the core's
//! writers; each source's own under its lock, in order); queries run on any
//! thread and never wait.

use crate::contents::Contents;
use crate::decode::{BlockHash, Event, Medium, Stored};
use crate::local_hash;
use radixkv::{CacheError, DeviceId, RadixCache, TokenKey};
use std::collections::HashMap;
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
    /// A block hash stored again with other tokens or under another parent.
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

/// One block a source holds.
#[derive(Debug)]
struct Block {
    parent: Option<BlockHash>,
    /// Shared with every block of the same tokens ([`Contents`]).
    tokens: Arc<[u32]>,
    namespace: Option<Arc<str>>,
    /// Its per-block hash ([`crate::local_hash`]) and that hash's seed.
    local: u64,
    seed: u64,
    /// The media holding it, a bit each ([`Medium`] order).
    media: u8,
    /// Blocks stored below it (any medium).
    children: u32,
}

fn bit(m: Medium) -> u8 {
    1 << (m as u8)
}

/// The blocks of one source, by hash.
#[derive(Debug, Default)]
pub struct SourceBlocks {
    blocks: HashMap<BlockHash, Block>,
    /// Blocks by parent (for the ones to reach again when a parent
    /// returns).
    below: HashMap<BlockHash, Vec<BlockHash>>,
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

    /// Whether block `h` and every block above it are held on `m` (so the
    /// tree has it resident on that tier).
    fn reachable_on(&self, h: BlockHash, m: Medium) -> bool {
        let mut cur = Some(h);
        let mut steps = 0;
        while let Some(c) = cur {
            let Some(b) = self.blocks.get(&c) else {
                return false;
            };
            if b.media & bit(m) == 0 || steps > self.blocks.len() {
                return false;
            }
            cur = b.parent;
            steps += 1;
        }
        true
    }

    /// The namespace and tokens from the root through block `h`.
    fn path(&self, h: BlockHash) -> Option<(Option<Arc<str>>, Vec<u32>)> {
        let mut chain = Vec::new();
        let mut cur = Some(h);
        while let Some(c) = cur {
            let b = self.blocks.get(&c)?;
            chain.push(c);
            cur = b.parent;
            if chain.len() > self.blocks.len() {
                return None; // a cycle of hashes: not a path
            }
        }
        let ns = self.blocks.get(chain.last()?)?.namespace.clone();
        let mut tokens = Vec::with_capacity(chain.len() * self.blocks[&h].tokens.len());
        for c in chain.iter().rev() {
            tokens.extend_from_slice(&self.blocks[c].tokens);
        }
        Some((ns, tokens))
    }

    /// Forgets `h` if it is held nowhere and leads to nothing; then its
    /// parent, likewise.
    fn prune(&mut self, contents: &Contents, mut h: BlockHash) {
        loop {
            let Some(b) = self.blocks.get(&h) else { return };
            if b.media != 0 || b.children != 0 {
                return;
            }
            let parent = b.parent;
            if let Some(b) = self.blocks.remove(&h) {
                contents.release(b.local, &b.tokens);
            }
            let Some(p) = parent else { return };
            if let Some(v) = self.below.get_mut(&p) {
                v.retain(|&c| c != h);
                if v.is_empty() {
                    self.below.remove(&p);
                }
            }
            if let Some(pb) = self.blocks.get_mut(&p) {
                pb.children = pb.children.saturating_sub(1);
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
    sources: Mutex<HashMap<Source, Arc<Mutex<SourceBlocks>>>>,
    contents: Contents,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl KvIndex {
    /// An empty index of blocks of `block_size` tokens with room for
    /// `max_tiers` (worker, rank, medium) tiers (at most
    /// [`radixkv::cache::MAX_DEVICES`]).
    pub fn new(block_size: usize, max_tiers: usize) -> Result<KvIndex, CacheError> {
        let cache = RadixCache::builder()
            .page_size(block_size)
            .devices(max_tiers)
            .build()?;
        Ok(KvIndex {
            block_size,
            cache,
            tiers: Mutex::new(Tiers {
                of: HashMap::new(),
                by_tier: vec![None; max_tiers],
            }),
            sources: Mutex::new(HashMap::new()),
            contents: Contents::default(),
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
        let reachable = st.parent.is_none_or(|p| blocks.reachable_on(p, st.medium));
        let (ns, seed, mut path) = match st.parent {
            None => (
                radixkv::TokenKey::namespace_for(st.lora_name.as_deref(), st.cache_salt.as_deref())
                    .map(Arc::from),
                local_hash::seed(st.lora_name.as_deref(), st.cache_salt.as_deref()),
                Vec::new(),
            ),
            Some(p) => {
                let (ns, path) = blocks.path(p).ok_or(ApplyError::UnknownParent(p.0))?;
                (ns, blocks.blocks[&p].seed, path)
            }
        };
        let mut parent = st.parent;
        for (h, tokens) in st.hashes.iter().zip(st.tokens.chunks(bs)) {
            match blocks.blocks.get_mut(h) {
                Some(b) => {
                    if b.parent != parent || *b.tokens != *tokens {
                        return Err(ApplyError::Conflict(h.0));
                    }
                    b.media |= bit(st.medium);
                }
                None => {
                    let local = local_hash::block_hash(tokens, seed);
                    blocks.blocks.insert(
                        *h,
                        Block {
                            parent,
                            tokens: self.contents.hold(local, tokens, &ns),
                            namespace: ns.clone(),
                            local,
                            seed,
                            media: bit(st.medium),
                            children: 0,
                        },
                    );
                    if let Some(p) = parent {
                        if let Some(pb) = blocks.blocks.get_mut(&p) {
                            pb.children += 1;
                        }
                        blocks.below.entry(p).or_default().push(*h);
                    }
                }
            }
            path.extend_from_slice(tokens);
            parent = Some(*h);
        }
        if reachable {
            self.insert_path(ns.as_deref(), &path, t)?;
            // Blocks held on this medium below the last one, out of reach
            // while it was missing there, are reachable again.
            if let Some(last) = st.hashes.last() {
                self.reattach(blocks, *last, st.medium, t, ns.as_deref(), &mut path)?;
            }
        }
        Ok(st.hashes.len() as u64)
    }

    fn insert_path(&self, ns: Option<&str>, path: &[u32], t: usize) -> Result<(), ApplyError> {
        // The values are the index's own, one run: the tree stores them in
        // one inline word pair per node and tier.
        let values: Vec<u32> = (0..path.len() as u32).collect();
        self.cache.insert(
            TokenKey::new(path).in_namespace(ns),
            DeviceId(t as u32),
            &values,
            0,
        )?;
        Ok(())
    }

    /// Inserts again the blocks below `h` that this source holds on `m`
    /// (depth first); `path` ends with `h`'s tokens and is restored.
    fn reattach(
        &self,
        blocks: &SourceBlocks,
        h: BlockHash,
        m: Medium,
        t: usize,
        ns: Option<&str>,
        path: &mut Vec<u32>,
    ) -> Result<(), ApplyError> {
        let Some(kids) = blocks.below.get(&h) else {
            return Ok(());
        };
        for k in kids {
            let Some(b) = blocks.blocks.get(k) else {
                continue;
            };
            if b.media & bit(m) == 0 {
                continue;
            }
            path.extend_from_slice(&b.tokens);
            self.insert_path(ns, path, t)?;
            self.reattach(blocks, *k, m, t, ns, path)?;
            path.truncate(path.len() - b.tokens.len());
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
        for h in hashes {
            let held = blocks.blocks.get(h).is_some_and(|b| b.media & bit(m) != 0);
            let (Some(t), true) = (tier, held) else {
                unknown.get_or_insert(h.0);
                continue;
            };
            if let Some((ns, path)) = blocks.path(*h) {
                self.cache.evict_from(
                    TokenKey::new(&path).in_namespace(ns.as_deref()),
                    DeviceId(t as u32),
                )?;
            }
            if let Some(b) = blocks.blocks.get_mut(h) {
                b.media &= !bit(m);
            }
            blocks.prune(&self.contents, *h);
            n += 1;
        }
        match unknown {
            // The others were removed.
            Some(h) => Err(ApplyError::UnknownBlock(h)),
            None => Ok(n),
        }
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
        for b in std::mem::take(blocks).blocks.into_values() {
            self.contents.release(b.local, &b.tokens);
        }
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
    }

    /// The longest prefix of `tokens` (whole blocks, in namespace
    /// `namespace`) that each (source, medium) holds, for every tier that
    /// holds any; a walk of the tree that takes no lock and writes nothing.
    pub fn scores(&self, tokens: &[u32], namespace: Option<&str>) -> Vec<Score> {
        let whole = &tokens[..tokens.len() / self.block_size * self.block_size];
        let lens = self
            .cache
            .peek(TokenKey::new(whole).in_namespace(namespace));
        let tiers = lock(&self.tiers);
        lens.iter()
            .enumerate()
            .filter(|&(_, &n)| n > 0)
            .filter_map(|(t, &n)| {
                tiers
                    .by_tier
                    .get(t)
                    .copied()
                    .flatten()
                    .map(|(source, medium)| Score {
                        source,
                        medium,
                        tokens: n,
                    })
            })
            .collect()
    }

    /// [`KvIndex::scores`] of the prompt whose blocks have the per-block
    /// hashes `hashes` ([`crate::local_hash`]: what Dynamo's routers send),
    /// read back into tokens up to the first hash no source holds (or one
    /// of another namespace than the first's).
    pub fn scores_by_hash(&self, hashes: &[u64]) -> Vec<Score> {
        let mut tokens = Vec::with_capacity(hashes.len() * self.block_size);
        let mut namespace = None;
        for (i, h) in hashes.iter().enumerate() {
            let Some(c) = self.contents.get(*h) else {
                break;
            };
            if i == 0 {
                namespace = c.namespace;
            } else if c.namespace != namespace {
                break;
            }
            tokens.extend_from_slice(&c.tokens);
        }
        self.scores(&tokens, namespace.as_deref())
    }

    /// Distinct blocks (by tokens and namespace) the sources hold.
    pub fn distinct_blocks(&self) -> usize {
        self.contents.len()
    }

    /// Blocks source `s` knows (held, or leading to held ones).
    pub fn known_blocks(&self, s: Source) -> usize {
        lock(&self.sources).get(&s).map_or(0, |b| lock(b).len())
    }

    /// Checks the tree's invariants (see [`RadixCache::check`]).
    pub fn check(&self) -> Result<(), String> {
        self.cache.check()
    }
}
