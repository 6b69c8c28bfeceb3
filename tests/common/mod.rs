//! The differential harness shared by the property test and the fuzz
//! mode: op sequences run on the concurrent cache and on the sequential
//! model, comparing every result and every device's sizes after every op.

#![allow(dead_code)] // each test binary uses a part
#![allow(clippy::single_range_in_vec_init)] // ranges of values are the data here

use proptest::prelude::*;
use radixkv::reference::{SeqHandle, SequentialCache};
use radixkv::{DeviceId, EvictionPolicy, Lease, NodeHandle, RadixCache, Tier, TokenKey, TreePlace};

#[derive(Debug, Clone)]
pub enum Op {
    Insert {
        ns: u8,
        key: Vec<u32>,
        dev: usize,
        prio: i64,
        /// How the values are drawn ([`values_for`]).
        vals: u8,
    },
    Match {
        ns: u8,
        key: Vec<u32>,
        dev: usize,
        pin: bool,
    },
    Peek {
        ns: u8,
        key: Vec<u32>,
    },
    PinHandle {
        idx: usize,
    },
    Release {
        idx: usize,
    },
    Evict {
        dev: usize,
        n: usize,
    },
    /// `evict_from` of the key's whole pages; from the place of an
    /// earlier insert whose key they begin (`evict_from_place`) when there
    /// is one.
    EvictFrom {
        ns: u8,
        key: Vec<u32>,
        dev: usize,
    },
}

fn ns_of(ns: u8) -> Option<&'static str> {
    match ns {
        0 => None,
        1 => Some(""),
        _ => Some("s"),
    }
}

fn op_strategy(devices: usize) -> impl Strategy<Value = Op> {
    let key = prop::collection::vec(1u32..=3, 0..14);
    let ns = prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8)];
    prop_oneof![
        4 => (ns.clone(), key.clone(), 0..devices, 0i64..3, 0u8..4)
            .prop_map(|(ns, key, dev, prio, vals)| Op::Insert { ns, key, dev, prio, vals }),
        4 => (ns.clone(), key.clone(), 0..devices, any::<bool>())
            .prop_map(|(ns, key, dev, pin)| Op::Match { ns, key, dev, pin }),
        1 => (ns.clone(), key.clone()).prop_map(|(ns, key)| Op::Peek { ns, key }),
        1 => any::<usize>().prop_map(|idx| Op::PinHandle { idx }),
        2 => any::<usize>().prop_map(|idx| Op::Release { idx }),
        2 => (0..devices, 0usize..12).prop_map(|(dev, n)| Op::Evict { dev, n }),
        1 => (ns, key, 0..devices).prop_map(|(ns, key, dev)| Op::EvictFrom { ns, key, dev }),
    ]
}

/// The policies the sequential model reproduces exactly (all but sieve),
/// in `EvictionPolicy::ALL` order.
pub fn modelled() -> Vec<EvictionPolicy> {
    EvictionPolicy::ALL
        .into_iter()
        .filter(|p| p.is_stateless())
        .collect()
}

pub fn case_strategy() -> impl Strategy<Value = (usize, usize, EvictionPolicy, Vec<Op>)> {
    (
        1usize..=4,
        prop_oneof![Just(1usize), Just(2), Just(4)],
        0usize..modelled().len(),
    )
        .prop_flat_map(|(devices, ps, pol)| {
            (
                Just(devices),
                Just(ps),
                Just(modelled()[pol]),
                prop::collection::vec(op_strategy(devices), 1..80),
            )
        })
}

