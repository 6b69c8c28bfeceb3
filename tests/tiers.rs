//! The host tier and copies between tiers (docs/tiers.md): a host
//! residency slot shared by all devices, prefix-closed and audited; matches
//! that report the host's and the other devices' further prefix; copies
//! that pin their source, own their destination pages until they complete,
//! and give everything back when cancelled; write-back on eviction.
//!
//! KV is simulated: every tier has a pool of `u64` "KV" per slot, and the
//! KV of token `i` of a key is a hash of the key's first `i + 1` tokens, so
//! a slot that holds another prefix's KV (a copy from the wrong place, or
//! from a page reused meanwhile) is caught.

use radixkv::{CacheError, DeviceId, PagedCache, RadixCache, SlotRun, Tier, TokenKey};
use std::collections::HashMap;
use std::sync::Arc;

const D0: DeviceId = DeviceId(0);
const D1: DeviceId = DeviceId(1);
const PS: usize = 4;

fn cache(devices: usize, pages: usize, host_pages: usize) -> Arc<PagedCache> {
    Arc::new(
        RadixCache::builder()
            .page_size(PS)
            .devices(devices)
            .pages_per_device(pages)
            .host_pages(host_pages)
            .build()
            .unwrap(),
    )
}

fn key(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| salt * 1000 + i).collect()
}

