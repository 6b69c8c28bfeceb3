//! radixkv's own publisher's batches (`radixkv_events::wire`, both
//! encodings) read back by the index's decoder, field by field.

use radixkv_events::wire::{encode_batch, Encoding, KvEvent, Medium as WireMedium};
use radixkv_index::decode::{decode_batch, BlockHash, Event, Medium, Stored};

#[test]
fn radixkv_batches_decode_in_both_encodings() {
    let events = vec![
        KvEvent::AllBlocksCleared,
        KvEvent::BlockStored {
            block_hashes: vec![1, (1 << 63) - 1],
            parent_block_hash: Some(7),
            token_ids: vec![10, 11, 12, 13],
            block_size: 2,
            medium: WireMedium::Gpu,
            lora_name: Some("adapter".into()),
            cache_salt: Some("tenant".into()),
        },
        KvEvent::BlockStored {
            block_hashes: vec![3],
            parent_block_hash: None,
            token_ids: vec![u32::MAX, 0],
            block_size: 2,
            medium: WireMedium::Cpu,
            lora_name: None,
            cache_salt: None,
        },
        KvEvent::BlockRemoved {
            block_hashes: vec![3],
            medium: WireMedium::Cpu,
        },
    ];
    for enc in Encoding::ALL {
        let b = decode_batch(&encode_batch(12.5, &events, Some(4), enc)).unwrap();
        assert_eq!((b.ts, b.rank), (12.5, Some(4)), "{enc:?}");
        assert!(b.skipped.is_empty(), "{enc:?}: {:?}", b.skipped);
        assert_eq!(
            b.events,
            [
                Event::Cleared,
                Event::Stored(Stored {
                    hashes: vec![BlockHash(1), BlockHash((1 << 63) - 1)],
                    parent: Some(BlockHash(7)),
                    tokens: vec![10, 11, 12, 13],
                    block_size: 2,
                    medium: Medium::Gpu,
                    lora_name: Some("adapter".into()),
                    cache_salt: Some("tenant".into()),
                }),
                Event::Stored(Stored {
                    hashes: vec![BlockHash(3)],
                    parent: None,
                    tokens: vec![u32::MAX, 0],
                    block_size: 2,
                    medium: Medium::Cpu,
                    lora_name: None,
                    cache_salt: None,
                }),
                Event::Removed {
                    hashes: vec![BlockHash(3)],
                    medium: Medium::Cpu,
                },
            ],
            "{enc:?}"
        );
    }
}
