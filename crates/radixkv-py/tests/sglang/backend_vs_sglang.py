"""radixkv's SGLang backend (`radixkv.sglang.RadixKVCache`) against SGLang
0.5.23's own `RadixCache`, request by request, the way SGLang's scheduler
drives a prefix cache.

Two worlds, each a cache with its own real `ReqToTokenPool` and CPU KV
allocator (`TokenToKVPoolAllocator` at page size 1,
`PagedTokenToKVPoolAllocator` above), receive the same random sequence of
scheduler steps:

* arrival of a request (prompts share a few system prompts; namespaces by
  `extra_key` — one registered as a LoRA adapter in the KV-event name
  table — and `cache_salt`; priorities);
* admission of the waiting queue's head: `match_kv_cache` (SGLang's own,
  with `max_prefix_len = input_len - 1`), `lock`, `prefix_device_indices`,
  eviction of the shortfall through `evict_for_alloc`, a row and slots
  from the pool and allocator, the row written, and `checkpoint` after the
  chunk (chunked prefill: prompts longer than a chunk take several);
* the next chunk of a running request (`checkpoint` again);
* decode steps (a slot each, no checkpoint);
* release of a finished request (`checkpoint`, `free_kv_row`, `unlock`,
  the row freed: SGLang's `release_kv_cache` with `checkpoint=True`) or
  of an aborted one (the same without the checkpoint);
* explicit evictions, `touch_prefix`, and ordering the waiting queue with
  SGLang's own `SchedulePolicy` under `lpm` and `dfs-weight`.

After every step both worlds must agree on everything SGLang can see:
match lengths and prefix indices, evicted counts, the allocator's free
list (its order decides later allocations), every live row of the pool
and each request's protected and inserted lengths, the cache's sizes, the
KV events (msgpack-equal) and the queue orders. Both caches run on a
logical clock (SGLang's `time` patched in its module).

Prints the operation count per configuration, or the first difference
with the seed that reproduces it, and exits 1.

`RADIXKV_DIFF_FAULT=free_order` (the negative control) runs a backend that
frees an eviction's slots in one call instead of one call per node, as
SGLang does: at page sizes above 1 the allocator's free list then differs
and the run must fail.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import warnings
from array import array
from collections import Counter
from types import SimpleNamespace

warnings.filterwarnings("ignore")

import msgspec  # noqa: E402
import torch  # noqa: E402
from radixkv.sglang import RadixKVCache  # noqa: E402
from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.managers.schedule_policy import SchedulePolicy  # noqa: E402
from sglang.srt.mem_cache import radix_cache as rc  # noqa: E402
from sglang.srt.mem_cache.allocator import (  # noqa: E402
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, EvictResult  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.common import match_kv_cache  # noqa: E402
from sglang.srt.mem_cache.events import KvEventLoraNames  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

from logical_clock import LogicalClock  # noqa: E402

POLICIES = ("lru", "lfu", "slru", "priority")
PAGE_SIZES = (1, 2, 4, 16, 64)
FAULT = os.environ.get("RADIXKV_DIFF_FAULT", "")
NAMESPACES = ((None, None), (None, None), ("lora-x", None), ("k", None), (None, "salt"), ("", None))

POOL_ROWS = 24
CHUNK_PAGES = 4


class Difference(AssertionError):
    pass


def check(cond: bool, *what) -> None:
    if not cond:
        raise Difference(what)


class OneCallEviction(RadixKVCache):
    """The negative control: an eviction's slots freed in one call."""

    def evict(self, params: EvictParams) -> EvictResult:
        tokens, values, _ = self._tree.evict(max(params.num_tokens, 0))
        if tokens:
            self.token_to_kv_pool_allocator.free_segment(self._on_device(values), start_pos=0)
            self._drain()
        return EvictResult(num_tokens_evicted=tokens)


