//! radixkv's router index (`radixkv_index::KvIndex`, the tree `radixkv
//! index` serves), fed the blocks CRTC gets as the KV events an engine
//! publishes: one `BlockStored` per request from the root (its sequence
//! hashes, its tokens), one `BlockRemoved` per evicted run. Its queries
//! take Dynamo's local block hashes, precomputed, as `crtc-pre` and
//! `smg-pre` do: the same radixkv tree as the `radixkv` rows, keyed by
//! two hash words a block instead of 16 tokens. `&self` throughout: the
//! 2-thread phases call it from both threads, no lock around it.

use crate::workload::Request;
use radixkv_index::decode::{BlockHash, Event, Medium, Stored};
use radixkv_index::{KvIndex, Source};

/// One source (worker) per device, rank 0.
fn source(device: usize) -> Source {
    Source {
        worker: device as u64,
        rank: 0,
    }
}

/// The store event of `r` (built before the clock starts, as a router
/// gets it decoded).
pub(crate) fn stored(r: &Request, page: usize) -> Event {
    Event::Stored(Stored {
        hashes: r.seq.iter().map(|&h| BlockHash(h)).collect(),
        parent: None,
        tokens: r.tokens.clone(),
        block_size: page,
        medium: Medium::Gpu,
        lora_name: None,
        cache_salt: None,
    })
}

/// The index of `devices` sources.
pub(crate) fn new(devices: usize, page: usize) -> KvIndex {
    KvIndex::new(page, devices).expect("radixkv index")
}

/// Applies `event` from `device`'s source; every event must apply.
pub(crate) fn apply(kv: &KvIndex, device: usize, event: &Event) {
    let (_, errors) = kv.apply(source(device), std::slice::from_ref(event));
    assert!(
        errors.is_empty(),
        "radixkv index refused an event: {errors:?}"
    );
}

/// The removal event of the blocks with sequence hashes `keys`.
pub(crate) fn removed(keys: &[u64]) -> Event {
    Event::Removed {
        hashes: keys.iter().map(|&h| BlockHash(h)).collect(),
        medium: Medium::Gpu,
    }
}

/// Blocks of `contents`' longest prefix each device holds.
pub(crate) fn per_device(kv: &KvIndex, contents: &[u64], devices: usize) -> Vec<usize> {
    let mut per = vec![0; devices];
    for s in kv.scores_by_hash(contents) {
        per[s.source.worker as usize] = s.tokens / kv.block_size();
    }
    per
}

/// The query as a router runs it: the scores only.
pub(crate) fn query(kv: &KvIndex, contents: &[u64]) -> usize {
    kv.scores_by_hash(contents).len()
}
