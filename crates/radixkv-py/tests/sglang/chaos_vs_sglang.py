"""Chaos against SGLang 0.5.23's own `RadixCache`: radixkv's backend
(`radixkv.sglang.RadixKVCache`) and SGLang's cache, each with its own real
`ReqToTokenPool` and KV allocator, driven by random scheduler call
sequences that include what the request-by-request differential
(backend_vs_sglang.py, whose worlds this extends) never does:

* abort at every point of a request's life: right after its match (locked,
  no row yet), mid-chunk (slots allocated, nothing checkpointed), right
  after a checkpoint, mid-decode;
* retraction (released without a checkpoint, the shortfall evicted, back
  to the queue with its state reset by SGLang's own `reset_for_retract`);
* `checkpoint` with any `up_to`: below what the tree protects for the
  request, equal, inside the slots it holds, past its key, past its slots;
* `reset` with requests in flight (with the pool and allocator cleared, as
  SGLang's `flush_cache` does), then the old requests' locks released;
* `evict` of more than is evictable;
* a second lock on a node a running request holds, released again; a
  release of a node that only a descendant's lock protects;
* KV-event LoRA tables left `None` (as `create_simulated` leaves them);
* two Python threads on one backend (its own phase: SGLang's cache is not
  thread-safe, so there radixkv is checked alone).

A call SGLang defines is made in both worlds and must give the same
results, free lists, rows, sizes and KV events (msgpack-equal). A call
SGLang does not define (it would hand tree-owned slots to a request, or
insert slots nobody holds) is made on radixkv's backend only, which must
refuse it with an `Exception` and change nothing; if it accepts, it is
made in SGLang's world too and the slot accounting below catches what
follows. After every step, in each world: the allocator's free pages, the
live requests' own pages and the tree's pages are each page of the pool
exactly once (SGLang's tree walked; radixkv's tree counted by its size),
no size exceeds the pool, and nothing but an `Exception` escaped.

`RADIXKV_DIFF_FAULT=old_checkpoint` (the negative control) runs the
backend's checkpoint as it was in c5b5d3e (it lowered the protected length
when `up_to` fell below it): the run must fail.

Prints the step count per configuration, or the first difference with the
seed that reproduces it, and exits 1.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import warnings
from collections import Counter

warnings.filterwarnings("ignore")

import msgspec  # noqa: E402
import torch  # noqa: E402
from radixkv.errors import CacheError  # noqa: E402
from radixkv.sglang import RadixKVCache  # noqa: E402
from sglang.srt.mem_cache import radix_cache as rc  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    IncLockRefResult,
    MatchPrefixParams,
    TreeLock,
)

from backend_vs_sglang import CHUNK_PAGES, NAMESPACES, Difference, World, check, prompts, sweep  # noqa: E402
from logical_clock import LogicalClock  # noqa: E402

FAULT = os.environ.get("RADIXKV_DIFF_FAULT", "")
POLICIES = ("lru", "lfu", "slru", "priority")
PAGE_SIZES = (1, 2, 4, 16)


class OldCheckpoint(RadixKVCache):
    """The negative control: the backend's checkpoint as c5b5d3e had it,
    which took any `up_to` and set the protected length to it (on today's
    tree call, which also locks the end node)."""

    def checkpoint(self, req, *, up_to: int, **kwargs) -> None:
        kv = req.kv
        ids = req.full_untruncated_fill_ids
        key_len = min(len(ids), up_to) // self.page_size * self.page_size
        row = self.req_to_token_pool.req_to_token[kv.req_pool_idx]
        prefix_len, node, path, delta = self._tree.checkpoint(
            ids,
            row[:key_len],
            key_len,
            req.extra_key,
            req.cache_salt,
            req.priority or 0,
            kv.cache_inserted_len,
            len(req.origin_input_ids),
        )
        kv.cache_inserted_len = max(kv.cache_inserted_len, key_len)
        cpl = kv.cache_protected_len
        self.token_to_kv_pool_allocator.free_segment(row[cpl:prefix_len], start_pos=cpl)
        if self._events_on:
            self._drain()
        new_indices = self._on_device(path)
        self.req_to_token_pool.write((kv.req_pool_idx, slice(cpl, len(new_indices))), new_indices[cpl:])
        kv.cache_protected_len = len(new_indices)
        self.unlock(req.lock)
        req.lock = TreeLock(node, IncLockRefResult(delta=delta).to_dec_params())
        req.last_node = node


class Chaos(World):
    """A world with the chaos run's extra scheduler calls and its slot
    accounting."""

    def make_cache(self, kind, params):
        if kind == "radixkv" and FAULT == "old_checkpoint":
            return OldCheckpoint(params)
        return super().make_cache(kind, params)

    # -- the accounting ---------------------------------------------------------------

    def free_pages(self) -> list:
        a = self.alloc
        pages = a.free_pages.tolist()
        released = getattr(a, "release_pages", None)
        if released is not None:
            pages += released.tolist()
        for t in getattr(a, "staged_pages", None) or []:
            pages += t.tolist()
        return pages

    def own_pages(self, r) -> list:
        """The pages of `r`'s own slots, [cache_protected_len, kv_allocated_len)."""
        row = self.pool.req_to_token[r.kv.req_pool_idx, r.kv.cache_protected_len : r.kv.kv_allocated_len]
        return sorted({int(v) // self.ps for v in row.tolist()})

    def tree_pages(self) -> list | None:
        """SGLang's tree's pages (walked); None for radixkv's (counted)."""
        if not isinstance(self.cache, rc.RadixCache):
            return None
        out, stack = [], [self.cache.root_node]
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if n is not self.cache.root_node and n.value is not None:
                out += [int(v) // self.ps for v in n.value.tolist()[:: self.ps]]
        return out

    def accounting(self) -> str | None:
        """What is wrong with the slot accounting (None: nothing)."""
        num_pages = self.alloc.size // self.ps
        c = self.cache
        sizes = (c.evictable_size(), c.protected_size(), c.total_size())
        if not all(0 <= s <= num_pages * self.ps for s in sizes):
            return f"sizes (evictable, protected, total) {sizes} outside 0..{num_pages * self.ps}"
        owners = Counter(self.free_pages())
        for r in self.running.values():
            owners.update(self.own_pages(r))
        tree = self.tree_pages()
        if tree is not None:
            owners.update(tree)
        twice = sorted(p for p, n in owners.items() if n > 1)
        if twice:
            return f"pages owned twice: {twice[:8]}"
        outside = sorted(p for p in owners if not 1 <= p <= num_pages)
        if outside:
            return f"pages outside the pool: {outside[:8]}"
        held = len(owners) + (sizes[2] // self.ps if tree is None else 0)
        if held != num_pages:
            return f"{num_pages} pages in the pool, {held} owned (free + requests + tree): " + (
                "some owned twice" if held > num_pages else "some lost"
            )
        return None

    # -- the chaos run's calls -------------------------------------------------------

    def admit_then_abort(self):
        """Admission's match and lock, then an abort before any row."""
        r = self.waiting.pop(0)
        r.refresh_fill_ids()
        fill = r.full_untruncated_fill_ids
        m = self.cache.match_prefix(MatchPrefixParams(key=rc.RadixKey(fill, r.extra_key, cache_salt=r.cache_salt)))
        r.lock = self.cache.lock(m.last_device_node)
        prefix = self.cache.path_device_indices(m.last_device_node).tolist()
        self.cache.unlock(r.lock)
        r.lock = None
        return ("aborted after match", m.device_prefix_len, prefix)

    def allocate_next(self, rid: str) -> str:
        """Slots for the request's next chunk (or decode token), written
        into its row, nothing committed or checkpointed."""
        r = self.running[rid]
        n = r.kv.kv_allocated_len
        prompt = len(r.origin_input_ids)
        end = min(prompt, n + CHUNK_PAGES * self.ps) if n < prompt else n + 1
        self._make_room(self._need(n, end))
        if self.alloc.available_size() < self._need(n, end):
            return "no room"
        slots = self._slots(r, n, end)
        self.pool.write((r.kv.req_pool_idx, slice(n, end)), slots.to(torch.int32))
        r.kv.kv_allocated_len = end
        return f"allocated {end - n}"

    def abort_allocated(self, rid: str) -> None:
        """An abort with slots allocated past what is committed: the row is
        freed from the protected length to the allocated one."""
        r = self.running.pop(rid)
        self.cache.free_kv_row(r.kv, [(r.kv.cache_protected_len, r.kv.kv_allocated_len)])
        self.cache.unlock(r.lock)
        r.lock = None
        self.pool.free(r)
        r.kv.mark_kv_released()

    def retract(self, rid: str, evict: int) -> int:
        """SGLang's retraction: released without a checkpoint, the
        shortfall evicted, the request reset and back at the queue's head."""
        r = self.running[rid]
        self.abort_allocated(rid)
        got = self.cache.evict(EvictParams(num_tokens=evict)).num_tokens_evicted
        r.reset_for_retract()
        r.output_ids.clear()
        self.waiting.insert(0, r)
        return got

    def checkpoint_at(self, rid: str, up_to: int):
        r = self.running[rid]
        r.refresh_fill_ids()
        self.cache.checkpoint(r, up_to=up_to)
        return (r.kv.cache_protected_len, r.kv.cache_inserted_len)

    def match_above(self, rid: str, cut: int) -> int:
        """Matches the first `cut` ids of the request's key (splitting its
        path there); the end node is kept as `above`."""
        r = self.running[rid]
        r.refresh_fill_ids()
        key = rc.RadixKey(r.full_untruncated_fill_ids[:cut], r.extra_key, cache_salt=r.cache_salt)
        m = self.cache.match_prefix(MatchPrefixParams(key=key))
        self.above = m.last_device_node
        return m.device_prefix_len

    def flush(self) -> list:
        """`flush_cache` with requests in flight: the tree reset, the pool
        and allocator cleared; the running requests' locks are returned
        (orphans, whose scheduler may still release them)."""
        orphans = [r.lock for r in self.running.values() if r.lock is not None]
        self.cache.reset()
        self.pool.clear()
        self.alloc.clear()
        for r in self.running.values():
            r.lock = None
            r.kv.mark_kv_released()
        self.running.clear()
        return orphans


def guarded(call):
    """Runs `call`: ("ok", result) or ("raised", exception); anything but an
    `Exception` is a failure of the run."""
    try:
        return ("ok", call())
    except Exception as e:  # noqa: BLE001 - compared by the caller
        return ("raised", e)
    except BaseException as e:  # noqa: BLE001 - the point of the check
        raise Difference(("a BaseException that is not an Exception escaped", type(e).__mro__, str(e)))


def both(worlds, what, call):
    """A call SGLang defines, made in both worlds: the same outcome."""
    got = [guarded(lambda w=w: call(w)) for w in worlds]
    kinds = [g[0] for g in got]
    check(kinds[0] == kinds[1], what, "one world raised", *got)
    if kinds[0] == "raised":
        check(type(got[0][1]) is type(got[1][1]), what, "different exceptions", *got)
    else:
        check(got[0][1] == got[1][1], what, "results", *got)
    return got[1]


def refused_by_radixkv(worlds, what, call, seen) -> None:
    """A call SGLang does not define: radixkv must refuse it and change
    nothing. Accepted, it is made in SGLang's world too (the accounting
    then finds what it did)."""
    ours = worlds[1]
    before = ours.state()
    got = guarded(lambda: call(ours))
    if got[0] == "raised":
        check(isinstance(got[1], (ValueError, CacheError)), what, "refused with", type(got[1]).__mro__, got[1])
        after, events = ours.state(), ours.cache.take_events()
        check(after == before and events == [], what, "refused, yet changed", before, after, events)
        seen["refused: " + what] += 1
        return
    seen["accepted: " + what] += 1
    guarded(lambda: call(worlds[0]))


def run(seed: int, ps: int, policy: str, steps: int, seen: Counter) -> int:
    rng = random.Random(seed)
    rc.time = LogicalClock()
    config = {"protected_threshold": rng.choice([1, 2, 3])} if policy == "slru" else None
    slots = rng.choice([24, 48, 96]) * ps
    names = rng.choice(["table", None])
    worlds = [Chaos(k, ps, policy, config, slots, names) for k in ("sglang", "radixkv")]
    make = prompts(rng, ps)
    next_rid = 0
    ops = 0
    orphans: list = []
    for step in range(steps):
        where = (policy, ps, seed, step)
        w0 = worlds[0]
        running = sorted(w0.running)
        x = rng.random()
        if x < 0.2 or (not running and not w0.waiting):
            rid = f"r{next_rid}"
            next_rid += 1
            prompt, ns = make(), rng.choice(NAMESPACES)
            prio, max_new = rng.choice([None, 0, 1, 3]), rng.randint(1, 5)
            for w in worlds:
                w.arrive(rid, prompt, ns, prio, max_new)
            what = "arrive"
        elif x < 0.32 and w0.waiting:
            if rng.random() < 0.2:
                pol = rng.choice(["lpm", "dfs-weight"])
                both(worlds, (where, "queue order"), lambda w: w.order(pol))
            if rng.random() < 0.15:
                both(worlds, (where, "abort after match"), lambda w: w.admit_then_abort())
                what = "abort after match"
            else:
                both(worlds, (where, "admit"), lambda w: w.admit())
                what = "admit"
        elif x < 0.52 and running:
            rid = rng.choice(running)
            r0 = w0.running[rid]
            if r0.kv.kv_committed_len >= len(r0.origin_input_ids) and len(r0.output_ids) >= r0.sampling_params.max_new_tokens:
                for w in worlds:
                    w.release(rid, checkpoint=True)
                what = "finish"
            else:
                both(worlds, (where, "advance"), lambda w: w.advance(rid))
                what = "advance"
        elif x < 0.6 and running:
            rid = rng.choice(running)
            kind = rng.choice(["mid-chunk or mid-decode", "after checkpoint", "plain"])
            if kind == "mid-chunk or mid-decode":
                both(worlds, (where, "allocate"), lambda w: w.allocate_next(rid))
            elif kind == "after checkpoint":
                r0 = w0.running[rid]
                up_to = r0.kv.kv_committed_len
                both(worlds, (where, "checkpoint"), lambda w: w.checkpoint_at(rid, up_to))
            for w in worlds:
                w.abort_allocated(rid)
            what = f"abort {kind}"
        elif x < 0.66 and running:
            rid = rng.choice(running)
            k = rng.randint(0, 4 * ps)
            both(worlds, (where, "retract"), lambda w: w.retract(rid, k))
            what = "retract"
        elif x < 0.8 and running:
            rid = rng.choice(running)
            r0 = w0.running[rid]
            cpl, alloc = r0.kv.cache_protected_len, r0.kv.kv_allocated_len
            r0.refresh_fill_ids()
            key = len(r0.full_untruncated_fill_ids)
            choices = [cpl, cpl + rng.randint(0, 2 * ps), alloc, key, key + rng.randint(1, 9)]
            if cpl >= ps:
                choices += [rng.randint(0, cpl - ps)] * 2
            up_to = rng.choice(choices)
            key_len = min(key, up_to) // ps * ps
            if cpl <= key_len <= alloc:
                both(worlds, (where, f"checkpoint up_to={up_to}"), lambda w: w.checkpoint_at(rid, up_to))
                what = "checkpoint inside"
            else:
                what = "checkpoint below the protected length" if key_len < cpl else "checkpoint past the slots"
                refused_by_radixkv(worlds, what, lambda w: w.checkpoint_at(rid, up_to), seen)
        elif x < 0.86 and running:
            rid = rng.choice(running)
            r0 = w0.running[rid]
            if rng.random() < 0.5:
                # A second holder of the request's node, then its release.
                held = both(worlds, (where, "lock again"), lambda w: w.cache.inc_lock_ref(w.running[rid].last_node).delta)
                both(worlds, (where, "unlock again"), lambda w: w.cache.dec_lock_ref(w.running[rid].last_node).delta)
                what = "second lock on a held node"
                seen["second locks"] += held[0] == "ok"
            elif r0.kv.cache_protected_len >= 2 * ps:
                # A node above the request's, which only its lock protects.
                cut = rng.randrange(ps, r0.kv.cache_protected_len, ps)
                upper = both(worlds, (where, "match above"), lambda w: w.match_above(rid, cut))
                node = worlds[1].above
                held_here = any(r.last_node == node for r in worlds[1].running.values())
                if upper[0] == "ok" and not held_here and not node.is_root:
                    refused_by_radixkv(
                        worlds,
                        "release of a node only a descendant's lock protects",
                        lambda w: w.cache.dec_lock_ref(w.above),
                        seen,
                    )
                what = "release above a held node"
            else:
                continue
        elif x < 0.9:
            k = rng.choice([rng.randint(0, 4 * ps), 1 << 40])
            both(worlds, (where, "evict"), lambda w: w.cache.evict(EvictParams(num_tokens=k)).num_tokens_evicted)
            what = "evict (more than evictable)" if k > slots else "evict"
        elif x < 0.92 and running:
            got = [w.flush() for w in worlds]
            orphans.append(got[1])
            what = "reset with requests in flight"
        elif orphans:
            # The flushed requests' scheduler releases their old locks: a
            # no-op for radixkv (the lock ended with the reset); SGLang's
            # own would change its new tree's sizes, so it is not asked.
            ours = worlds[1]
            before = ours.state()
            for lock in orphans.pop():
                got = guarded(lambda lock=lock: ours.cache.unlock(lock))
                check(got[0] == "ok", where, "release of a lock from before the reset", got)
            check(ours.state() == before, where, "a release of a lock from before the reset changed the cache")
            what = "release of locks from before a reset"
            seen[what] += 1
        else:
            continue
        ops += 1
        seen[what] += 1
        s = [w.state() for w in worlds]
        check(s[0] == s[1], where, what, "state (free pages, released, rows, evictable, protected, total)", *s)
        for w in worlds:
            bad = w.accounting()
            check(bad is None, where, what, type(w.cache).__name__, "slot accounting", bad)
        e = [msgspec.msgpack.encode(w.cache.take_events()) for w in worlds]
        check(e[0] == e[1], where, what, "events", msgspec.msgpack.decode(e[0]), msgspec.msgpack.decode(e[1]))
    # Everyone leaves, everything is evicted: the whole pool is free again.
    for rid in sorted(worlds[0].running):
        for w in worlds:
            w.release(rid, checkpoint=True)
    for w in worlds:
        w.cache.evict(EvictParams(num_tokens=1 << 40))
        check(w.accounting() is None, (policy, ps, seed, "end"), "final accounting", w.accounting())
        check(w.cache.total_size() == 0, (policy, ps, seed, "end"), "empty at the end")
    s = [w.state() for w in worlds]
    check(s[0] == s[1], (policy, ps, seed, "end"), "final state", *s)
    worlds[1].cache.sanity_check()
    return ops


class Locked:
    """An object whose every method call holds one lock: SGLang's pool and
    allocator are the scheduler thread's alone, so the two threads of
    `threads()` share them through this."""

    def __init__(self, inner, lock) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_lock", lock)

    def __getattr__(self, name):
        v = getattr(self._inner, name)
        if not callable(v):
            return v

        def call(*a, **k):
            with self._lock:
                return v(*a, **k)

        return call

    def __setattr__(self, name, value):
        setattr(self._inner, name, value)


def threads(seed: int, ps: int, policy: str, steps: int) -> int:
    """Two Python threads run their own requests on one backend (its tree
    calls release the GIL, so they interleave inside Rust): one thread's
    checkpoints, releases and aborts run beside the other's admissions,
    chunks and evictions, which hold a lock together with the pool and
    allocator (SGLang's, shared through `Locked`). Then every request
    leaves and everything is evicted: the whole pool must be free, each
    page once, and the tree's audit must hold."""
    w = Chaos("radixkv", ps, policy, {"protected_threshold": 2} if policy == "slru" else None, 96 * ps)
    lock = threading.RLock()
    w.alloc = Locked(w.alloc, lock)
    w.pool = Locked(w.pool, lock)
    w.cache.token_to_kv_pool_allocator = w.alloc
    w.cache.req_to_token_pool = w.pool
    failures: list = []
    done = [0, 0]

    def worker(t: int) -> None:
        rng = random.Random(seed * 2 + t)
        make = prompts(rng, ps)
        mine = Chaos.__new__(Chaos)
        mine.__dict__.update(w.__dict__)
        mine.waiting, mine.running = [], {}
        try:
            for i in range(steps):
                x = rng.random()
                if x < 0.3 or not (mine.waiting or mine.running):
                    mine.arrive(f"t{t}-{i}", make(), rng.choice(NAMESPACES), rng.choice([None, 1]), rng.randint(1, 4))
                elif x < 0.5 and mine.waiting:
                    with lock:
                        mine.admit()
                elif x < 0.85 and mine.running:
                    rid = rng.choice(sorted(mine.running))
                    r = mine.running[rid]
                    if r.kv.kv_committed_len >= len(r.origin_input_ids) and len(r.output_ids) >= r.sampling_params.max_new_tokens:
                        mine.release(rid, checkpoint=True)
                    else:
                        with lock:
                            mine.advance(rid)
                elif mine.running:
                    mine.abort_allocated(rng.choice(sorted(mine.running)))
                else:
                    # Under the lock, as admission's own evictions: a match
                    # and its lock are one step of a scheduler, and an
                    # eviction between them would leave the lock nothing
                    # to hold (StaleHandle, SGLang's API being two calls).
                    with lock:
                        w.cache.evict(EvictParams(num_tokens=rng.randint(0, 8 * ps)))
                done[t] += 1
            for rid in sorted(mine.running):
                mine.release(rid, checkpoint=True)
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append((t, type(e).__mro__, repr(e)))

    ts = [threading.Thread(target=worker, args=(t,)) for t in (0, 1)]
    for th in ts:
        th.start()
    for th in ts:
        th.join(300)
    check(not failures, (policy, ps, seed, "threads"), "a thread failed", failures)
    check(w.cache.protected_size() == 0, (policy, ps, seed, "threads"), "locks left")
    w.cache.sanity_check()
    w.running = {}
    w.cache.evict(EvictParams(num_tokens=1 << 40))
    check(w.cache.total_size() == 0, (policy, ps, seed, "threads"), "not empty")
    bad = w.accounting()
    check(bad is None, (policy, ps, seed, "threads"), "slot accounting after two threads", bad)
    return sum(done)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--page-sizes", default=",".join(map(str, PAGE_SIZES)))
    a = p.parse_args()
    total = sweep(
        a,
        run,
        "chaos steps equal to SGLang's RadixCache",
        after=lambda ps, policy: f", {threads(0, ps, policy, a.steps)} on two threads",
    )
    if total is None:
        return 1
    print(f"radixkv's SGLang backend held its slots through {total} chaos steps beside SGLang 0.5.23's RadixCache", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
