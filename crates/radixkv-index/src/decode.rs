//! KV-event batches as the engines publish them, decoded from the msgpack
//! payload of a ZeroMQ message's third frame into a [`Batch`].
//!
//! | producer | batch | events | block hashes |
//! | --- | --- | --- | --- |
//! | vLLM up to v0.23 | `[ts, events, data_parallel_rank]` | arrays `["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium, lora_name, …]` (trailing fields vary by version) | `u64`, or bytes with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0` |
//! | vLLM since #42892 | the same array, or a map `{ts, events, data_parallel_rank}` | maps tagged by `type`, with `extra_keys` | as above |
//! | SGLang 0.5.23 | `[ts, events, attn_dp_rank]` | maps tagged by `type`, `None` fields left out, `cache_salt`, `session_id` | signed `i64` |
//! | radixkv | `[ts, events, rank]` | maps or arrays (`--kv-events-encoding`) | `u64` below 2⁶³ |
//!
//! A hash is kept as the 64 bits it names ([`BlockHash`]): an `i64` and
//! the `u64` with the same bits are the same block, and a bytes hash is
//! reduced to 64 bits by xxh3. A `medium` is read as Dynamo reads it:
//! none or `GPU` is a device, `CPU` or `CPU_PINNED` the host, `DISK` (any
//! case) a disk, `EXTERNAL` a shared pool; any other is an error of that
//! event.
//!
//! A batch that is not msgpack, or not a batch, is a [`DecodeError`]; an
//! event that cannot be read (an unknown type, a missing field, a token id
//! past `u32`) is skipped and reported in [`Batch::skipped`], and the rest
//! of the batch stands.

use crate::msgpack::{Item, Malformed, Reader};
use xxhash_rust::xxh3::xxh3_64;

/// A block's hash as its producer named it: the 64 bits of a `u64` or an
/// `i64` (SGLang's), or xxh3-64 of a bytes hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u64);

/// Where a producer says its blocks live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Medium {
    /// A device (GPU) pool: `GPU`, or no `medium` at all.
    Gpu,
    /// Host memory: `CPU` (vLLM, radixkv) or `CPU_PINNED` (SGLang).
    Cpu,
    /// Local disk: `DISK` (SGLang) or `Disk` (vLLM).
    Disk,
    /// A shared or remote pool: `EXTERNAL` (SGLang).
    External,
}

impl Medium {
    /// Every medium, device first.
    pub const ALL: [Medium; 4] = [Medium::Gpu, Medium::Cpu, Medium::Disk, Medium::External];

    /// The medium a producer's string names (`None`: a device).
    pub fn parse(s: Option<&str>) -> Result<Medium, String> {
        match s {
            None => Ok(Medium::Gpu),
            Some("GPU") => Ok(Medium::Gpu),
            Some("CPU" | "CPU_PINNED") => Ok(Medium::Cpu),
            Some(d) if d.eq_ignore_ascii_case("disk") => Ok(Medium::Disk),
            Some("EXTERNAL") => Ok(Medium::External),
            Some(other) => Err(format!("unknown medium {other:?}")),
        }
    }

    /// Its name in the index's answers (Dynamo's lowercase tiers).
    pub fn name(self) -> &'static str {
        match self {
            Medium::Gpu => "gpu",
            Medium::Cpu => "cpu",
            Medium::Disk => "disk",
            Medium::External => "external",
        }
    }
}

/// Blocks that became resident.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// One hash per block, in prefix order.
    pub hashes: Vec<BlockHash>,
    /// The block before the first one (`None`: they start a path).
    pub parent: Option<BlockHash>,
    /// The tokens of every block, concatenated.
    pub tokens: Vec<u32>,
    /// Tokens per block.
    pub block_size: usize,
    /// Where they live.
    pub medium: Medium,
    /// The LoRA adapter named, if any (`lora_name`).
    pub lora_name: Option<String>,
    /// The cache salt, if any: SGLang's `cache_salt`, or the salt Dynamo
    /// tags into vLLM's `extra_keys` (`dynamo-cache-salt:`).
    pub cache_salt: Option<String>,
}

/// One event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// `BlockStored`.
    Stored(Stored),
    /// `BlockRemoved`: these blocks left `medium`.
    Removed {
        /// Their hashes.
        hashes: Vec<BlockHash>,
        /// Where they were.
        medium: Medium,
    },
    /// `AllBlocksCleared`: everything the publisher reported is gone.
    Cleared,
}