/// The values of an insert of `n` tokens at page size `ps`, drawn four
/// ways so that every encoding of the tree's value codec and its edges are
/// exercised: `0` one contiguous run from `next` (a request's slots
/// allocated together); `1` scattered (a multiplicative hash of `next + j`:
/// no two consecutive); `2` a contiguous run that ends at `u32::MAX`; `3`
/// whole pages with scattered bases, the last page ending at `u32::MAX`.
pub fn values_for(shape: u8, n: usize, ps: usize, next: u32) -> Vec<u32> {
    let n32 = n as u32;
    match shape {
        1 => (0..n32)
            .map(|j| next.wrapping_add(j).wrapping_mul(0x9E37_79B1) | 1)
            .collect(),
        2 => (0..n32).map(|j| u32::MAX - (n32 - 1) + j).collect(),
        3 => {
            let pages = n.div_ceil(ps) as u32;
            (0..n32)
                .map(|j| {
                    let page = j / ps as u32;
                    // The last page is the top of the value space; earlier
                    // ones sit far below it, each at its own base.
                    let base = if page + 1 == pages {
                        u32::MAX - (ps as u32 - 1)
                    } else {
                        (page + 1).wrapping_mul(0x0101_0101) % (u32::MAX / 2)
                    };
                    base + j % ps as u32
                })
                .collect()
        }
        _ => (0..n32).map(|j| next + j).collect(),
    }
}

pub fn run_case(
    devices: usize,
    ps: usize,
    policy: EvictionPolicy,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    run_case_tiers(devices, false, ps, policy, ops)
}

