//! The payload: vLLM's KV-event batch in msgpack, and radixkv's block ids.
//!
//! A batch is `[ts, events, data_parallel_rank]`. Events are encoded as
//! maps with a `"type"` key (current vLLM, [`Encoding::Map`], the default)
//! or as arrays `[tag, field…]` in declaration order (older vLLM,
//! [`Encoding::Array`]):
//!
//! | event | map fields / array order |
//! | --- | --- |
//! | `BlockStored` | `block_hashes`, `parent_block_hash`, `token_ids`, `block_size`, `lora_id` (nil), `medium`, `lora_name`, `extra_keys`; maps add `cache_salt` |
//! | `BlockRemoved` | `block_hashes`, `medium` |
//! | `AllBlocksCleared` | none |
//!
//! In the array form a cache salt travels as Dynamo's tagged first-block
//! extra key (`"dynamo-cache-salt:<salt>"`), the only place that form has
//! for it; in the map form it is the `cache_salt` field and `extra_keys` is
//! nil.
//!
//! # Block ids
//!
//! [`block_ids`]: one 63-bit id per full page, chained: page `i`'s id is
//! xxh3-64 of its tokens (little-endian `u32`s) seeded with page `i - 1`'s
//! id, page 0's seeded with the namespace's own hash (0 without one). So
//! the same prefix in the same namespace always gets the same ids (after
//! an eviction and a re-store too), and two namespaces never share them.
//! Ids are below 2^63, so consumers that read them as signed 64-bit
//! integers (Dynamo documents them so) and unsigned ones agree.
//!
//! # Namespaces
//!
//! A radixkv namespace ([`radixkv::TokenKey::in_namespace`]) is published
//! as a cache salt, except one made by
//! [`radixkv::TokenKey::namespace_for`] with a LoRA name,
//! which is published as `lora_name` (and its salt, if any, as the salt):
//! [`radixkv::TokenKey::namespace_parts`] splits it back.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// How events inside a batch are encoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Encoding {
    /// Maps with a `"type"` key (current vLLM; the default).
    #[default]
    Map,
    /// Arrays `[tag, field…]` (vLLM's older `array_like` structs).
    Array,
}

impl Encoding {
    /// Every encoding.
    pub const ALL: [Encoding; 2] = [Encoding::Map, Encoding::Array];

    /// Its name on the command line: `map` or `array`.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Map => "map",
            Encoding::Array => "array",
        }
    }
}

impl std::str::FromStr for Encoding {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Encoding::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| format!("unknown KV-event encoding {s:?} (map or array)"))
    }
}

/// Where blocks live, as vLLM's `medium` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Medium {
    /// A device (GPU) pool.
    Gpu,
    /// The host tier (CPU memory), shared by every device.
    Cpu,
}

impl Medium {
    /// `"GPU"` or `"CPU"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Medium::Gpu => "GPU",
            Medium::Cpu => "CPU",
        }
    }
}

/// One KV event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Full blocks became resident.
    BlockStored {
        /// One id per block, in prefix order.
        block_hashes: Vec<u64>,
        /// The id of the block before the first one (`None` at the root).
        parent_block_hash: Option<u64>,
        /// The tokens of all the blocks, concatenated.
        token_ids: Vec<u32>,
        /// Tokens per block (the cache's page size).
        block_size: usize,
        /// Where they live.
        medium: Medium,
        /// The LoRA adapter, if the namespace names one.
        lora_name: Option<String>,
        /// The cache salt, if any.
        cache_salt: Option<String>,
    },
    /// Blocks left.
    BlockRemoved {
        /// Their ids.
        block_hashes: Vec<u64>,
        /// Where they were.
        medium: Medium,
    },
    /// Everything this socket reported is gone (sent first after a start).
    AllBlocksCleared,
}

/// Dynamo's tag for a salt carried in `extra_keys` (the array form).
const DYNAMO_SALT_TAG: &str = "dynamo-cache-salt:";

/// The seed of a namespace's chain (0 without one).
fn namespace_seed(ns: Option<&str>) -> u64 {
    ns.map_or(0, |n| {
        xxh3_64_with_seed(n.as_bytes(), 0x0072_6164_6978_6b76)
    }) & ID_MASK
}

const ID_MASK: u64 = (1 << 63) - 1;

