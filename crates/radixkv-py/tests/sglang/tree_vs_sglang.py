"""radixkv's tree against SGLang 0.5.23's own `RadixCache`, operation by
operation, on random sequences: inserts (priorities, namespaces as
`extra_key`, a request's `inserted_len`), matches (which split nodes),
locks and unlocks of matched nodes, evictions. After every operation the
two must agree on the insert's `prefix_len`, the match's length, the
evicted token count and the freed values in the order SGLang frees them,
and the evictable / protected / total sizes. Both run on a logical clock
(SGLang's `time` patched in its module), so eviction order is exact.

radixkv is configured as SGLang 0.5.23 behaves: hits counted on insert
past `inserted_len`, slru protected at 2 hits. Policies: SGLang's seven
(lru, lfu, fifo, mru, filo, priority, slru) against `RadixCache`, and
`tlru` against `UnifiedRadixCache` (its Rust tree core, SGLang's default;
SGLang accepts tlru for no other cache), each seed with one of three
(threshold, next prompt estimate) pairs; page sizes 1, 2, 4, 16.

Prints the operation count per configuration; on a difference, the seed
and the step that reproduce it, and exits 1.

The negative controls, each of which must fail the run:
`RADIXKV_DIFF_FAULT=priority` drops the insert priority on radixkv's side;
`RADIXKV_DIFF_FAULT=hits` counts hits on match (radixkv's default rule);
`RADIXKV_DIFF_FAULT=slru` protects a node after one hit since it became a
leaf (0.5.9's slru) rather than after 2 in all;
`RADIXKV_DIFF_FAULT=tlru` builds radixkv's tlru without its threshold
(lru's order).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from array import array

import radixkv
import torch
from sglang.srt.mem_cache import radix_cache as rc
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from logical_clock import LogicalClock

POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru")
PAGE_SIZES = (1, 2, 4, 16)
FAULT = os.environ.get("RADIXKV_DIFF_FAULT", "")


class RecordingAllocator:
    """The slot allocator SGLang's tree frees evicted values to: records
    each free call's values, in order."""

    def __init__(self, page_size: int) -> None:
        self.freed: list[list[int]] = []
        self.device = "cpu"
        self.page_size = page_size

    def free_segment(self, values, start_pos: int = 0) -> None:
        self.freed.append(values.tolist())

    def free(self, values) -> None:
        self.freed.append(values.tolist())


class Difference(AssertionError):
    pass


def check(cond: bool, *what) -> None:
    if not cond:
        raise Difference(what)


def tlru_config(seed: int, ps: int) -> tuple[int, int]:
    """Tlru's (threshold, next prompt estimate) for a seed, in tokens: SGLang's
    defaults (lru's order), a budget below the keys drawn here (up to 6
    pages, 6 pages deep and more), and one that the estimate offsets."""
    return [(0, 0), (3 * ps, ps), (5 * ps, 3 * ps)][seed % 3]


def run(seed: int, ps: int, policy: str, ops: int) -> int:
    rng = random.Random(seed)
    rc.time = LogicalClock()
    alloc = RecordingAllocator(ps)
    threshold, estimate = tlru_config(seed, ps) if policy == "tlru" else (0, 0)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=alloc,
        page_size=ps,
        eviction_policy=policy,
    )
    if policy == "tlru":
        # Its own stamps are a logical counter already.
        params.tree_components = (ComponentType.FULL,)
        params.eviction_policy_config = {"threshold": threshold, "next_prompt_estimate": estimate}
        sglang = UnifiedRadixCache(params)
    else:
        sglang = rc.RadixCache(params)
    ours = radixkv.RadixCache(
        page_size=ps,
        eviction_policy=policy,
        hit_counts="match" if FAULT == "hits" else "insert",
        slru_protected_threshold=2 if policy == "slru" and FAULT != "slru" else None,
        tlru_threshold=0 if FAULT == "tlru" else threshold,
        tlru_next_prompt_estimate=estimate,
    )
    next_value = 1
    held = []  # (SGLang's node, its lock receipt, our lease)
    for step in range(ops):
        op = rng.random()
        n = rng.randint(1, 6) * ps
        key = [rng.randint(0, 2) for _ in range(n)]
        ns = rng.choice([None, None, None, "a", "b"])
        where = (policy, ps, seed, step)
        if op < 0.45:
            values = list(range(next_value, next_value + n))
            next_value += n
            prio = rng.choice([0, 0, 0, 1, 5])
            inserted = rng.choice([0, 0, rng.randint(0, n // ps) * ps])
            a = sglang.insert(
                InsertParams(
                    key=rc.RadixKey(array("q", key), extra_key=ns),
                    value=torch.tensor(values, dtype=torch.int64),
                    priority=prio,
                    inserted_len=inserted,
                )
            ).prefix_len
            b = ours.insert(
                key,
                values,
                priority=0 if FAULT == "priority" else prio,
                namespace=ns,
                inserted_len=inserted,
            ).prefix_len
            check(a == b, where, "insert prefix_len", a, b)
        elif op < 0.75:
            m1 = sglang.match_prefix(MatchPrefixParams(key=rc.RadixKey(array("q", key), extra_key=ns)))
            m2 = ours.match_prefix(key, namespace=ns)
            check(m1.device_prefix_len == m2.len, where, "match len", m1.device_prefix_len, m2.len)
            if rng.random() < 0.4 and m1.device_prefix_len > 0:
                receipt = sglang.inc_lock_ref(m1.last_device_node)
                held.append((m1.last_device_node, receipt, ours.pin(m2.handle)))
        elif op < 0.85 and held:
            node, receipt, lease = held.pop(rng.randrange(len(held)))
            if isinstance(sglang, UnifiedRadixCache):
                # The unified tree releases by the receipt its lock gave.
                sglang.dec_lock_ref(node, receipt.to_dec_params())
            else:
                sglang.dec_lock_ref(node)
            lease.close()
        else:
            alloc.freed.clear()
            k = rng.randint(1, 12)
            e1 = sglang.evict(EvictParams(num_tokens=k)).num_tokens_evicted
            e2 = ours.evict(k)
            freed = [v for call in alloc.freed for v in call]
            check(e1 == e2.tokens, where, "evicted tokens", e1, e2.tokens)
            check(freed == e2.values.tolist(), where, "evicted values", freed, e2.values.tolist())
        s = ours.sizes()
        got = (s.evictable, s.protected, s.total)
        total = sglang.total_size()
        if isinstance(total, tuple):
            total = total[0]  # the unified tree's (device, host)
        want = (sglang.evictable_size(), sglang.protected_size(), total)
        check(got == want, where, "sizes (evictable, protected, total)", want, got)
    for _, _, lease in held:
        lease.close()
    ours.audit()
    return ops


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--ops", type=int, default=300)
    p.add_argument("--policies", default=",".join(POLICIES))
    a = p.parse_args()
    total = 0
    for policy in a.policies.split(","):
        for ps in PAGE_SIZES:
            count = 0
            for seed in range(a.seeds):
                try:
                    count += run(seed, ps, policy, a.ops)
                except Difference as e:
                    print(f"DIFFERENT: {e.args[0]}", flush=True)
                    print(f"reproduce: --policies {policy} (page size {ps}, seed {seed})", flush=True)
                    return 1
            theirs = "UnifiedRadixCache" if policy == "tlru" else "RadixCache"
            print(f"{policy:8s} page size {ps:2d}: {count} operations equal to SGLang's {theirs}", flush=True)
            total += count
    print(f"radixkv's tree equals SGLang 0.5.23's caches over {total} operations", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