/// One decoded batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Seconds since the epoch, as the producer stamped it.
    pub ts: f64,
    /// The events it could read, in order.
    pub events: Vec<Event>,
    /// The data-parallel (or attention-DP) rank in the batch, if any.
    pub rank: Option<u32>,
    /// The events it could not read: (their index, why).
    pub skipped: Vec<(usize, String)>,
}

/// Why a payload is not a batch.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not msgpack (or cut short).
    #[error("not msgpack: {0}")]
    Msgpack(String),
    /// Msgpack, but not `[ts, events, rank]` (or its map form).
    #[error("not a KV-event batch: {0}")]
    NotABatch(String),
}

/// The salt Dynamo tags into `extra_keys` (the array form's place for it).
const DYNAMO_SALT_TAG: &str = "dynamo-cache-salt:";

/// Decodes one batch.
///
/// ```
/// use radixkv_index::decode::{decode_batch, BlockHash, Event, Medium};
/// // SGLang's BlockStored: a map, a signed hash, `medium` and the lora
/// // fields left out.
/// let mut p = Vec::new();
/// rmp::encode::write_array_len(&mut p, 3).unwrap();
/// rmp::encode::write_f64(&mut p, 1.0).unwrap();
/// rmp::encode::write_array_len(&mut p, 1).unwrap();
/// rmp::encode::write_map_len(&mut p, 5).unwrap();
/// for (k, v) in [("type", "BlockStored")] {
///     rmp::encode::write_str(&mut p, k).unwrap();
///     rmp::encode::write_str(&mut p, v).unwrap();
/// }
/// rmp::encode::write_str(&mut p, "block_hashes").unwrap();
/// rmp::encode::write_array_len(&mut p, 1).unwrap();
/// rmp::encode::write_sint(&mut p, -5).unwrap();
/// rmp::encode::write_str(&mut p, "parent_block_hash").unwrap();
/// rmp::encode::write_nil(&mut p).unwrap();
/// rmp::encode::write_str(&mut p, "token_ids").unwrap();
/// rmp::encode::write_array_len(&mut p, 2).unwrap();
/// rmp::encode::write_uint(&mut p, 7).unwrap();
/// rmp::encode::write_uint(&mut p, 8).unwrap();
/// rmp::encode::write_str(&mut p, "block_size").unwrap();
/// rmp::encode::write_uint(&mut p, 2).unwrap();
/// rmp::encode::write_uint(&mut p, 1).unwrap(); // attn_dp_rank
/// let b = decode_batch(&p).unwrap();
/// assert_eq!(b.rank, Some(1));
/// let Event::Stored(s) = &b.events[0] else { panic!() };
/// assert_eq!(s.hashes, [BlockHash(-5i64 as u64)]);
/// assert_eq!((s.tokens.as_slice(), s.block_size, s.medium), (&[7, 8][..], 2, Medium::Gpu));
/// ```
pub fn decode_batch(payload: &[u8]) -> Result<Batch, DecodeError> {
    let mut r = Reader::new(payload);
    let batch = batch(&mut r)?;
    if r.left() > 0 {
        return Err(DecodeError::Msgpack(format!(
            "{} bytes after the batch",
            r.left()
        )));
    }
    Ok(batch)
}

impl From<Malformed> for DecodeError {
    fn from(m: Malformed) -> DecodeError {
        DecodeError::Msgpack(m.0)
    }
}

fn not_a_batch(why: &str) -> DecodeError {
    DecodeError::NotABatch(why.to_string())
}