/// The id of one page after a parent id (or a namespace seed).
fn next_id(parent: u64, page: &[u32]) -> u64 {
    let mut bytes = [0u8; 256];
    let id = if page.len() * 4 <= bytes.len() {
        for (i, t) in page.iter().enumerate() {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&t.to_le_bytes());
        }
        xxh3_64_with_seed(&bytes[..page.len() * 4], parent)
    } else {
        let v: Vec<u8> = page.iter().flat_map(|t| t.to_le_bytes()).collect();
        xxh3_64_with_seed(&v, parent)
    };
    id & ID_MASK
}

/// The chained ids of every full page of `path` (tokens from the
/// namespace's root) in namespace `ns`.
///
/// ```
/// use radixkv_events::wire::block_ids;
/// let a = block_ids(None, &[1, 2, 3, 4], 2);
/// assert_eq!(a.len(), 2);
/// assert_eq!(block_ids(None, &[1, 2, 9, 9], 2)[0], a[0]); // same first page
/// assert_ne!(block_ids(None, &[1, 2, 9, 9], 2)[1], a[1]);
/// assert_ne!(block_ids(Some("t"), &[1, 2, 3, 4], 2)[0], a[0]); // another namespace
/// assert_ne!(block_ids(None, &[3, 4, 1, 2], 2)[1], a[0]); // chained, not per page
/// ```
pub fn block_ids(ns: Option<&str>, path: &[u32], page_size: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity(path.len() / page_size.max(1));
    chain_ids_into(None, ns, path, page_size, &mut out);
    out
}

/// The ids of the full pages of `pages`, chained from `before` (the id of
/// the page before them; `None`: they start the path, chained from the
/// namespace's seed), into `out` (cleared first).
///
/// ```
/// use radixkv_events::wire::{block_ids, chain_ids_into};
/// let ids = block_ids(Some("t"), &[1, 2, 3, 4, 5, 6], 2);
/// let mut out = Vec::new();
/// chain_ids_into(Some(ids[0]), Some("t"), &[3, 4, 5, 6], 2, &mut out);
/// assert_eq!(out, &ids[1..]);
/// chain_ids_into(None, Some("t"), &[1, 2], 2, &mut out);
/// assert_eq!(out, &ids[..1]);
/// ```
pub fn chain_ids_into(
    before: Option<u64>,
    ns: Option<&str>,
    pages: &[u32],
    page_size: usize,
    out: &mut Vec<u64>,
) {
    out.clear();
    let mut id = before.unwrap_or_else(|| namespace_seed(ns));
    out.extend(pages.chunks_exact(page_size.max(1)).map(|page| {
        id = next_id(id, page);
        id
    }));
}

type Buf = Vec<u8>;

// Writes to a Vec cannot fail: the helpers below unwrap nothing.
fn w_str(b: &mut Buf, s: &str) {
    let _ = rmp::encode::write_str(b, s);
}
/// msgpack's shortest unsigned encoding (what `rmp::encode::write_uint`
/// writes), written straight into the buffer: token lists are most of a
/// payload, and going through `io::Write` a byte at a time was the
/// publisher's largest cost.
#[inline]
fn w_uint(b: &mut Buf, v: u64) {
    if v < 0x80 {
        b.push(v as u8);
    } else if v <= u64::from(u8::MAX) {
        b.extend_from_slice(&[0xcc, v as u8]);
    } else if v <= u64::from(u16::MAX) {
        b.push(0xcd);
        b.extend_from_slice(&(v as u16).to_be_bytes());
    } else if v <= u64::from(u32::MAX) {
        b.push(0xce);
        b.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        b.push(0xcf);
        b.extend_from_slice(&v.to_be_bytes());
    }
}
fn w_array(b: &mut Buf, n: usize) {
    let _ = rmp::encode::write_array_len(b, n as u32);
}
fn w_map(b: &mut Buf, n: usize) {
    let _ = rmp::encode::write_map_len(b, n as u32);
}
fn w_nil(b: &mut Buf) {
    let _ = rmp::encode::write_nil(b);
}
fn w_ids(b: &mut Buf, ids: &[u64]) {
    w_array(b, ids.len());
    for &i in ids {
        w_uint(b, i);
    }
}
fn w_tokens(b: &mut Buf, t: &[u32]) {
    w_array(b, t.len());
    b.reserve(t.len() * 5);
    for &x in t {
        w_uint(b, u64::from(x));
    }
}
fn w_opt_uint(b: &mut Buf, v: Option<u64>) {
    match v {
        Some(v) => w_uint(b, v),
        None => w_nil(b),
    }
}
fn w_opt_str(b: &mut Buf, s: Option<&str>) {
    match s {
        Some(s) => w_str(b, s),
        None => w_nil(b),
    }
}