class World:
    """A cache with its own pool, allocator and requests. `lora_names`:
    "table" (one adapter registered) or None (what
    `RadixCache.create_simulated` passes, an empty table to SGLang)."""

    def __init__(self, kind: str, ps: int, policy: str, config, slots: int, lora_names="table") -> None:
        self.ps = ps
        # Room for the longest request `prompts` makes, and its outputs.
        context = 13 * ps + 16
        self.pool = ReqToTokenPool(size=POOL_ROWS, max_context_len=context, device="cpu", enable_memory_saver=False)
        if ps == 1:
            self.alloc = TokenToKVPoolAllocator(
                size=slots, dtype=torch.float16, device="cpu", kvcache=None, need_sort=False
            )
        else:
            self.alloc = PagedTokenToKVPoolAllocator(
                size=slots, page_size=ps, dtype=torch.float16, device="cpu", kvcache=None, need_sort=False
            )
        names = None
        if lora_names == "table":
            names = KvEventLoraNames()
            names.register(SimpleNamespace(lora_id="x", extra_key="lora-x"), lora_name="adapter-x")
        params = CacheInitParams(
            disable=False,
            req_to_token_pool=self.pool,
            token_to_kv_pool_allocator=self.alloc,
            page_size=ps,
            eviction_policy=policy,
            eviction_policy_config=config,
            enable_kv_cache_events=True,
            kv_event_lora_names=names,
        )
        self.cache = self.make_cache(kind, params)
        self.waiting: list = []
        self.running: dict = {}

    def make_cache(self, kind: str, params: CacheInitParams):
        if kind == "sglang":
            return rc.RadixCache(params)
        if FAULT == "free_order":
            return OneCallEviction(params)
        return RadixKVCache(params)

    # -- what both worlds are compared on ------------------------------------------

    def state(self):
        a = self.alloc
        free = a.free_pages.tolist()
        released = getattr(a, "release_pages", None)
        extra = [] if released is None else released.tolist()
        extra += [t.tolist() for t in getattr(a, "staged_pages", None) or []]
        rows = {}
        for rid, r in sorted(self.running.items()):
            idx = r.kv.req_pool_idx
            rows[rid] = (
                idx,
                self.pool.req_to_token[idx, : r.kv.kv_allocated_len].tolist(),
                r.kv.cache_protected_len,
                r.kv.cache_inserted_len,
                r.prefix_len,
            )
        c = self.cache
        return (free, extra, rows, c.evictable_size(), c.protected_size(), c.total_size())

    def events(self) -> bytes:
        return msgspec.msgpack.encode(self.cache.take_events())

    # -- scheduler steps --------------------------------------------------------------

    def arrive(self, rid: str, prompt: list, ns, priority, max_new: int) -> None:
        extra_key, salt = ns
        r = Req(
            rid=rid,
            origin_input_text="",
            origin_input_ids=array("q", prompt),
            sampling_params=SamplingParams(temperature=0, max_new_tokens=max_new),
            priority=priority,
        )
        r.extra_key = extra_key
        r.cache_salt = salt
        self.waiting.append(r)

    def order(self, policy: str) -> list:
        SchedulePolicy(policy, self.cache, False, False, False).calc_priority(self.waiting)
        return [r.rid for r in self.waiting]

    def _slots(self, r, start: int, end: int):
        """Slots for row positions [start, end) of `r` (start on a page
        boundary or continuing the row's last page), or None."""
        n = end - start
        if self.ps == 1:
            return self.alloc.alloc(n)
        idx = r.kv.req_pool_idx
        last = int(self.pool.req_to_token[idx, start - 1]) if start > 0 else -1
        t = lambda v: torch.tensor([v], dtype=torch.int64)  # noqa: E731
        return self.alloc.alloc_extend(t(start), t(start), t(end), t(end), t(last), n)

    def _need(self, start: int, end: int) -> int:
        ps = self.ps
        return (-(-end // ps) - (-(-start // ps))) * ps

    def _make_room(self, need: int) -> None:
        avail = self.alloc.available_size()
        if need > avail:
            self.cache.evict_for_alloc(EvictParams(num_tokens=need - avail))

    def admit(self) -> tuple:
        """Admits the waiting queue's head (its first chunk): what it saw."""
        r = self.waiting[0]
        r.refresh_fill_ids()
        fill = r.full_untruncated_fill_ids
        m = match_kv_cache(r, self.cache, fill, max_prefix_len=len(fill) - 1)
        r.kv.cache_protected_len = r.prefix_len
        r.lock = self.cache.lock(r.last_node)
        prefix = self.cache.prefix_device_indices(r).tolist()
        end = min(len(fill), r.prefix_len + CHUNK_PAGES * self.ps)
        self._make_room(self._need(r.prefix_len, end))
        if self.alloc.available_size() < self._need(r.prefix_len, end) or not self.pool.free_slots:
            self.cache.unlock(r.lock)
            r.lock = None
            return ("no room", m.device_prefix_len, prefix)
        self.waiting.pop(0)
        self.pool.alloc([r])
        idx = r.kv.req_pool_idx
        if prefix:
            self.pool.write((idx, slice(0, r.prefix_len)), torch.tensor(prefix, dtype=torch.int32))
        slots = self._slots(r, r.prefix_len, end)
        self.pool.write((idx, slice(r.prefix_len, end)), slots.to(torch.int32))
        r.kv.kv_allocated_len = r.kv.kv_committed_len = end
        r.extend_end = end
        self.cache.checkpoint(r, up_to=end)
        r.prefix_len = end
        self.running[r.rid] = r
        return ("admitted", m.device_prefix_len, prefix)

    def advance(self, rid: str) -> str:
        """The next chunk of a prompt, or one decode step."""
        r = self.running[rid]
        n = r.kv.kv_committed_len
        prompt = len(r.origin_input_ids)
        if n < prompt:
            end = min(prompt, n + CHUNK_PAGES * self.ps)
            self._make_room(self._need(n, end))
            if self.alloc.available_size() < self._need(n, end):
                return "no room"
            slots = self._slots(r, n, end)
            self.pool.write((r.kv.req_pool_idx, slice(n, end)), slots.to(torch.int32))
            r.kv.kv_allocated_len = r.kv.kv_committed_len = end
            r.extend_end = end
            self.cache.checkpoint(r, up_to=end)
            r.prefix_len = end
            return "chunk"
        # A decode step: the next token (the same in both worlds: derived
        # from the position) and one slot.
        self._make_room(self._need(n, n + 1))
        if self.alloc.available_size() < self._need(n, n + 1):
            return "no room"
        slot = self._slots(r, n, n + 1)
        self.pool.write((r.kv.req_pool_idx, slice(n, n + 1)), slot.to(torch.int32))
        r.output_ids.append((n * 7) % 5)
        r.kv.kv_allocated_len = r.kv.kv_committed_len = n + 1
        return "decode"

    def release(self, rid: str, checkpoint: bool) -> None:
        """SGLang's `release_kv_cache` for a request that finished
        (`checkpoint`) or was aborted."""
        r = self.running.pop(rid)
        owned = r.kv.kv_committed_len
        if checkpoint:
            r.refresh_fill_ids()
            self.cache.checkpoint(r, up_to=owned)
        self.cache.free_kv_row(r.kv, [(r.kv.cache_protected_len, owned)])
        self.cache.unlock(r.lock)
        r.lock = None
        self.cache.on_release(r, checkpointed=checkpoint)
        self.pool.free(r)
        r.kv.mark_kv_released()


def prompts(rng: random.Random, ps: int):
    """Prompts that share system prompts (whole and partial pages)."""
    systems = [[rng.randint(1, 4) for _ in range(rng.randint(1, 6) * ps + rng.randint(0, ps))] for _ in range(4)]

    def make() -> list:
        head = rng.choice(systems + [[]])
        tail = [rng.randint(1, 6) for _ in range(rng.randint(1, 5 * ps + 3))]
        return head + tail

    return make


def run(seed: int, ps: int, policy: str, steps: int, seen: Counter) -> int:
    rng = random.Random(seed)
    rc.time = LogicalClock()
    config = {"protected_threshold": rng.choice([1, 2, 3])} if policy == "slru" else None
    slots = rng.choice([24, 48, 96]) * ps
    # None: the LoRA name table RadixCache.create_simulated leaves unset.
    names = rng.choice(["table", "table", None])
    worlds = [World(k, ps, policy, config, slots, names) for k in ("sglang", "radixkv")]
    make = prompts(rng, ps)
    ops = 0
    next_rid = 0
    for step in range(steps):
        where = (policy, ps, seed, step)
        x = rng.random()
        running = sorted(worlds[0].running)
        if x < 0.25 or (not running and not worlds[0].waiting):
            rid = f"r{next_rid}"
            next_rid += 1
            prompt = make()
            ns = rng.choice(NAMESPACES)
            prio = rng.choice([None, None, 0, 1, 3])
            max_new = rng.randint(1, 6)
            for w in worlds:
                w.arrive(rid, prompt, ns, prio, max_new)
            what = "arrive"
        elif x < 0.45 and worlds[0].waiting:
            if rng.random() < 0.3:
                pol = rng.choice(["lpm", "dfs-weight"])
                got = [w.order(pol) for w in worlds]
                check(got[0] == got[1], where, f"{pol} order", *got)
                seen["queue orders"] += 1
            got = [w.admit() for w in worlds]
            check(got[0] == got[1], where, "admit (outcome, prefix_len, prefix indices)", *got)
            what = "admit"
            seen["admissions with a hit" if got[0][1] else "admissions"] += 1
        elif x < 0.75 and running:
            rid = rng.choice(running)
            r0 = worlds[0].running[rid]
            if (
                r0.kv.kv_committed_len >= len(r0.origin_input_ids)
                and len(r0.output_ids) >= r0.sampling_params.max_new_tokens
            ):
                for w in worlds:
                    w.release(rid, checkpoint=True)
                what = "finish"
                seen["finished"] += 1
            else:
                got = [w.advance(rid) for w in worlds]
                check(got[0] == got[1], where, "advance", *got)
                what = "advance"
                seen[got[0]] += 1
        elif x < 0.82 and running:
            rid = rng.choice(running)
            for w in worlds:
                w.release(rid, checkpoint=False)
            what = "abort"
        elif x < 0.92:
            k = rng.randint(0, 4 * ps)
            got = [w.cache.evict(EvictParams(num_tokens=k)).num_tokens_evicted for w in worlds]
            check(got[0] == got[1], where, "evicted", *got)
            what = "evict"
            seen["tokens evicted"] += got[0]
        elif worlds[0].waiting:
            i = rng.randrange(len(worlds[0].waiting))
            for w in worlds:
                r = w.waiting[i]
                w.cache.touch_prefix(rc.RadixKey(r.origin_input_ids, r.extra_key, cache_salt=r.cache_salt))
            what = "touch"
        else:
            continue
        ops += 1
        s = [w.state() for w in worlds]
        check(s[0] == s[1], where, what, "state (free pages, released, rows, evictable, protected, total)", *s)
        e = [w.events() for w in worlds]
        for ev in msgspec.msgpack.decode(e[0]):
            seen[ev.get("type", "?") if isinstance(ev, dict) else "?"] += 1
        check(
            e[0] == e[1],
            where,
            what,
            "events",
            msgspec.msgpack.decode(e[0]),
            msgspec.msgpack.decode(e[1]),
        )
    # Everyone leaves, then everything is evicted: both end empty and equal.
    for rid in sorted(worlds[0].running):
        for w in worlds:
            w.release(rid, checkpoint=True)
    got = [w.cache.evict(EvictParams(num_tokens=1 << 30)).num_tokens_evicted for w in worlds]
    check(got[0] == got[1], (policy, ps, seed, "end"), "final eviction", *got)
    s = [w.state() for w in worlds]
    check(s[0] == s[1], (policy, ps, seed, "end"), "final state", *s)
    check(worlds[1].cache.total_size() == 0, (policy, ps, seed, "end"), "empty at the end")
    e = [w.events() for w in worlds]
    check(e[0] == e[1], (policy, ps, seed, "end"), "final events")
    worlds[1].cache.sanity_check()
    return ops


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=6)
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--page-sizes", default=",".join(map(str, PAGE_SIZES)))
    a = p.parse_args()
    total = sweep(a, run, "scheduler steps equal to SGLang's RadixCache")
    if total is None:
        return 1
    print(f"radixkv's SGLang backend equals SGLang 0.5.23's RadixCache over {total} scheduler steps", flush=True)
    return 0


def sweep(a, run, what: str, after=None):
    """Runs `run(seed, page_size, policy, steps, seen)` for every policy,
    page size and seed of the arguments `a`, printing a line per policy and
    page size (`after(page_size, policy)` adds to it); the steps in all, or
    None after printing the first difference."""
    total = 0
    for policy in a.policies.split(","):
        for ps in map(int, a.page_sizes.split(",")):
            count = 0
            seen: Counter = Counter()
            for seed in range(a.seeds):
                try:
                    count += run(seed, ps, policy, a.steps, seen)
                except Difference as e:
                    print(f"DIFFERENT: {e.args[0]}", flush=True)
                    print(f"reproduce: --policies {policy} --page-sizes {ps} (seed {seed})", flush=True)
                    return None
            try:
                extra = "" if after is None else after(ps, policy)
            except Difference as e:
                print(f"DIFFERENT: {e.args[0]}", flush=True)
                return None
            print(
                f"{policy:8s} page size {ps:2d}: {count} {what}{extra}"
                f" ({', '.join(f'{k} {v}' for k, v in sorted(seen.items()))})",
                flush=True,
            )
            total += count
    return total


if __name__ == "__main__":
    sys.exit(main())