/// A batch: `[ts, events]`, `[ts, events, rank]` or its map form.
fn batch(r: &mut Reader<'_>) -> Result<Batch, DecodeError> {
    let mut out = Batch {
        ts: 0.0,
        events: Vec::new(),
        rank: None,
        skipped: Vec::new(),
    };
    match r.item()? {
        Item::Array(n @ (2 | 3)) => {
            out.ts = ts(r.item()?)?;
            events(r, &mut out)?;
            if n == 3 {
                out.rank = rank(r.item()?)?;
            }
        }
        Item::Map(n) => {
            let (mut seen_ts, mut seen_events, mut seen_rank) = (false, false, false);
            let mut attn_rank = None;
            for _ in 0..n {
                let key = r.item()?;
                match key.as_str() {
                    Some("ts") if !seen_ts => {
                        seen_ts = true;
                        out.ts = ts(r.item()?)?;
                    }
                    Some("events") if !seen_events => {
                        seen_events = true;
                        events(r, &mut out)?;
                    }
                    Some("data_parallel_rank") if !seen_rank => {
                        seen_rank = true;
                        out.rank = rank(r.item()?)?;
                    }
                    Some("attn_dp_rank") if attn_rank.is_none() => {
                        attn_rank = Some(rank(r.item()?)?);
                    }
                    _ => {
                        r.skip_rest(key)?;
                        r.skip()?;
                    }
                }
            }
            if !seen_ts {
                return Err(not_a_batch("a map without `ts`"));
            }
            if !seen_events {
                return Err(not_a_batch("a map without `events`"));
            }
            if !seen_rank {
                out.rank = attn_rank.flatten();
            }
        }
        other => return Err(not_a_batch(&format!("{} at the top", other.kind()))),
    }
    Ok(out)
}

fn ts(v: Item<'_>) -> Result<f64, DecodeError> {
    match v {
        Item::Float(f) => Ok(f),
        Item::Int(i) => Ok(i as f64),
        Item::Uint(u) => Ok(u as f64),
        _ => Err(not_a_batch("`ts` is not a number")),
    }
}

fn rank(v: Item<'_>) -> Result<Option<u32>, DecodeError> {
    match v {
        Item::Nil => Ok(None),
        Item::Uint(r) if u32::try_from(r).is_ok() => Ok(Some(r as u32)),
        _ => Err(not_a_batch("the rank is not a rank")),
    }
}

/// The list of events, each read, or skipped with why.
fn events(r: &mut Reader<'_>, out: &mut Batch) -> Result<(), DecodeError> {
    let Item::Array(n) = r.item()? else {
        return Err(not_a_batch("`events` is not a list"));
    };
    out.events.reserve(n.min(r.left()));
    for i in 0..n {
        let start = r.pos();
        match event(r)? {
            Ok(e) => out.events.push(e),
            Err(why) => {
                // Passed over whole, from its start.
                r.seek(start);
                r.skip()?;
                out.skipped.push((i, why));
            }
        }
    }
    Ok(())
}

/// The fields of one event as read (each absent, or read, or why not).
#[derive(Default)]
struct Fields<'a> {
    hashes: Option<Result<Vec<BlockHash>, String>>,
    parent: Option<Result<BlockHash, String>>,
    tokens: Option<Result<Vec<u32>, String>>,
    block_size: Option<Item<'a>>,
    medium: Option<Item<'a>>,
    lora_name: Option<Item<'a>>,
    cache_salt: Option<Item<'a>>,
    extra_keys_salt: Option<Option<String>>,
    /// The fields met so far, a bit each ([`FIELDS`] order).
    seen: u8,
}

/// The fields an event reads (each once: the first of a name counts).
const FIELDS: [&str; 8] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "medium",
    "lora_name",
    "cache_salt",
    "extra_keys",
];

/// The fields an event reads, by name; an array event's fields are at
/// these positions (after the tag).
const STORED_AT: [&str; 8] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
];
const REMOVED_AT: [&str; 2] = ["block_hashes", "medium"];

impl<'a> Fields<'a> {
    /// Reads the value of field `name` into its place: nil is absent; the
    /// first of a name counts.
    fn read(&mut self, r: &mut Reader<'a>, name: &str) -> Result<(), Malformed> {
        let v = r.item()?;
        let bit = match FIELDS.iter().position(|&f| f == name) {
            Some(i) if self.seen & (1 << i) == 0 => 1 << i,
            // Not one it reads, or one already read.
            _ => return r.skip_rest(v),
        };
        self.seen |= bit;
        if v == Item::Nil {
            return Ok(());
        }
        match name {
            "block_hashes" => self.hashes = Some(hashes(r, v)?),
            "parent_block_hash" => self.parent = Some(hash(r, v)?),
            "token_ids" => self.tokens = Some(tokens(r, v)?),
            "extra_keys" => self.extra_keys_salt = Some(salt_in_extra_keys(r, v)?),
            _ => {
                r.skip_rest(v)?;
                match name {
                    "block_size" => self.block_size = Some(v),
                    "medium" => self.medium = Some(v),
                    "lora_name" => self.lora_name = Some(v),
                    _ => self.cache_salt = Some(v),
                }
            }
        }
        Ok(())
    }
}

