//! Bad input: each a typed error, the cache unchanged.

use radixkv::{CacheError, DeviceId, EvictionPolicy, RadixCache, TokenKey};

fn snapshot(c: &RadixCache) -> (Vec<usize>, u64, radixkv::Sizes) {
    (
        c.peek(TokenKey::new(&[1, 2, 3, 4, 5, 6, 7, 8])),
        c.node_count(),
        c.sizes(DeviceId(0)).unwrap(),
    )
}

#[test]
fn bad_inserts_leave_the_cache_unchanged() {
    let c = RadixCache::builder()
        .page_size(2)
        .devices(2)
        .build()
        .unwrap();
    c.insert(TokenKey::new(&[1, 2, 3, 4]), DeviceId(0), &[1, 2, 3, 4], 0)
        .unwrap();
    let before = snapshot(&c);
    assert_eq!(
        c.insert(TokenKey::new(&[1, 2, 3]), DeviceId(0), &[1, 2, 3], 0),
        Err(CacheError::Unaligned {
            len: 3,
            page_size: 2
        })
    );
    assert_eq!(
        c.insert(TokenKey::new(&[1, 2, 5, 6]), DeviceId(0), &[1, 2], 0),
        Err(CacheError::LengthMismatch {
            tokens: 4,
            values: 2
        })
    );
    assert_eq!(
        c.insert(TokenKey::new(&[1, 2]), DeviceId(2), &[1, 2], 0),
        Err(CacheError::UnknownDevice {
            device: DeviceId(2),
            devices: 2
        })
    );
    assert!(matches!(
        c.match_prefix(TokenKey::new(&[1]), DeviceId(9)),
        Err(CacheError::UnknownDevice { .. })
    ));
    assert!(matches!(
        c.match_and_pin(TokenKey::new(&[1]), DeviceId(9)),
        Err(CacheError::UnknownDevice { .. })
    ));
    assert!(matches!(
        c.evict(DeviceId(7), 1),
        Err(CacheError::UnknownDevice { .. })
    ));
    assert!(matches!(
        c.sizes(DeviceId(7)),
        Err(CacheError::UnknownDevice { .. })
    ));
    assert_eq!(snapshot(&c), before);
    c.audit();
}

#[test]
fn empty_keys_are_not_errors() {
    let c = RadixCache::builder().page_size(4).build().unwrap();
    assert_eq!(
        c.insert(TokenKey::new(&[]), DeviceId(0), &[], 0)
            .unwrap()
            .prefix_len,
        0
    );
    assert_eq!(
        c.match_prefix(TokenKey::new(&[]), DeviceId(0)).unwrap().len,
        0
    );
    // Shorter than a page: matches nothing, is not an error.
    c.insert(TokenKey::new(&[1, 2, 3, 4]), DeviceId(0), &[1, 2, 3, 4], 0)
        .unwrap();
    let m = c
        .match_and_pin(TokenKey::new(&[1, 2, 3]), DeviceId(0))
        .unwrap();
    assert_eq!(m.len, 0);
    assert!(m.lease.unwrap().is_empty());
    assert_eq!(c.node_count(), 1);
}

#[test]
fn unknown_policy_and_bad_config_are_errors() {
    assert!(matches!("lfru".parse::<EvictionPolicy>(), Err(e) if e.to_string().contains("lfru")));
    assert!(matches!(
        RadixCache::builder().page_size(0).build(),
        Err(CacheError::InvalidConfig(_))
    ));
    assert!(matches!(
        RadixCache::builder().devices(0).build(),
        Err(CacheError::InvalidConfig(_))
    ));
    assert!(matches!(
        RadixCache::builder().devices(100_000).build(),
        Err(CacheError::InvalidConfig(_))
    ));
}

#[test]
fn stale_and_foreign_handles_are_errors() {
    let c = RadixCache::builder().build().unwrap();
    c.insert(TokenKey::new(&[1, 2]), DeviceId(0), &[1, 2], 0)
        .unwrap();
    let m = c.match_prefix(TokenKey::new(&[1, 2]), DeviceId(0)).unwrap();
    let other = RadixCache::builder().build().unwrap();
    assert_eq!(other.pin(&m.handle).unwrap_err(), CacheError::ForeignHandle);
    c.evict(DeviceId(0), 2).unwrap();
    let before = snapshot(&c);
    assert_eq!(
        c.pin(&m.handle).unwrap_err(),
        CacheError::StaleHandle(DeviceId(0).into())
    );
    // Re-inserting the same key makes a new residency: the old handle stays stale.
    c.insert(TokenKey::new(&[1, 2]), DeviceId(0), &[3, 4], 0)
        .unwrap();
    assert_eq!(
        c.pin(&m.handle).unwrap_err(),
        CacheError::StaleHandle(DeviceId(0).into())
    );
    assert_ne!(snapshot(&c), before);
    c.audit();
}

#[test]
fn multi_device_stale_handle_is_generation_checked() {
    // The node stays in the tree (resident on device 1) while device 0's
    // residency is evicted and re-made: the handle must not pin the new one.
    let c = RadixCache::builder().devices(2).build().unwrap();
    c.insert(TokenKey::new(&[1, 2]), DeviceId(0), &[1, 2], 0)
        .unwrap();
    c.insert(TokenKey::new(&[1, 2]), DeviceId(1), &[5, 6], 0)
        .unwrap();
    let m = c.match_prefix(TokenKey::new(&[1, 2]), DeviceId(0)).unwrap();
    assert_eq!(c.evict(DeviceId(0), 2).unwrap().values, vec![1, 2]);
    assert_eq!(c.node_count(), 1);
    c.insert(TokenKey::new(&[1, 2]), DeviceId(0), &[7, 8], 0)
        .unwrap();
    assert_eq!(
        c.pin(&m.handle).unwrap_err(),
        CacheError::StaleHandle(DeviceId(0).into())
    );
    let fresh = c.match_prefix(TokenKey::new(&[1, 2]), DeviceId(0)).unwrap();
    assert!(c.pin(&fresh.handle).is_ok());
}