/// An event borrowing its data, for encoding without copies
/// ([`BatchEncoder`]); [`KvEvent::as_ref`] makes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventRef<'a> {
    /// See [`KvEvent::BlockStored`].
    BlockStored {
        /// One id per block.
        block_hashes: &'a [u64],
        /// The id of the block before the first one.
        parent_block_hash: Option<u64>,
        /// The blocks' tokens.
        token_ids: &'a [u32],
        /// Tokens per block.
        block_size: usize,
        /// Where they live.
        medium: Medium,
        /// The LoRA adapter.
        lora_name: Option<&'a str>,
        /// The cache salt.
        cache_salt: Option<&'a str>,
    },
    /// See [`KvEvent::BlockRemoved`].
    BlockRemoved {
        /// Their ids.
        block_hashes: &'a [u64],
        /// Where they were.
        medium: Medium,
    },
    /// See [`KvEvent::AllBlocksCleared`].
    AllBlocksCleared,
}

impl KvEvent {
    /// The event, borrowed.
    pub fn as_ref(&self) -> EventRef<'_> {
        match self {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                medium,
                lora_name,
                cache_salt,
            } => EventRef::BlockStored {
                block_hashes,
                parent_block_hash: *parent_block_hash,
                token_ids,
                block_size: *block_size,
                medium: *medium,
                lora_name: lora_name.as_deref(),
                cache_salt: cache_salt.as_deref(),
            },
            KvEvent::BlockRemoved {
                block_hashes,
                medium,
            } => EventRef::BlockRemoved {
                block_hashes,
                medium: *medium,
            },
            KvEvent::AllBlocksCleared => EventRef::AllBlocksCleared,
        }
    }
}

impl EventRef<'_> {
    fn encode(&self, b: &mut Buf, enc: Encoding) {
        let map = enc == Encoding::Map;
        // Map: each value after its key; array: the values in declaration
        // order. Both start with the tag (a map's under "type").
        let key = |b: &mut Buf, k: &str| {
            if map {
                w_str(b, k);
            }
        };
        let open = |b: &mut Buf, fields: usize, tag: &str| {
            if map {
                w_map(b, fields);
                w_str(b, "type");
            } else {
                w_array(b, fields);
            }
            w_str(b, tag);
        };
        match *self {
            EventRef::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                medium,
                lora_name,
                cache_salt,
            } => {
                let fields = if map {
                    9 + usize::from(cache_salt.is_some())
                } else {
                    9
                };
                open(b, fields, "BlockStored");
                key(b, "block_hashes");
                w_ids(b, block_hashes);
                key(b, "parent_block_hash");
                w_opt_uint(b, parent_block_hash);
                key(b, "token_ids");
                w_tokens(b, token_ids);
                key(b, "block_size");
                w_uint(b, block_size as u64);
                key(b, "lora_id");
                w_nil(b);
                key(b, "medium");
                w_str(b, medium.as_str());
                key(b, "lora_name");
                w_opt_str(b, lora_name);
                key(b, "extra_keys");
                match cache_salt {
                    Some(s) if map => {
                        w_nil(b);
                        w_str(b, "cache_salt");
                        w_str(b, s);
                    }
                    // extra_keys, one entry per block: the salt, tagged, in
                    // the first block's (the array form's only place for it).
                    Some(s) => {
                        w_array(b, block_hashes.len());
                        w_array(b, 1);
                        w_str(b, &format!("{DYNAMO_SALT_TAG}{s}"));
                        for _ in 1..block_hashes.len() {
                            w_nil(b);
                        }
                    }
                    None => w_nil(b),
                }
            }
            EventRef::BlockRemoved {
                block_hashes,
                medium,
            } => {
                open(b, 3, "BlockRemoved");
                key(b, "block_hashes");
                w_ids(b, block_hashes);
                key(b, "medium");
                w_str(b, medium.as_str());
            }
            EventRef::AllBlocksCleared => open(b, 1, "AllBlocksCleared"),
        }
    }
}