fn opt_str(tag: &str, name: &str, v: Option<Item<'_>>) -> Result<Option<String>, String> {
    match v {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .map(|s| Some(s.to_string()))
            .ok_or_else(|| format!("{tag}: `{name}` is not a string")),
    }
}

fn medium(tag: &str, v: Option<Item<'_>>) -> Result<Medium, String> {
    match v {
        None => Ok(Medium::Gpu),
        Some(v) => Medium::parse(Some(
            v.as_str()
                .ok_or_else(|| format!("{tag}: `medium` is not a string"))?,
        )),
    }
}

/// One event, or why it cannot be read (the caller passes over it).
fn event(r: &mut Reader<'_>) -> Result<Result<Event, String>, Malformed> {
    let mut f = Fields::default();
    let tag = match r.item()? {
        Item::Map(n) => {
            let mut tag = None;
            for _ in 0..n {
                let key = r.item()?;
                match key.as_str() {
                    Some("type") if tag.is_none() => {
                        let v = r.item()?;
                        r.skip_rest(v)?;
                        tag = Some(v.as_str().map(str::to_string));
                    }
                    Some(name) => f.read(r, name)?,
                    None => {
                        r.skip_rest(key)?;
                        r.skip()?;
                    }
                }
            }
            match tag.flatten() {
                Some(t) => t,
                None => return Ok(Err("a map event without a string `type`".into())),
            }
        }
        Item::Array(n) => {
            let tag = match n {
                0 => None,
                _ => r.item()?.as_str().map(str::to_string),
            };
            let Some(tag) = tag else {
                return Ok(Err("an array event without a string tag".into()));
            };
            let at: &[&str] = match tag.as_str() {
                "BlockStored" => &STORED_AT,
                "BlockRemoved" => &REMOVED_AT,
                _ => &[],
            };
            for pos in 1..n {
                match at.get(pos - 1) {
                    Some(name) => f.read(r, name)?,
                    None => r.skip()?,
                }
            }
            tag
        }
        other => {
            r.skip_rest(other)?;
            return Ok(Err(format!("an event that is {}", other.kind())));
        }
    };
    Ok(assemble(&tag, f))
}

fn assemble(tag: &str, f: Fields<'_>) -> Result<Event, String> {
    let required = |name: &str| format!("{tag} without `{name}`");
    match tag {
        "BlockStored" => {
            let hashes = f.hashes.ok_or_else(|| required("block_hashes"))??;
            let parent = f.parent.transpose()?;
            let tokens = f.tokens.ok_or_else(|| required("token_ids"))??;
            let block_size = match f.block_size.ok_or_else(|| required("block_size"))? {
                Item::Uint(b) if b > 0 => usize::try_from(b).ok(),
                _ => None,
            }
            .ok_or("BlockStored: `block_size` is not a positive integer")?;
            if hashes.len().checked_mul(block_size) != Some(tokens.len()) {
                return Err(format!(
                    "BlockStored: {} tokens for {} blocks of {block_size}",
                    tokens.len(),
                    hashes.len()
                ));
            }
            let medium = medium(tag, f.medium)?;
            let lora_name = opt_str(tag, "lora_name", f.lora_name)?;
            let cache_salt = match opt_str(tag, "cache_salt", f.cache_salt)? {
                Some(s) => Some(s),
                None => f.extra_keys_salt.flatten(),
            };
            Ok(Event::Stored(Stored {
                hashes,
                parent,
                tokens,
                block_size,
                medium,
                lora_name,
                cache_salt,
            }))
        }
        "BlockRemoved" => Ok(Event::Removed {
            hashes: f.hashes.ok_or_else(|| required("block_hashes"))??,
            medium: medium(tag, f.medium)?,
        }),
        "AllBlocksCleared" => Ok(Event::Cleared),
        other => Err(format!("unknown event type {other:?}")),
    }
}