/// The KV a token would have: a hash of its whole prefix.
fn kv_of(tokens: &[u32], i: usize) -> u64 {
    tokens[..=i].iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| {
        (h ^ u64::from(t)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Simulated KV pools, one per tier.
#[derive(Default)]
struct Pools(HashMap<(Tier, u32), u64>);

impl Pools {
    /// "Prefill": writes the KV of `tokens[from..]` into `slots[from..]`.
    fn compute(&mut self, d: impl Into<Tier>, tokens: &[u32], slots: &[u32], from: usize) {
        let d = d.into();
        for (i, &s) in slots.iter().enumerate().take(tokens.len()).skip(from) {
            self.0.insert((d, s), kv_of(tokens, i));
        }
    }

    /// The copy engine: one transfer per run.
    fn copy(&mut self, from: impl Into<Tier>, to: impl Into<Tier>, runs: &[SlotRun]) {
        let (from, to) = (from.into(), to.into());
        for r in runs {
            for j in 0..r.len {
                let v = self.0.get(&(from, r.src + j)).copied();
                match v {
                    Some(v) => self.0.insert((to, r.dst + j), v),
                    None => self.0.remove(&(to, r.dst + j)),
                };
            }
        }
    }

    /// Whether `slots` on `d` hold the KV of `tokens`, token by token.
    fn holds(&self, d: impl Into<Tier>, tokens: &[u32], slots: &[u32]) -> bool {
        let d = d.into();
        slots
            .iter()
            .enumerate()
            .all(|(i, s)| self.0.get(&(d, *s)) == Some(&kv_of(tokens, i)))
    }
}

/// Caches `tokens` on `d` with freshly computed KV.
fn cache_on(c: &Arc<PagedCache>, pools: &mut Pools, d: impl Into<Tier>, tokens: &[u32]) {
    let d = d.into();
    let span = c.alloc(d, tokens.len()).unwrap();
    let slots: Vec<u32> = span.slots().collect();
    pools.compute(d, tokens, &slots, 0);
    c.insert_pages(TokenKey::new(tokens), span, 0).unwrap();
}

#[test]
fn a_bad_host_tier_or_copy_is_a_clear_error() {
    for pages in [0, 1] {
        let e = RadixCache::builder()
            .pages_per_device(8)
            .host_pages(pages)
            .build()
            .unwrap_err();
        assert!(
            matches!(&e, CacheError::InvalidConfig(m) if m.contains("host tier")),
            "{e}"
        );
    }
    let e = RadixCache::builder()
        .pages_per_device(64)
        .watermarks(4, 16)
        .host_pages(16)
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("host tier"), "{e}");
    // Without a host tier: no host, and write-back says why it cannot run.
    let plain = Arc::new(RadixCache::builder().pages_per_device(8).build().unwrap());
    assert!(!plain.has_host_tier());
    assert!(matches!(
        plain.evict_with_write_back(D0, 1, |_| true),
        Err(CacheError::NoHostTier)
    ));
    let c = cache(2, 8, 16);
    assert!(c.has_host_tier());
    assert_eq!(c.devices(), 2);
    let k = key(4, 1);
    assert!(matches!(
        c.copy_prefix(TokenKey::new(&k), D1, D1),
        Err(CacheError::CopyToItself(d)) if d == D1.into()
    ));
    assert!(matches!(
        c.copy_prefix(TokenKey::new(&k), D0, DeviceId(3)),
        Err(CacheError::UnknownDevice { .. })
    ));
    // Naming the host tier of a cache without one is a clear error too.
    assert!(matches!(
        plain.alloc(Tier::Host, 4),
        Err(CacheError::NoHostTier)
    ));
}

#[test]
fn the_host_tier_is_prefix_closed_evicted_leaves_first_and_audited() {
    let c = cache(2, 8, 32);
    let host = Tier::Host;
    let mut pools = Pools::default();
    let a = key(16, 1);
    let mut b = a[..8].to_vec();
    b.extend(key(8, 2));
    cache_on(&c, &mut pools, host, &a);
    cache_on(&c, &mut pools, host, &b); // shares a's first 8 tokens
    c.audit();
    assert_eq!(c.resident_tokens(host).unwrap(), 24);
    assert_eq!(c.sizes(host).unwrap().total, 24);
    // The host is not a device: `peek` leaves it out, `peek_tiers` has it.
    assert_eq!(c.peek(TokenKey::new(&a)), vec![0, 0]);
    let t = c.peek_tiers(TokenKey::new(&b));
    assert_eq!((t.devices, t.host), (vec![0, 0], 16));
    // Host eviction takes leaves first: the shared 8 tokens stay until
    // both suffixes are gone.
    let ev = c.evict(host, 1).unwrap();
    assert_eq!(ev.tokens, 8);
    c.audit();
    assert_eq!(c.resident_tokens(host).unwrap(), 16);
    c.evict(host, 1).unwrap();
    assert_eq!(c.resident_tokens(host).unwrap(), 8);
    c.evict(host, usize::MAX).unwrap();
    assert_eq!(c.resident_tokens(host).unwrap(), 0);
    assert_eq!(c.allocator(host).unwrap().free_pages(), 31);
    c.audit();
}

#[test]
fn a_match_reports_the_host_and_the_other_devices_further_prefix() {
    let c = cache(2, 16, 32);
    let host = Tier::Host;
    let mut pools = Pools::default();
    let k = key(32, 3);
    cache_on(&c, &mut pools, D0, &k[..8]);
    cache_on(&c, &mut pools, D1, &k[..16]);
    cache_on(&c, &mut pools, host, &k[..24]);
    let m = c.match_prefix(TokenKey::new(&k), D0).unwrap();
    assert_eq!((m.len, m.host_len), (8, 24));
    assert_eq!((m.any_len, m.any_device), (16, Some(D1)));
    // On a device that holds nothing, the host and the peer still show.
    let t = c.peek_tiers(TokenKey::new(&k));
    assert_eq!((t.devices, t.host), (vec![8, 16], 24));
    // Only on the host: no device reports it.
    let other = key(8, 4);
    cache_on(&c, &mut pools, host, &other);
    let m = c.match_prefix(TokenKey::new(&other), D1).unwrap();
    assert_eq!(
        (m.len, m.any_len, m.any_device, m.host_len),
        (0, 0, None, 8)
    );
    // A match on the host tier itself, pinned: a lease of its own tier.
    let m = c.match_and_pin(TokenKey::new(&k), host).unwrap();
    assert_eq!(m.len, 24);
    assert_eq!(m.lease.as_ref().unwrap().tier(), host);
    assert!(pools.holds(host, &k, &m.values));
    assert_eq!(c.sizes(host).unwrap().protected, 24);
    drop(m);
    assert_eq!(c.sizes(host).unwrap().protected, 0);
    c.audit();
}

#[test]
fn a_copy_moves_the_kv_and_a_cancelled_one_gives_everything_back() {
    let c = cache(2, 16, 32);
    let mut pools = Pools::default();
    let k = key(16, 5);
    cache_on(&c, &mut pools, D0, &k);
    cache_on(&c, &mut pools, D1, &k[..4]);
    let free1 = c.allocator(D1).unwrap().free_pages();
    // Cancelled: pages back, pins released, nothing resident.
    let copy = c.copy_prefix(TokenKey::new(&k), D0, D1).unwrap().unwrap();
    assert_eq!(
        (copy.source(), copy.dest(), copy.range()),
        (D0.into(), D1.into(), 4..16)
    );
    assert_eq!(c.allocator(D1).unwrap().free_pages(), free1 - 3);
    assert_eq!(c.sizes(D0).unwrap().protected, 16, "the source is pinned");
    drop(copy);
    assert_eq!(c.allocator(D1).unwrap().free_pages(), free1);
    assert_eq!(
        (
            c.sizes(D0).unwrap().protected,
            c.sizes(D1).unwrap().protected
        ),
        (0, 0)
    );
    assert_eq!(c.peek(TokenKey::new(&k)), vec![16, 4]);
    c.audit();
    // Completed: the KV moved run by run, resident on D1.
    let copy = c.copy_prefix(TokenKey::new(&k), D0, D1).unwrap().unwrap();
    let runs = copy.runs();
    assert_eq!(runs.iter().map(|r| r.len as usize).sum::<usize>(), 12);
    assert!(
        runs.len() <= 3,
        "pages allocated together are runs: {runs:?}"
    );
    assert_eq!(copy.dest_slots().len(), copy.source_slots().len());
    pools.copy(D0, D1, &runs);
    let r = copy.complete().unwrap();
    assert_eq!(r.prefix_len, 4);
    assert_eq!(c.peek(TokenKey::new(&k)), vec![16, 16]);
    let m = c.match_and_pin(TokenKey::new(&k), D1).unwrap();
    assert!(
        pools.holds(D1, &k, &m.values),
        "device 1 holds the copied KV"
    );
    drop(m);
    // Nothing more to copy.
    assert!(c.copy_prefix(TokenKey::new(&k), D0, D1).unwrap().is_none());
    c.audit();
}

#[test]
fn a_copys_source_pin_holds_under_an_evictor() {
    let c = cache(2, 16, 32);
    let mut pools = Pools::default();
    let k = key(16, 6);
    cache_on(&c, &mut pools, D0, &k);
    let copy = c.copy_prefix(TokenKey::new(&k), D0, D1).unwrap().unwrap();
    // The evictor wants everything on D0: the copy's source stays.
    let ev = c.evict(D0, usize::MAX).unwrap();
    assert_eq!(ev.tokens, 0);
    assert!(copy
        .source_slots()
        .iter()
        .all(|&s| !c.allocator(D0).unwrap().is_free(s / PS as u32)));
    pools.copy(D0, D1, &copy.runs());
    copy.complete().unwrap();
    // Released: now it can go.
    assert_eq!(c.evict(D0, usize::MAX).unwrap().tokens, 16);
    let m = c.match_and_pin(TokenKey::new(&k), D1).unwrap();
    assert!(pools.holds(D1, &k, &m.values));
    drop(m);
    c.audit();
}

#[test]
fn a_copy_that_loses_to_a_concurrent_insert_frees_its_pages() {
    let c = cache(2, 16, 32);
    let mut pools = Pools::default();
    let k = key(8, 7);
    cache_on(&c, &mut pools, D0, &k);
    let copy = c.copy_prefix(TokenKey::new(&k), D0, D1).unwrap().unwrap();
    // Another scheduler computes and caches the same prefix on D1 first.
    cache_on(&c, &mut pools, D1, &k);
    let free1 = c.allocator(D1).unwrap().free_pages();
    pools.copy(D0, D1, &copy.runs());
    let r = copy.complete().unwrap();
    assert_eq!(r.prefix_len, 8, "all of the copy was a duplicate");
    assert_eq!(c.allocator(D1).unwrap().free_pages(), free1 + 2);
    assert_eq!(c.peek(TokenKey::new(&k)), vec![8, 8]);
    c.audit();
}

#[test]
fn a_request_loads_its_prefix_from_the_host_instead_of_recomputing_it() {
    let c = cache(2, 16, 32);
    let host = Tier::Host;
    let mut pools = Pools::default();
    let prompt = key(13, 8); // 3 whole pages and one token
    cache_on(&c, &mut pools, host, &prompt[..12]);
    let mut r = c.begin(TokenKey::new(&prompt), D1).unwrap();
    assert_eq!(r.cached_len(), 0);
    let copy = r.copy_from(host).unwrap().unwrap();
    assert_eq!(copy.range(), 0..12);
    pools.copy(host, D1, &copy.runs());
    copy.complete().unwrap();
    assert_eq!(r.cached_len(), 12, "loaded, not recomputed");
    assert!(r.copy_from(host).unwrap().is_none(), "nothing more to load");
    r.reserve().unwrap();
    let slots = r.slots();
    assert!(pools.holds(D1, &prompt[..12], &slots[..12]));
    pools.compute(D1, &prompt, &slots, 12); // the last token, computed
    r.finish().unwrap();
    assert_eq!(c.peek_tiers(TokenKey::new(&prompt)).devices, vec![0, 12]);
    // A cancelled load leaves the request as it was.
    let mut r = c.begin(TokenKey::new(&prompt), D0).unwrap();
    drop(r.copy_from(D1).unwrap().unwrap());
    assert_eq!(r.cached_len(), 0);
    drop(r);
    assert_eq!(c.sizes(D1).unwrap().protected, 0);
    c.audit();
}

#[test]
fn write_back_keeps_evicted_prefixes_loadable_from_the_host() {
    let c = cache(2, 16, 64);
    let host = Tier::Host;
    let mut pools = Pools::default();
    let a = key(16, 9);
    let mut b = a[..8].to_vec();
    b.extend(key(8, 10));
    cache_on(&c, &mut pools, D0, &a);
    cache_on(&c, &mut pools, D0, &b);
    let mut copies = 0;
    let ev = c
        .evict_with_write_back(D0, usize::MAX, |copy| {
            copies += 1;
            pools.copy(D0, host, &copy.runs());
            true
        })
        .unwrap();
    assert_eq!(ev.tokens, 24);
    // The first victim's copy carries the shared 8 tokens with it (the
    // host stays prefix-closed), the second adds only its own 8, and the
    // shared node, a leaf last, is on the host already: no third copy.
    assert_eq!((ev.written_back, copies), (24, 2));
    assert_eq!(c.resident_tokens(D0).unwrap(), 0);
    for k in [&a, &b] {
        let t = c.peek_tiers(TokenKey::new(k));
        assert_eq!((t.devices[0], t.host), (0, 16));
        let m = c.match_and_pin(TokenKey::new(k), host).unwrap();
        assert!(pools.holds(host, k, &m.values), "the host holds the KV");
    }
    c.audit();
    // A write that fails: the victim goes anyway, nothing on the host.
    let d = key(8, 11);
    cache_on(&c, &mut pools, D1, &d);
    let ev = c.evict_with_write_back(D1, usize::MAX, |_| false).unwrap();
    assert_eq!((ev.tokens, ev.written_back), (8, 0));
    assert_eq!(c.peek_tiers(TokenKey::new(&d)).host, 0);
    c.audit();
}

/// Schedulers that load prefixes from the host or a peer, compute the
/// rest and cache it, while evictors write devices back to the host and
/// evict the host: afterwards every prefix resident on any tier holds its
/// own KV (a copy read from a page evicted and reused meanwhile would
/// hold another prefix's), and the audit (I1, I2, I6 per tier) passes.
/// Nothing here depends on how the threads interleave.
#[test]
fn copies_write_backs_and_evictions_race_without_losing_kv() {
    use std::sync::Mutex;
    let c = cache(2, 48, 96);
    let host = Tier::Host;
    let pools = Arc::new(Mutex::new(Pools::default()));
    let prompts: Vec<Vec<u32>> = (0..6).map(|p| key(24, 20 + p)).collect();
    let request = |p: usize, r: u32| {
        let mut k = prompts[p % prompts.len()].clone();
        k.extend((0..9).map(|i| 90_000 + r * 16 + i));
        k
    };
    let ops: u32 = std::env::var("RADIXKV_STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(300, |n: u32| (n / 80).max(300));
    std::thread::scope(|s| {
        for (t, d) in [(0u32, D0), (1, D1)] {
            let (c, pools) = (Arc::clone(&c), Arc::clone(&pools));
            let request = &request;
            s.spawn(move || {
                for r in 0..ops {
                    let k = request((r * 7 + t) as usize, r * 2 + t);
                    let Ok(mut req) = c.begin(TokenKey::new(&k), d) else {
                        continue;
                    };
                    // Load what another tier holds beyond the local prefix.
                    let other = if r % 2 == 0 {
                        host
                    } else {
                        DeviceId(1 - d.0).into()
                    };
                    if let Ok(Some(copy)) = req.copy_from(other) {
                        pools.lock().unwrap().copy(other, d, &copy.runs());
                        copy.complete().unwrap();
                    }
                    if req.reserve().is_err() {
                        continue; // everything pinned: drop the request
                    }
                    let from = req.cached_len();
                    let slots = req.slots();
                    pools.lock().unwrap().compute(d, &k, &slots, from);
                    req.finish().unwrap();
                    if r % 5 == 0 {
                        // Write-through of this prefix to the host.
                        if let Ok(Some(copy)) = c.copy_prefix(TokenKey::new(&k[..32]), d, host) {
                            pools.lock().unwrap().copy(d, host, &copy.runs());
                            copy.complete().unwrap();
                        }
                    }
                }
            });
        }
        let (c2, pools2) = (Arc::clone(&c), Arc::clone(&pools));
        s.spawn(move || {
            for r in 0..ops / 4 {
                let d = DeviceId(r % 2);
                c2.evict_with_write_back(d, 32, |copy| {
                    pools2.lock().unwrap().copy(d, host, &copy.runs());
                    true
                })
                .unwrap();
                c2.evict(host, 16).unwrap();
            }
        });
    });
    c.audit();
    let mut pools = pools.lock().unwrap();
    // A sequential tail (no evictor runs now): one more request, loading
    // what the host holds, so the check below always has a prefix to look
    // at, whatever the threads above did.
    let last = request(0, 2 * ops);
    let mut req = c.begin(TokenKey::new(&last), D0).unwrap();
    if let Ok(Some(copy)) = req.copy_from(host) {
        pools.copy(host, D0, &copy.runs());
        copy.complete().unwrap();
    }
    req.reserve().unwrap();
    let (from, slots) = (req.cached_len(), req.slots());
    pools.compute(D0, &last, &slots, from);
    req.finish().unwrap();
    assert_eq!(
        c.peek(TokenKey::new(&last))[0],
        32,
        "the tail request is cached"
    );
    let mut checked = 0;
    for p in 0..prompts.len() as u32 {
        for r in 0..=2 * ops {
            let k = request(p as usize, r);
            for tier in [D0.into(), D1.into(), host] {
                let m = c.match_and_pin(TokenKey::new(&k), tier).unwrap();
                assert!(
                    pools.holds(tier, &k[..m.len], &m.values),
                    "{tier}: the {} resident tokens of a request hold another prefix's KV",
                    m.len
                );
                checked += m.len;
            }
        }
    }
    assert!(checked > 0);
    c.audit();
}