/// As [`run_case`]; with `host`, the last of the `devices` tiers is a host
/// tier (`devices - 1` devices plus `host_pages`): the model treats it as
/// one more device, which is what its residency is, and the cache's
/// tier-aware answers are checked against the model's per-tier lengths
/// (`peek` leaves the host out, `host_len` is the host's prefix, the
/// any-device answer counts devices only).
pub fn run_case_tiers(
    devices: usize,
    host: bool,
    ps: usize,
    policy: EvictionPolicy,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let gpus = devices - usize::from(host);
    // Tlru's budget small enough for the keys drawn here (up to 14
    // tokens) to cross it both ways; the other policies ignore it.
    let (threshold, estimate) = (4, 1);
    let mut b = RadixCache::builder()
        .page_size(ps)
        .devices(gpus)
        .eviction_policy(policy)
        .tlru_threshold(threshold)
        .tlru_next_prompt_estimate(estimate);
    if host {
        b = b.host_pages(64);
    }
    let cache = b.build().unwrap();
    // The model's tier `d`: a device, or the host tier after the devices.
    let tier = |d: usize| {
        if host && d == gpus {
            Tier::Host
        } else {
            Tier::Device(DeviceId(d as u32))
        }
    };
    let mut model = SequentialCache::new(ps, devices, policy).with_tlru(threshold, estimate);
    let mut handles: Vec<(NodeHandle, SeqHandle)> = Vec::new();
    let mut leases: Vec<(Lease, SeqHandle)> = Vec::new();
    let mut next_value = 1u32;
    // Places of earlier inserts (`insert_placed`): namespace, key, place,
    // and whether no removal ran since (it must still be in the tree).
    let mut places: Vec<(u8, Vec<u32>, TreePlace, bool)> = Vec::new();
    for (step, op) in ops.iter().enumerate() {
        match op {
            Op::Insert {
                ns,
                key,
                dev,
                prio,
                vals,
            } => {
                // Mostly aligned keys; a few unaligned ones test the error.
                let key = if key.len() % 5 == 4 {
                    key.clone()
                } else {
                    key[..key.len() / ps * ps].to_vec()
                };
                let values = values_for(*vals, key.len(), ps, next_value);
                next_value += key.len() as u32;
                let k = TokenKey::new(&key).in_namespace(ns_of(*ns));
                // Half the inserts keep their place (the same insert).
                let real = if vals % 2 == 0 {
                    cache
                        .insert_placed(k, tier(*dev), &values, *prio)
                        .map(|(r, place)| {
                            if let Some(p) = place {
                                places.push((*ns, key.clone(), p, true));
                            }
                            r
                        })
                } else {
                    cache.insert(k, tier(*dev), &values, *prio)
                };
                let want = model.insert(ns_of(*ns), &key, &values, *dev, *prio);
                match (&real, want) {
                    (Ok(r), Ok(p)) => {
                        prop_assert_eq!(r.prefix_len, p, "step {}: insert prefix_len", step);
                        let adopted: Vec<_> = if p < key.len() {
                            vec![p..key.len()]
                        } else {
                            vec![]
                        };
                        prop_assert_eq!(&r.adopted, &adopted, "step {}: adopted ranges", step);
                        prop_assert_eq!(r.duplicates(), if p > 0 { vec![0..p] } else { vec![] });
                    }
                    (Err(_), Err(_)) => {}
                    (r, w) => {
                        prop_assert!(false, "step {}: insert real {:?} model {:?}", step, r, w)
                    }
                }
            }
            Op::Match { ns, key, dev, pin } => {
                let k = TokenKey::new(key).in_namespace(ns_of(*ns));
                let want = model.match_prefix(ns_of(*ns), key, *dev);
                let r = if *pin {
                    cache.match_and_pin(k, tier(*dev)).unwrap()
                } else {
                    cache.match_prefix(k, tier(*dev)).unwrap()
                };
                prop_assert_eq!(r.len, want.len, "step {}: match len", step);
                let (any_len, any_device, host_len) = if host {
                    // Devices only for the any-device answer: the longest
                    // device prefix, the asked device if it ties, else the
                    // first that has it; the host's own prefix apart.
                    let lens = model.peek(ns_of(*ns), key);
                    let best = lens[..gpus].iter().copied().max().unwrap_or(0);
                    let dev = if best == 0 {
                        None
                    } else if *dev < gpus && lens[*dev] == best {
                        Some(*dev)
                    } else {
                        lens[..gpus].iter().position(|&l| l == best)
                    };
                    (best, dev, lens[gpus])
                } else {
                    (want.any_len, want.any_device, 0)
                };
                prop_assert_eq!(r.any_len, any_len, "step {}: any_len", step);
                prop_assert_eq!(
                    r.any_device.map(|d| d.index()),
                    any_device,
                    "step {}: any_device",
                    step
                );
                prop_assert_eq!(r.host_len, host_len, "step {}: host_len", step);
                if *pin {
                    prop_assert_eq!(&r.values, &want.values, "step {}: pinned values", step);
                    model.pin(&want.handle).unwrap();
                    leases.push((r.lease.unwrap(), want.handle));
                } else {
                    prop_assert!(r.values.is_empty());
                }
                handles.push((r.handle, want.handle));
            }
            Op::Peek { ns, key } => {
                let k = TokenKey::new(key).in_namespace(ns_of(*ns));
                let want = model.peek(ns_of(*ns), key);
                prop_assert_eq!(&cache.peek(k), &want[..gpus], "step {}: peek", step);
                let t = cache.peek_tiers(k);
                prop_assert_eq!(&t.devices, &want[..gpus], "step {}: peek_tiers", step);
                prop_assert_eq!(
                    t.host,
                    if host { want[gpus] } else { 0 },
                    "step {}: peek_tiers host",
                    step
                );
            }
            Op::PinHandle { idx } => {
                if handles.is_empty() {
                    continue;
                }
                let (h, mh) = &handles[idx % handles.len()];
                let real = cache.pin(h);
                let want = model.pin(mh);
                prop_assert_eq!(
                    real.is_ok(),
                    want.is_ok(),
                    "step {}: pin {:?} vs {:?}",
                    step,
                    real,
                    want
                );
                if let Ok(l) = real {
                    leases.push((l, *mh));
                }
            }
            Op::Release { idx } => {
                if leases.is_empty() {
                    continue;
                }
                let (l, mh) = leases.swap_remove(idx % leases.len());
                drop(l);
                model.unpin(&mh);
            }
            Op::EvictFrom { ns, key, dev } => {
                let whole = &key[..key.len() / ps * ps];
                let k = TokenKey::new(whole).in_namespace(ns_of(*ns));
                let place = places.iter().rev().find(|(pns, pkey, _, _)| {
                    !whole.is_empty() && pns == ns && pkey.starts_with(whole)
                });
                let from_place = match place {
                    Some((_, _, p, unchanged)) => {
                        let page = &whole[whole.len() - ps..];
                        // The key up to the page, read from the place, and
                        // whether the tier holds it.
                        let mut read = Vec::new();
                        let held = cache
                            .place_path(p, whole.len(), page, tier(*dev), &mut read)
                            .unwrap();
                        prop_assert!(held.is_some() || !unchanged, "step {}: place_path", step);
                        if let Some(held) = held {
                            prop_assert_eq!(&read[..], whole, "step {}: place_path key", step);
                            let want = model.peek(ns_of(*ns), whole)[*dev] == whole.len();
                            prop_assert_eq!(held, want, "step {}: place_path held", step);
                        }
                        let r = cache
                            .evict_from_place(p, whole.len(), page, tier(*dev))
                            .unwrap();
                        prop_assert!(
                            r.is_some() || !unchanged,
                            "step {}: a place left the tree with no removal since",
                            step
                        );
                        r
                    }
                    None => None,
                };
                // A place gone: the key's walk, as a router's index does
                // (with the place above, every other time).
                let (ev, above) = match from_place {
                    Some(e) => (e.evicted, e.above),
                    None if step % 2 == 0 => {
                        let e = cache.evict_from_with_place(k, tier(*dev)).unwrap();
                        (e.evicted, e.above)
                    }
                    None => (cache.evict_from(k, tier(*dev)).unwrap(), None),
                };
                for p in &mut places {
                    p.3 = false;
                }
                // The place above the page taken ends where that page
                // started, and is in the tree (an ancestor of a node that
                // was).
                if let Some(p) = above {
                    prop_assert_eq!(p.len(), whole.len() - ps, "step {}: place above", step);
                    places.push((*ns, whole[..p.len()].to_vec(), p, true));
                }
                let (tokens, mut values) = model.evict_from(ns_of(*ns), whole, *dev);
                prop_assert_eq!(ev.tokens, tokens, "step {}: evict_from tokens", step);
                let mut got = ev.values.clone();
                got.sort_unstable();
                values.sort_unstable();
                prop_assert_eq!(got, values, "step {}: evict_from values", step);
            }
            Op::Evict { dev, n } => {
                for p in &mut places {
                    p.3 = false;
                }
                let ev = cache.evict(tier(*dev), *n).unwrap();
                let (tokens, values) = model.evict(*dev, *n);
                prop_assert_eq!(ev.tokens, tokens, "step {}: evicted tokens", step);
                prop_assert_eq!(
                    &ev.values,
                    &values,
                    "step {}: evicted values (in order)",
                    step
                );
            }
        }
        for d in 0..devices {
            let s = cache.sizes(tier(d)).unwrap();
            let (e, p, t, n) = model.sizes(d);
            prop_assert_eq!(
                (s.evictable, s.protected, s.total, s.nodes),
                (e, p, t, n),
                "step {}: sizes on device {}",
                step,
                d
            );
        }
        prop_assert_eq!(
            cache.node_count() as usize,
            model.node_count(),
            "step {}: node count",
            step
        );
        if let Err(e) = cache.check() {
            prop_assert!(false, "step {}: audit: {}", step, e);
        }
    }
    drop(leases);
    cache.audit();
    Ok(())
}