/// The salt Dynamo tags into the first block's `extra_keys` (a list per
/// block of keys); anything else there is passed over.
fn salt_in_extra_keys(r: &mut Reader<'_>, v: Item<'_>) -> Result<Option<String>, Malformed> {
    let Item::Array(blocks) = v else {
        r.skip_rest(v)?;
        return Ok(None);
    };
    let mut salt = None;
    for _ in 0..blocks {
        let keys = r.item()?;
        let Item::Array(n) = keys else {
            r.skip_rest(keys)?;
            continue;
        };
        for _ in 0..n {
            let k = r.item()?;
            r.skip_rest(k)?;
            if salt.is_none() {
                salt = k
                    .as_str()
                    .and_then(|s| s.strip_prefix(DYNAMO_SALT_TAG))
                    .map(str::to_string);
            }
        }
    }
    Ok(salt)
}

/// A block hash, `v` just read (and passed over whole).
fn hash(r: &mut Reader<'_>, v: Item<'_>) -> Result<Result<BlockHash, String>, Malformed> {
    r.skip_rest(v)?;
    Ok(match v {
        Item::Uint(u) => Ok(BlockHash(u)),
        Item::Int(i) => Ok(BlockHash(i as u64)),
        Item::Bin(b) => Ok(BlockHash(xxh3_64(b))),
        other => Err(format!("a block hash that is {}", other.kind())),
    })
}

fn hashes(r: &mut Reader<'_>, v: Item<'_>) -> Result<Result<Vec<BlockHash>, String>, Malformed> {
    let Item::Array(n) = v else {
        r.skip_rest(v)?;
        return Ok(Err("`block_hashes` is not a list".into()));
    };
    if n == 0 {
        return Ok(Err("`block_hashes` is empty".into()));
    }
    let mut out = Vec::with_capacity(n.min(r.left()));
    let mut why = None;
    for _ in 0..n {
        // Block hashes are 64-bit words as a rule: read without `item`.
        if let Some(w) = r.word_fast() {
            out.push(BlockHash(w));
            continue;
        }
        let h = r.item()?;
        match hash(r, h)? {
            Ok(h) => out.push(h),
            Err(e) => {
                why.get_or_insert(e);
            }
        }
    }
    Ok(match why {
        Some(e) => Err(e),
        None => Ok(out),
    })
}

