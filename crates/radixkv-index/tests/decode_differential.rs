//! The index's decoder (item by item over the payload, `src/msgpack.rs`)
//! against a reference that reads the whole payload into an `rmpv` value
//! tree first and then reads the batch off it (the decoder this crate had
//! before): on random batches in every producer's shape, with fields of
//! the wrong kind, unknown fields and events, nils, duplicate keys,
//! extensions, and then cut short or with a byte changed, both give the
//! same batch (events, skipped events and why), or both refuse it.

use radixkv_index::decode::{decode_batch, DecodeError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rmpv::Value as V;

mod reference {
    use radixkv_index::decode::{Batch, BlockHash, DecodeError, Event, Medium, Stored};
    use rmpv::Value;
    use xxhash_rust::xxh3::xxh3_64;

    const DYNAMO_SALT_TAG: &str = "dynamo-cache-salt:";

    pub fn reference_decode_batch(payload: &[u8]) -> Result<Batch, DecodeError> {
        let mut rest = payload;
        let v =
            rmpv::decode::read_value(&mut rest).map_err(|e| DecodeError::Msgpack(e.to_string()))?;
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
                if hashes.len().checked_mul(block_size) != Some(tokens.len()) {
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
}

fn s(x: &str) -> V {
    V::from(x)
}

/// A value of a random kind (for a field that should be something else).
fn junk(r: &mut StdRng) -> V {
    match r.random_range(0..9) {
        0 => V::Nil,
        1 => V::from(r.random::<bool>()),
        2 => V::from(r.random::<i64>()),
        3 => V::from(r.random::<u64>()),
        4 => V::from(1.5),
        5 => s(["GPU", "CPU", "x", "BlockStored", ""][r.random_range(0..5)]),
        6 => V::Binary(vec![1, 2, 3]),
        7 => V::Array(vec![V::from(1), s("a")]),
        _ => V::Ext(4, vec![0; r.random_range(0..20)]),
    }
}

fn maybe(r: &mut StdRng, good: V) -> V {
    if r.random_ratio(1, 25) {
        junk(r)
    } else {
        good
    }
}

fn hash(r: &mut StdRng) -> V {
    match r.random_range(0..3) {
        0 => V::from(r.random::<u64>()),
        1 => V::from(-(r.random_range(1..1_000_000i64))),
        _ => V::Binary((0..r.random_range(0..40)).map(|_| r.random()).collect()),
    }
}

fn hashes(r: &mut StdRng, n: usize) -> V {
    let mut v: Vec<V> = (0..n).map(|_| hash(r)).collect();
    if r.random_ratio(1, 15) && !v.is_empty() {
        let i = r.random_range(0..v.len());
        v[i] = junk(r);
    }
    maybe(r, V::Array(v))
}

fn tokens(r: &mut StdRng, n: usize) -> V {
    let mut v: Vec<V> = (0..n)
        .map(|_| match r.random_range(0..4) {
            0 => V::from(r.random_range(0..128u64)),
            1 => V::from(r.random_range(0..70_000u64)),
            2 => V::from(r.random::<u32>()),
            _ => V::from(r.random_range(0..300i64)),
        })
        .collect();
    if r.random_ratio(1, 15) && !v.is_empty() {
        let i = r.random_range(0..v.len());
        v[i] = [V::from(1u64 << 33), V::from(-1), s("t"), V::Nil][r.random_range(0..4)].clone();
    }
    maybe(r, V::Array(v))
}

fn medium(r: &mut StdRng) -> V {
    let m = [
        "GPU",
        "CPU",
        "CPU_PINNED",
        "DISK",
        "Disk",
        "EXTERNAL",
        "TAPE",
    ];
    if r.random_ratio(1, 3) {
        V::Nil
    } else {
        let m = s(m[r.random_range(0..m.len())]);
        maybe(r, m)
    }
}

fn opt_name(r: &mut StdRng) -> V {
    if r.random_ratio(1, 2) {
        V::Nil
    } else {
        let n = s(["a", "tenant", ""][r.random_range(0..3)]);
        maybe(r, n)
    }
}

fn extra_keys(r: &mut StdRng) -> V {
    match r.random_range(0..4) {
        0 => V::Nil,
        1 => V::Array(vec![V::Array(vec![s("dynamo-cache-salt:abc")])]),
        2 => V::Array(vec![
            V::Nil,
            V::Array(vec![V::from(3), s("dynamo-cache-salt:x")]),
        ]),
        _ => junk(r),
    }
}

/// One event, in the map or the array encoding.
fn event(r: &mut StdRng) -> V {
    let kind = r.random_range(0..10);
    let tag = match kind {
        0..=4 => "BlockStored",
        5..=7 => "BlockRemoved",
        8 => "AllBlocksCleared",
        _ => "BlockSplit",
    };
    let n = r.random_range(0..4);
    let bs = r.random_range(1..4);
    let tokens_n = if r.random_ratio(1, 10) {
        n * bs + 1
    } else {
        n * bs
    };
    let mut fields: Vec<(&str, V)> = match tag {
        "BlockStored" => vec![
            ("block_hashes", hashes(r, n)),
            (
                "parent_block_hash",
                if r.random_ratio(1, 2) {
                    V::Nil
                } else {
                    let h = hash(r);
                    maybe(r, h)
                },
            ),
            ("token_ids", tokens(r, tokens_n)),
            ("block_size", maybe(r, V::from(bs))),
            ("lora_id", V::Nil),
            ("medium", medium(r)),
            ("lora_name", opt_name(r)),
            ("extra_keys", extra_keys(r)),
        ],
        "BlockRemoved" => vec![("block_hashes", hashes(r, n)), ("medium", medium(r))],
        _ => vec![],
    };
    if r.random_ratio(1, 2) {
        // The array encoding, its trailing fields cut at random.
        let keep = r.random_range(0..=fields.len());
        let mut a = vec![maybe(r, s(tag))];
        a.extend(fields.drain(..).take(keep).map(|(_, v)| v));
        if r.random_ratio(1, 10) {
            a.push(junk(r));
        }
        return if r.random_ratio(1, 40) {
            junk(r)
        } else {
            V::Array(a)
        };
    }
    fields.push(("type", maybe(r, s(tag))));
    if tag == "BlockStored" && r.random_ratio(1, 3) {
        fields.push(("cache_salt", opt_name(r)));
    }
    if r.random_ratio(1, 6) {
        fields.push(("session_id", junk(r)));
    }
    if r.random_ratio(1, 10) && !fields.is_empty() {
        // A field twice: the first counts.
        let i = r.random_range(0..fields.len());
        let dup = (fields[i].0, junk(r));
        fields.push(dup);
    }
    // Any order, some pairs dropped.
    for i in (1..fields.len()).rev() {
        let j = r.random_range(0..=i);
        fields.swap(i, j);
    }
    if r.random_ratio(1, 10) && !fields.is_empty() {
        fields.remove(r.random_range(0..fields.len()));
    }
    let mut pairs: Vec<(V, V)> = fields.into_iter().map(|(k, v)| (s(k), v)).collect();
    if r.random_ratio(1, 20) {
        pairs.push((V::from(5), V::from(6)));
    }
    V::Map(pairs)
}

fn batch(r: &mut StdRng) -> V {
    let events = V::Array((0..r.random_range(0..6)).map(|_| event(r)).collect());
    let ts = maybe(r, V::from(12.5));
    let rank = match r.random_range(0..4) {
        0 => V::Nil,
        1 => V::from(r.random_range(0..8u32)),
        2 => V::from(1u64 << 40),
        _ => maybe(r, V::from(3)),
    };
    match r.random_range(0..8) {
        0..=3 => V::Array(vec![ts, events, rank]),
        4 => V::Array(vec![ts, events]),
        5 | 6 => {
            let mut m = vec![(s("ts"), ts), (s("events"), events)];
            m.push((
                s(["data_parallel_rank", "attn_dp_rank"][r.random_range(0..2)]),
                rank,
            ));
            if r.random_ratio(1, 5) {
                m.push((s("other"), junk(r)));
            }
            if r.random_ratio(1, 10) {
                m.remove(r.random_range(0..m.len()));
            }
            let j = r.random_range(0..m.len());
            m.swap(0, j);
            V::Map(m)
        }
        _ => junk(r),
    }
}

fn same(
    got: &Result<radixkv_index::decode::Batch, DecodeError>,
    want: &Result<radixkv_index::decode::Batch, DecodeError>,
) -> bool {
    match (got, want) {
        (Ok(g), Ok(w)) => g == w,
        (Err(DecodeError::NotABatch(_)), Err(DecodeError::NotABatch(_))) => true,
        // Not msgpack: the reference reads the whole payload first and
        // says so; the decoder may meet a wrong field before the cut.
        (Err(_), Err(DecodeError::Msgpack(_))) => true,
        _ => false,
    }
}

#[test]
fn the_decoder_reads_what_a_value_tree_reads_and_refuses_what_it_refuses() {
    let mut r = StdRng::seed_from_u64(7);
    let (mut read, mut events, mut skipped, mut refused) = (0, 0, 0, 0);
    for case in 0..30_000 {
        let v = batch(&mut r);
        let mut p = Vec::new();
        rmpv::encode::write_value(&mut p, &v).unwrap();
        match r.random_range(0..6) {
            0 if !p.is_empty() => p.truncate(r.random_range(0..p.len())),
            1 if !p.is_empty() => {
                // Any byte but the reserved marker 0xc1, which rmpv reads as
                // nil and the decoder refuses (msgpack says it is never used).
                let i = r.random_range(0..p.len());
                p[i] = match r.random() {
                    0xc1 => 0xc0,
                    b => b,
                };
            }
            2 => p.push(0),
            _ => {}
        }
        let got = decode_batch(&p);
        let want = reference::reference_decode_batch(&p);
        assert!(
            same(&got, &want),
            "case {case}: {v:?}\npayload {p:02x?}\ndecoder: {got:?}\nreference: {want:?}"
        );
        match &want {
            Ok(b) => {
                read += 1;
                events += b.events.len();
                skipped += b.skipped.len();
            }
            Err(_) => refused += 1,
        }
    }
    // The cases reach every outcome, many times.
    assert!(
        read > 10_000 && events > 10_000 && skipped > 5_000 && refused > 5_000,
        "{read} read, {events} events, {skipped} skipped, {refused} refused"
    );
}
