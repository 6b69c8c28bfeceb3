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

use rmpv::Value;
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
    let mut rest = payload;
    let v = rmpv::decode::read_value(&mut rest).map_err(|e| DecodeError::Msgpack(e.to_string()))?;
    if !rest.is_empty() {
        return Err(DecodeError::Msgpack(format!(
            "{} bytes after the batch",
            rest.len()
        )));
    }
    let (ts, events, rank) = match &v {
        Value::Array(a) if a.len() == 2 || a.len() == 3 => (&a[0], &a[1], a.get(2)),
        Value::Map(m) => (
            field(m, "ts").ok_or_else(|| not_a_batch("a map without `ts`"))?,
            field(m, "events").ok_or_else(|| not_a_batch("a map without `events`"))?,
            field(m, "data_parallel_rank").or_else(|| field(m, "attn_dp_rank")),
        ),
        other => return Err(not_a_batch(&format!("{} at the top", kind(other)))),
    };
    let ts = ts
        .as_f64()
        .or_else(|| ts.as_i64().map(|t| t as f64))
        .ok_or_else(|| not_a_batch("`ts` is not a number"))?;
    let Value::Array(events) = events else {
        return Err(not_a_batch("`events` is not a list"));
    };
    let rank = match rank {
        None | Some(Value::Nil) => None,
        Some(r) => Some(
            r.as_u64()
                .and_then(|r| u32::try_from(r).ok())
                .ok_or_else(|| not_a_batch("the rank is not a rank"))?,
        ),
    };
    let mut out = Batch {
        ts,
        events: Vec::with_capacity(events.len()),
        rank,
        skipped: Vec::new(),
    };
    for (i, e) in events.iter().enumerate() {
        match event(e) {
            Ok(e) => out.events.push(e),
            Err(why) => out.skipped.push((i, why)),
        }
    }
    Ok(out)
}

fn not_a_batch(why: &str) -> DecodeError {
    DecodeError::NotABatch(why.to_string())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Nil => "nil",
        Value::Boolean(_) => "a boolean",
        Value::Integer(_) => "an integer",
        Value::F32(_) | Value::F64(_) => "a float",
        Value::String(_) => "a string",
        Value::Binary(_) => "bytes",
        Value::Array(_) => "a list",
        Value::Map(_) => "a map",
        Value::Ext(..) => "an extension",
    }
}

fn field<'a>(m: &'a [(Value, Value)], name: &str) -> Option<&'a Value> {
    m.iter()
        .find(|(k, _)| k.as_str() == Some(name))
        .map(|(_, v)| v)
}

/// The fields of an event by name, from a map or from an array's positions
/// (`names[i]` for position `i + 1`, after the tag).
struct Fields<'a> {
    tag: &'a str,
    map: Option<&'a [(Value, Value)]>,
    array: &'a [Value],
}

impl<'a> Fields<'a> {
    fn of(e: &'a Value) -> Result<Fields<'a>, String> {
        match e {
            Value::Map(m) => Ok(Fields {
                tag: field(m, "type")
                    .and_then(Value::as_str)
                    .ok_or("a map event without a string `type`")?,
                map: Some(m),
                array: &[],
            }),
            Value::Array(a) => Ok(Fields {
                tag: a
                    .first()
                    .and_then(Value::as_str)
                    .ok_or("an array event without a string tag")?,
                map: None,
                array: a,
            }),
            other => Err(format!("an event that is {}", kind(other))),
        }
    }

    /// Field `name`, at array position `pos` (after the tag); `None` when
    /// absent or nil.
    fn get(&self, name: &str, pos: usize) -> Option<&'a Value> {
        let v = match self.map {
            Some(m) => field(m, name),
            None => self.array.get(pos),
        };
        v.filter(|v| !v.is_nil())
    }

    fn required(&self, name: &str, pos: usize) -> Result<&'a Value, String> {
        self.get(name, pos)
            .ok_or_else(|| format!("{} without `{name}`", self.tag))
    }

    fn opt_str(&self, name: &str, pos: usize) -> Result<Option<&'a str>, String> {
        match self.get(name, pos) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| format!("{}: `{name}` is not a string", self.tag)),
        }
    }
}

fn event(e: &Value) -> Result<Event, String> {
    let f = Fields::of(e)?;
    match f.tag {
        "BlockStored" => {
            let hashes = hashes(f.required("block_hashes", 1)?)?;
            let parent = f.get("parent_block_hash", 2).map(hash).transpose()?;
            let tokens = tokens(f.required("token_ids", 3)?)?;
            let block_size = f
                .required("block_size", 4)?
                .as_u64()
                .and_then(|b| usize::try_from(b).ok())
                .filter(|&b| b > 0)
                .ok_or("BlockStored: `block_size` is not a positive integer")?;
            if tokens.len() != hashes.len() * block_size {
                return Err(format!(
                    "BlockStored: {} tokens for {} blocks of {block_size}",
                    tokens.len(),
                    hashes.len()
                ));
            }
            let medium = Medium::parse(f.opt_str("medium", 6)?)?;
            let lora_name = f.opt_str("lora_name", 7)?.map(str::to_string);
            let cache_salt = match f.opt_str("cache_salt", usize::MAX)? {
                Some(s) => Some(s.to_string()),
                None => f.get("extra_keys", 8).and_then(salt_in_extra_keys),
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
            hashes: hashes(f.required("block_hashes", 1)?)?,
            medium: Medium::parse(f.opt_str("medium", 2)?)?,
        }),
        "AllBlocksCleared" => Ok(Event::Cleared),
        other => Err(format!("unknown event type {other:?}")),
    }
}

/// The salt Dynamo tags into the first block's `extra_keys`.
fn salt_in_extra_keys(v: &Value) -> Option<String> {
    let Value::Array(per_block) = v else {
        return None;
    };
    per_block.iter().find_map(|keys| match keys {
        Value::Array(keys) => keys.iter().find_map(|k| {
            k.as_str()
                .and_then(|s| s.strip_prefix(DYNAMO_SALT_TAG))
                .map(str::to_string)
        }),
        _ => None,
    })
}

fn hash(v: &Value) -> Result<BlockHash, String> {
    match v {
        Value::Integer(i) => i
            .as_u64()
            .or_else(|| i.as_i64().map(|s| s as u64))
            .map(BlockHash)
            .ok_or_else(|| "a block hash out of range".to_string()),
        Value::Binary(b) => Ok(BlockHash(xxh3_64(b))),
        other => Err(format!("a block hash that is {}", kind(other))),
    }
}

fn hashes(v: &Value) -> Result<Vec<BlockHash>, String> {
    let Value::Array(a) = v else {
        return Err("`block_hashes` is not a list".into());
    };
    if a.is_empty() {
        return Err("`block_hashes` is empty".into());
    }
    a.iter().map(hash).collect()
}

fn tokens(v: &Value) -> Result<Vec<u32>, String> {
    let Value::Array(a) = v else {
        return Err("`token_ids` is not a list".into());
    };
    a.iter()
        .enumerate()
        .map(|(i, t)| {
            t.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or_else(|| format!("token_ids[{i}] is not a token id in 0..2^32 (a pair of EAGLE's bigram keys?)"))
        })
        .collect()
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