/// Encodes a batch `[ts, events, rank]` (`ts` in seconds since the epoch).
///
/// ```
/// use radixkv_events::wire::{encode_batch, Encoding, KvEvent};
/// let b = encode_batch(1.5, &[KvEvent::AllBlocksCleared], Some(0), Encoding::Map);
/// // fixarray(3), float64 1.5, fixarray(1), fixmap(1) "type" "AllBlocksCleared", 0
/// assert_eq!(b[0], 0x93);
/// assert_eq!(b[1], 0xcb);
/// assert_eq!(*b.last().unwrap(), 0x00);
/// ```
///
/// Unsigned integers take msgpack's shortest form, as `rmp` writes them:
///
/// ```
/// use radixkv_events::wire::{encode_batch, Encoding, KvEvent, Medium};
/// for id in [0u64, 127, 128, 255, 256, 65_535, 65_536, u32::MAX as u64, 1 << 40] {
///     let e = KvEvent::BlockRemoved { block_hashes: vec![id], medium: Medium::Gpu };
///     let b = encode_batch(0.0, &[e], None, Encoding::Array);
///     let v = rmpv::decode::read_value(&mut &b[..]).unwrap();
///     assert_eq!(v[1][0][1][0].as_u64(), Some(id));
///     let mut want = Vec::new();
///     rmp::encode::write_uint(&mut want, id).unwrap();
///     assert!(b.windows(want.len()).any(|w| w == want.as_slice()));
/// }
/// ```
pub fn encode_batch(ts: f64, events: &[KvEvent], rank: Option<u32>, enc: Encoding) -> Vec<u8> {
    let mut b = BatchEncoder::with_capacity(ts, enc, 64 + events.len() * 64);
    for e in events {
        b.push(e.as_ref());
    }
    b.finish(rank)
}

/// Encodes a batch event by event, from borrowed data: `new`, one
/// [`push`](Self::push) per event, then [`finish`](Self::finish), which
/// writes the count (events are encoded into a body of their own, so the
/// count need not be known beforehand).
///
/// ```
/// use radixkv_events::wire::{encode_batch, BatchEncoder, Encoding, EventRef, KvEvent};
/// let mut b = BatchEncoder::new(2.0, Encoding::Array);
/// b.push(EventRef::BlockRemoved { block_hashes: &[7], medium: radixkv_events::Medium::Gpu });
/// assert_eq!(b.len(), 1);
/// let owned = KvEvent::BlockRemoved { block_hashes: vec![7], medium: radixkv_events::Medium::Gpu };
/// assert_eq!(b.finish(None), encode_batch(2.0, &[owned], None, Encoding::Array));
/// ```
#[derive(Debug)]
pub struct BatchEncoder {
    ts: f64,
    body: Buf,
    enc: Encoding,
    events: usize,
}

impl BatchEncoder {
    /// An empty batch stamped `ts`.
    pub fn new(ts: f64, enc: Encoding) -> Self {
        Self::with_capacity(ts, enc, 256)
    }

    /// As [`new`](Self::new), with room for `bytes` bytes of events.
    pub fn with_capacity(ts: f64, enc: Encoding, bytes: usize) -> Self {
        BatchEncoder {
            ts,
            body: Vec::with_capacity(bytes),
            enc,
            events: 0,
        }
    }

    /// Appends one event.
    pub fn push(&mut self, e: EventRef<'_>) {
        self.events += 1;
        e.encode(&mut self.body, self.enc);
    }

    /// How many events were pushed.
    pub fn len(&self) -> usize {
        self.events
    }

    /// Whether no event was pushed.
    pub fn is_empty(&self) -> bool {
        self.events == 0
    }

    /// The payload: `[ts, [events...], rank]`.
    pub fn finish(self, rank: Option<u32>) -> Vec<u8> {
        let mut buf = Vec::with_capacity(self.body.len() + 32);
        w_array(&mut buf, 3);
        let _ = rmp::encode::write_f64(&mut buf, self.ts);
        w_array(&mut buf, self.events);
        buf.extend_from_slice(&self.body);
        w_opt_uint(&mut buf, rank.map(u64::from));
        buf
    }
}