fn tokens(r: &mut Reader<'_>, v: Item<'_>) -> Result<Result<Vec<u32>, String>, Malformed> {
    let Item::Array(n) = v else {
        r.skip_rest(v)?;
        return Ok(Err("`token_ids` is not a list".into()));
    };
    Ok(r.u32s(n)?.map_err(|i| {
        format!("token_ids[{i}] is not a token id in 0..2^32 (a pair of EAGLE's bigram keys?)")
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmpv::Value as V;

    fn encode(v: &V) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, v).unwrap();
        out
    }

    fn s(x: &str) -> V {
        V::from(x)
    }

    fn map(pairs: Vec<(&str, V)>) -> V {
        V::Map(pairs.into_iter().map(|(k, v)| (s(k), v)).collect())
    }

    fn stored_map(hashes: Vec<V>, parent: V, tokens: Vec<u64>, extra: Vec<(&str, V)>) -> V {
        let mut m = vec![
            ("type", s("BlockStored")),
            ("block_hashes", V::Array(hashes)),
            ("parent_block_hash", parent),
            (
                "token_ids",
                V::Array(tokens.into_iter().map(V::from).collect()),
            ),
            ("block_size", V::from(2)),
        ];
        m.extend(extra);
        map(m)
    }

    #[test]
    fn sglang_signed_hashes_and_left_out_fields_are_read() {
        let e = stored_map(
            vec![V::from(-1i64), V::from(i64::MIN)],
            V::from(-7i64),
            vec![1, 2, 3, 4],
            vec![
                ("medium", s("CPU_PINNED")),
                ("cache_salt", s("s")),
                ("session_id", s("x")),
            ],
        );
        let b = decode_batch(&encode(&V::Array(vec![
            V::from(2.5),
            V::Array(vec![e]),
            V::from(3),
        ])))
        .unwrap();
        assert_eq!((b.ts, b.rank, b.skipped.len()), (2.5, Some(3), 0));
        let Event::Stored(st) = &b.events[0] else {
            panic!("{b:?}")
        };
        assert_eq!(st.hashes, [BlockHash(u64::MAX), BlockHash(1 << 63)]);
        assert_eq!(st.parent, Some(BlockHash(-7i64 as u64)));
        assert_eq!(
            (st.medium, st.cache_salt.as_deref(), st.lora_name.as_deref()),
            (Medium::Cpu, Some("s"), None)
        );
    }

    #[test]
    fn vllm_arrays_bytes_hashes_and_map_batches_are_read() {
        let stored = V::Array(vec![
            s("BlockStored"),
            V::Array(vec![V::Binary(vec![1, 2, 3])]),
            V::Nil,
            V::Array(vec![V::from(5), V::from(6)]),
            V::from(2),
            V::Nil,
            s("Disk"),
            s("adapter"),
            V::Array(vec![V::Array(vec![s("dynamo-cache-salt:abc")])]),
        ]);
        let removed = V::Array(vec![s("BlockRemoved"), V::Array(vec![V::from(9u64)])]);
        let batch = map(vec![
            ("ts", V::from(1.0)),
            (
                "events",
                V::Array(vec![
                    stored,
                    removed,
                    map(vec![("type", s("AllBlocksCleared"))]),
                ]),
            ),
            ("data_parallel_rank", V::Nil),
        ]);
        let b = decode_batch(&encode(&batch)).unwrap();
        assert_eq!(b.rank, None);
        let Event::Stored(st) = &b.events[0] else {
            panic!("{b:?}")
        };
        assert_eq!(st.hashes, [BlockHash(xxh3_64(&[1, 2, 3]))]);
        assert_eq!(
            (st.medium, st.lora_name.as_deref(), st.cache_salt.as_deref()),
            (Medium::Disk, Some("adapter"), Some("abc"))
        );
        assert_eq!(
            b.events[1],
            Event::Removed {
                hashes: vec![BlockHash(9)],
                medium: Medium::Gpu
            }
        );
        assert_eq!(b.events[2], Event::Cleared);
    }

    #[test]
    fn a_bad_event_is_skipped_and_named_the_rest_stands() {
        let events = vec![
            map(vec![("type", s("BlockSplit"))]),
            stored_map(vec![V::from(1)], V::Nil, vec![1, 1 << 33], vec![]),
            stored_map(vec![V::from(1)], V::Nil, vec![1, 2, 3], vec![]),
            stored_map(
                vec![V::from(1)],
                V::Nil,
                vec![1, 2],
                vec![("medium", s("TAPE"))],
            ),
            map(vec![
                ("type", s("BlockRemoved")),
                ("block_hashes", V::Array(vec![])),
            ]),
            V::from(7),
            map(vec![("type", s("AllBlocksCleared"))]),
        ];
        let b = decode_batch(&encode(&V::Array(vec![
            V::from(0.0),
            V::Array(events),
            V::Nil,
        ])))
        .unwrap();
        assert_eq!(b.events, [Event::Cleared]);
        let why: Vec<&str> = b.skipped.iter().map(|(_, w)| w.as_str()).collect();
        assert_eq!(
            b.skipped.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4, 5]
        );
        assert!(
            why[0].contains("unknown event type \"BlockSplit\""),
            "{why:?}"
        );
        assert!(why[1].contains("token_ids[1]"), "{why:?}");
        assert!(why[2].contains("3 tokens for 1 blocks of 2"), "{why:?}");
        assert!(why[3].contains("unknown medium \"TAPE\""), "{why:?}");
        assert!(why[4].contains("empty"), "{why:?}");
        assert!(why[5].contains("an integer"), "{why:?}");
    }

    #[test]
    fn what_is_not_a_batch_is_an_error() {
        assert!(
            matches!(
                decode_batch(&[0x93, 0xcb, 0x00]),
                Err(DecodeError::Msgpack(_))
            ),
            "cut short"
        );
        assert!(matches!(decode_batch(&[]), Err(DecodeError::Msgpack(_))));
        assert!(matches!(
            decode_batch(&encode(&V::from(1))),
            Err(DecodeError::NotABatch(_))
        ));
        let mut two = encode(&V::Array(vec![V::from(0.0), V::Array(vec![])]));
        assert!(decode_batch(&two).is_ok(), "[ts, events] without a rank");
        two.push(0);
        assert!(
            matches!(decode_batch(&two), Err(DecodeError::Msgpack(_))),
            "trailing bytes"
        );
        let bad_rank = encode(&V::Array(vec![V::from(0.0), V::Array(vec![]), V::from(-1)]));
        assert!(matches!(
            decode_batch(&bad_rank),
            Err(DecodeError::NotABatch(_))
        ));
    }
}