/// Decodes fuzz bytes into a configuration and an op sequence: every byte
/// string is a valid case, so a byte-level mutator explores op sequences.
pub fn decode(bytes: &[u8]) -> (usize, usize, EvictionPolicy, Vec<Op>) {
    let mut it = bytes.iter().copied();
    let mut next = move || it.next();
    let devices = 1 + next().unwrap_or(0) as usize % 3;
    let ps = [1, 2, 4][next().unwrap_or(0) as usize % 3];
    let policies = modelled();
    let policy = policies[next().unwrap_or(0) as usize % policies.len()];
    let mut ops = Vec::new();
    while let Some(b) = next() {
        let arg = next().unwrap_or(0) as usize;
        let ns = (b >> 6) % 3;
        let dev = arg % devices;
        let mut key = || {
            let len = next().unwrap_or(0) as usize % 14;
            (0..len)
                .map(|_| 1 + next().unwrap_or(0) as u32 % 3)
                .collect::<Vec<u32>>()
        };
        ops.push(match b % 8 {
            0 | 1 => Op::Insert {
                ns,
                key: key(),
                dev,
                prio: (arg / 3 % 3) as i64,
                vals: (arg / 9 % 4) as u8,
            },
            2 | 3 => Op::Match {
                ns,
                key: key(),
                dev,
                pin: b & 8 != 0,
            },
            4 => Op::Peek { ns, key: key() },
            5 => Op::PinHandle { idx: arg },
            6 => Op::Release { idx: arg },
            _ => Op::Evict { dev, n: arg % 12 },
        });
    }
    (devices, ps, policy, ops)
}
