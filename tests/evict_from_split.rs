//! Taking a block out (`evict_from`, `evict_from_place`) while another
//! writer splits the node it found: the remover is parked at the test-only
//! pause point `Located` (its node found, nothing evicted yet), a writer
//! on another device splits that node, and the remover, let go, must take
//! the pages from where its node started, the split-off upper part
//! included.
//!
//! A third test parks the remover at `Gathered` (its subtree gathered,
//! nothing evicted) while a writer splits a node inside that subtree: the
//! new node must go too.
//!
//! Negative control: without the climb over nodes split off above the
//! found one (`RadixCache::evict_below`), the upper part stays resident
//! and the first assertion fails with its own message.

use radixkv::pause::{Gate, Point};
use radixkv::{DeviceId, RadixCache, TokenKey};
use std::time::Duration;

const PS: usize = 4;
const D0: DeviceId = DeviceId(0);
const D1: DeviceId = DeviceId(1);

/// The pause gate is process-wide: the tests of this file take turns.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}

/// A cache holding `[1..=12]` on device 0, the node after the first page
/// already split off (`[1..=4]` | `[5..=12]`), and the key of the page to
/// take (`[1..=8]`).
fn setup() -> (RadixCache, Vec<u32>) {
    let c = RadixCache::builder()
        .page_size(PS)
        .devices(2)
        .build()
        .unwrap();
    let key: Vec<u32> = (1..=12).collect();
    let (_, place) = c.insert_placed(TokenKey::new(&key), D0, &key, 0).unwrap();
    drop(place);
    c.insert(TokenKey::new(&[1, 2, 3, 4, 50, 51, 52, 53]), D1, &[0; 8], 0)
        .unwrap();
    (c, key[..8].to_vec())
}

/// Splits `[5..=12]` at 8 from device 1 while the remover is parked.
fn split_meanwhile(c: &RadixCache) {
    let mut k: Vec<u32> = (1..=8).collect();
    k.extend([70, 71, 72, 73]);
    c.insert(TokenKey::new(&k), D1, &[0; 12], 0).unwrap();
}

fn check_after(c: &RadixCache, took: usize) {
    let key: Vec<u32> = (1..=12).collect();
    assert_eq!(
        c.peek(TokenKey::new(&key))[0],
        4,
        "the page split off above the found node stayed on device 0"
    );
    assert_eq!(took, 8, "tokens taken from device 0");
    // Device 1's own pages stay.
    let mut k: Vec<u32> = (1..=8).collect();
    k.extend([70, 71, 72, 73]);
    assert_eq!(c.peek(TokenKey::new(&k))[1], 12);
    c.check().unwrap();
}

#[test]
fn a_node_split_after_it_was_found_goes_whole() {
    let _one = serial();
    let (c, page_key) = setup();
    let gate = Gate::arm(Point::Located);
    let took = std::thread::scope(|s| {
        let remover = s.spawn(|| c.evict_from(TokenKey::new(&page_key), D0).unwrap());
        assert!(gate.wait_parked(Duration::from_secs(60)), "never parked");
        split_meanwhile(&c);
        gate.release();
        remover.join().unwrap().tokens
    });
    check_after(&c, took);
}

#[test]
fn a_node_split_after_it_was_found_from_a_place_goes_whole() {
    let _one = serial();
    let (c, page_key) = setup();
    let key: Vec<u32> = (1..=12).collect();
    let (_, place) = c.insert_placed(TokenKey::new(&key), D0, &key, 0).unwrap();
    let place = place.unwrap();
    let gate = Gate::arm(Point::Located);
    let took = std::thread::scope(|s| {
        let remover = s.spawn(|| {
            c.evict_from_place(&place, 8, &page_key[4..], D0)
                .unwrap()
                .expect("the place is in the tree")
        });
        assert!(gate.wait_parked(Duration::from_secs(60)), "never parked");
        split_meanwhile(&c);
        gate.release();
        let e = remover.join().unwrap();
        assert_eq!(e.above.map(|p| p.len()), Some(4));
        e.evicted.tokens
    });
    check_after(&c, took);
}

/// A cache holding `[1..=4]` | `[5..=12]` on device 0 (the split made by
/// device 1's `[1..=4, 50..=53]`), whose subtree from `[1..=4]` is taken
/// while device 1 splits `[5..=12]` at 8: the new node `[5..=8]`, between
/// the two gathered ones, holds device 0's residency (a split copies it),
/// and the pass that took `[9..=12]` found `[1..=4]` no leaf.
#[test]
fn a_node_split_below_the_found_one_while_its_subtree_goes_goes_too() {
    let _one = serial();
    let (c, _) = setup();
    let gate = Gate::arm(Point::Gathered);
    let took = std::thread::scope(|s| {
        let remover = s.spawn(|| c.evict_from(TokenKey::new(&[1, 2, 3, 4]), D0).unwrap());
        assert!(gate.wait_parked(Duration::from_secs(60)), "never parked");
        split_meanwhile(&c);
        gate.release();
        remover.join().unwrap().tokens
    });
    let key: Vec<u32> = (1..=12).collect();
    assert_eq!(
        c.peek(TokenKey::new(&key))[0],
        0,
        "the node split off below the found one stayed on device 0"
    );
    assert_eq!(took, 12, "tokens taken from device 0");
    let mut k: Vec<u32> = (1..=8).collect();
    k.extend([70, 71, 72, 73]);
    assert_eq!(c.peek(TokenKey::new(&k))[1], 12);
    c.check().unwrap();
}
