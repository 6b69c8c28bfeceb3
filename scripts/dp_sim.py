"""A data-parallel serving simulation: each rank is SGLang 0.5.23's own
`RadixCache` with a finite pool (LRU eviction), requests arrive at the
trace's timestamps and finish over modelled time, and a dispatcher sends
each to a rank by SGLang's `round_robin`, `total_requests` or
`total_tokens`, or by radixkv's `DpRouter` fed by the ranks' own KV events
(SGLang's encoding, as its publisher packs them). Beside them, the ceiling:
one cache holding every rank's pool.

The model (the same for every dispatcher): a trace block (a Mooncake
`hash_id`, 512 tokens; an agentic trace's block, 64) is `--block-tokens`
token ids in the caches; a
rank prefills one request at a time at `--prefill-tps` real tokens per
second, only the tokens its cache does not hold when the prefill starts,
then decodes beside the others (`--decode-ms` per output token), and the
request's prompt enters its cache when its prefill ends. A rank's load is
its requests not finished and their prompt tokens (what SGLang's DPBudget
counts).

Reported per dispatcher: the token hit rate (cached prompt tokens over all
prompt tokens, in the trace's tokens), the most loaded rank's prompt tokens
over the mean, TTFT mean/p50/p99 (queueing for the prefill plus the
prefill), and for radixkv the dispatch call's p50 and p99 and, with
`--given-away`, the share of the cached tokens it could have had that it
gave away (at each dispatch, the longest prefix any rank holds against
the chosen rank's, by `router.scores`: what the load rule cost).

    python scripts/dp_sim.py TRACE --ranks 4 [--requests N] [--pool-frac 0.35]
    python scripts/dp_sim.py AGENTIC_TRACE --format agentic --block-tokens 4 --page 4 [--seed 7]
    python scripts/dp_sim.py gsp --format gsp

radixkv's router takes the SGLang plug-in's default options
(`radixkv.sglang_dp.DEFAULT_OPTIONS`) unless told otherwise.
"""

from __future__ import annotations

import argparse
import heapq
import json
import subprocess
import sys
import time
import warnings
from array import array

warnings.filterwarnings("ignore")


def read_mooncake(path: str, limit: int):
    out = []
    proc = subprocess.run(["zstdcat", path], check=True, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        r = json.loads(line)
        out.append((r["timestamp"] / 1000.0, r["input_length"], r["output_length"], r["hash_ids"]))
        if len(out) >= limit:
            break
    return out


def read_agentic(path: str, limit: int, mean_gap_s: float, seed: int):
    """The agentic trace: conversations (sub-agents' requests flattened in),
    each starting an exponential gap after the one before, a block named by
    its id and its parent's (ids are per conversation); requests in time
    order, as `radixkv replay` reads it."""
    import random

    rng = random.Random(seed)
    ids: dict = {}
    fresh = [0]  # the next block's number, across conversations
    out = []
    start = 0.0
    first = True
    proc = subprocess.run(["zstdcat", path], check=True, capture_output=True, text=True)
    block_size = 0

    def flatten(entries, base):
        for e in entries:
            if e["type"] == "subagent":
                began = e["t"] - (e.get("duration_ms") or 0.0) / 1000.0
                flatten(e["requests"], base + began)
                continue
            last = None
            blocks = []
            for h in e["hash_ids"]:
                key = (last, h)
                if key not in ids:
                    ids[key] = fresh[0]
                    fresh[0] += 1
                last = ids[key]
                blocks.append(last)
            out.append((base + e["t"], e["in"], e.get("out") or 0, blocks))

    for line in proc.stdout.splitlines():
        c = json.loads(line)
        block_size = c["block_size"]
        if c.get("hash_id_scope", "local") == "local":
            # Ids name blocks within one conversation only.
            ids.clear()
        if not first:
            start += rng.expovariate(1.0 / mean_gap_s) if mean_gap_s > 0 else 0.0
        first = False
        flatten(c["requests"], start)
    out.sort(key=lambda r: r[0])
    return out[:limit], block_size


def gsp(groups: int, prompts: int, system: int, question: int, output: int, seed: int):
    """SGLang's generated-shared-prefix workload (`bench_serving
    --dataset-name generated-shared-prefix`, as `radixkv replay`'s gsp):
    `groups` system prompts of `system` tokens, `prompts` questions of
    `question` tokens each, all arriving at time 0 in a seeded random
    order. Each token is its own block here (`--block-tokens 1`): ids are
    fresh per token, shared only through a group's system prompt."""
    import random

    rng = random.Random(seed)
    fresh = iter(range(1 << 62))
    out = []
    for _ in range(groups):
        head = [next(fresh) for _ in range(system)]
        for _ in range(prompts):
            ids = head + [next(fresh) for _ in range(question)]
            out.append((0.0, len(ids), output, ids))
    rng.shuffle(out)
    return out


def tokens_of(hash_ids, block_tokens: int):
    t = []
    for h in hash_ids:
        base = h * block_tokens
        t.extend(range(base + 1, base + block_tokens + 1))
    return t


class Slots:
    device = "cpu"

    def __init__(self, page: int) -> None:
        self.page_size = page

    def free(self, values) -> None:
        pass

    def free_segment(self, values, start_pos: int = 0) -> None:
        pass


def new_cache(page: int, events: bool):
    from sglang.srt.mem_cache import radix_cache as rc
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    return rc.RadixCache(
        CacheInitParams(
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=Slots(page),
            page_size=page,
            eviction_policy="lru",
            enable_kv_cache_events=events,
        )
    )


def run(trace, policy: str, ranks: int, capacity: int, a) -> dict:
    import msgspec
    import torch
    from sglang.srt.disaggregation.kv_events import KVEventBatch
    from sglang.srt.mem_cache import radix_cache as rc
    from sglang.srt.mem_cache.base_prefix_cache import (
        EvictParams,
        InsertParams,
        MatchPrefixParams,
    )

    import radixkv

    page = a.page
    n_caches = 1 if policy == "ceiling" else ranks
    caches = [new_cache(page, policy == "radixkv") for _ in range(n_caches)]
    pack = msgspec.msgpack.Encoder()
    router = None
    if policy == "radixkv":
        # Dispatched-not-cached prompts are settled when the rank caches
        # them (the simulation's clock is not the wall clock).
        router = radixkv.DpRouter(
            ranks,
            page,
            load=a.router_load,
            balance_abs=a.balance_abs,
            balance_rel=a.balance_rel,
            balance=a.balance,
            # In the router's token ids: a trace's block is fewer ids than
            # its real tokens here (`--block-tokens`).
            keep_prefix_tokens=(
                None
                if a.keep_prefix_tokens is None
                else max(1, a.keep_prefix_tokens * a.block_tokens // a.real_block)
            ),
            new_prefix=a.new_prefix,
            pending_ttl_s=1e9,
            pending_tokens=1 << 30,
        )
    seqs = [0] * ranks
    load_req = [0] * ranks
    load_tok = [0] * ranks
    assigned = [0] * ranks
    queues: list[list] = [[] for _ in range(ranks)]
    idle = [True] * ranks
    heap: list = []
    counter = 0
    rr = 0
    cached_tokens = total_tokens = 0
    ttfts: list[float] = []
    route_ns: list[int] = []
    next_value = 1
    best_held = chosen_held = 0

    def cache_of(r: int):
        return caches[0 if policy == "ceiling" else r]

    def start_next(r: int, now: float) -> None:
        # The rank's next prefill: only what its cache holds now is reused.
        nonlocal counter, cached_tokens, total_tokens
        if not queues[r]:
            idle[r] = True
            return
        idle[r] = False
        ts, in_len, out_len, toks = queues[r].pop(0)
        m = cache_of(r).match_prefix(MatchPrefixParams(key=rc.RadixKey(array("q", toks))))
        hit = min(in_len, int(m.device_prefix_len) * a.real_block // a.block_tokens)
        cached_tokens += hit
        total_tokens += in_len
        end = now + (in_len - hit) / a.prefill_tps
        ttfts.append(end - ts)
        counter += 1
        heapq.heappush(heap, (end, counter, 0, r, toks, in_len, out_len))

    def advance(t: float) -> None:
        nonlocal counter, next_value
        while heap and heap[0][0] <= t:
            now, _, kind, r, toks, in_len, out_len = heapq.heappop(heap)
            if kind == 1:
                load_req[r] -= 1
                load_tok[r] -= in_len
                continue
            # The prefill ended: its prompt enters the rank's cache.
            c = cache_of(r)
            n = len(toks) // page * page
            values = torch.arange(next_value, next_value + n, dtype=torch.int64)
            next_value += n
            c.insert(InsertParams(key=rc.RadixKey(array("q", toks[:n])), value=values))
            over = c.total_size() - capacity
            if over > 0:
                c.evict(EvictParams(num_tokens=over))
            if router is not None:
                events = c.take_events()
                if events:
                    router.ingest(r, pack.encode(KVEventBatch(ts=now, events=events)), seqs[r])
                    seqs[r] += 1
                router.settled(toks, r)
            counter += 1
            heapq.heappush(heap, (now + out_len * a.decode_ms / 1000.0, counter, 1, r, None, in_len, 0))
            start_next(r, now)

    for ts, in_len, out_len, hash_ids in trace:
        advance(ts)
        toks = tokens_of(hash_ids, a.block_tokens)
        if policy == "round_robin":
            r = rr % ranks
            rr += 1
        elif policy == "total_requests":
            r = min(range(ranks), key=lambda i: (load_req[i], i))
        elif policy in ("total_tokens", "ceiling"):
            r = min(range(ranks), key=lambda i: (load_tok[i], load_req[i], i))
        else:
            # SGLang hands the dispatcher `input_ids` as an array('q').
            ids = array("q", toks)
            loads = list(zip(load_req, load_tok))
            t0 = time.perf_counter_ns()
            r = router.route(ids, None, loads)
            route_ns.append(time.perf_counter_ns() - t0)
            if a.given_away:
                # What any rank held against what the chosen one holds
                # (cached, not counting prompts sent).
                held = router.scores(ids)
                best_held += max(held)
                chosen_held += held[r]
        assigned[r] += in_len
        load_req[r] += 1
        load_tok[r] += in_len
        queues[r].append((ts, in_len, out_len, toks))
        if idle[r]:
            start_next(r, ts)
    advance(float("inf"))
    ttfts.sort()
    mean_assigned = sum(assigned) / ranks
    out = {
        "policy": policy,
        "ranks": ranks,
        "hit_rate": cached_tokens / max(1, total_tokens),
        "max_over_mean": max(assigned) / mean_assigned if mean_assigned else 0.0,
        "ttft_mean_s": sum(ttfts) / len(ttfts),
        "ttft_p50_s": ttfts[len(ttfts) // 2],
        "ttft_p99_s": ttfts[int(len(ttfts) * 0.99)],
    }
    if a.given_away and policy == "radixkv":
        out["given_away"] = 1 - chosen_held / best_held if best_held else 0.0
    if route_ns:
        route_ns.sort()
        out["route_p50_us"] = route_ns[len(route_ns) // 2] / 1000
        out["route_p99_us"] = route_ns[int(len(route_ns) * 0.99)] / 1000
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("--format", choices=["mooncake", "agentic", "gsp"], default="mooncake")
    p.add_argument("--mean-gap-s", type=float, default=1.0, help="agentic: between conversations")
    p.add_argument("--seed", type=int, default=7, help="agentic: of the conversations' gaps")
    p.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    p.add_argument("--requests", type=int, default=12031)
    p.add_argument("--pool-frac", type=float, default=0.35)
    p.add_argument("--block-tokens", type=int, default=16)
    p.add_argument("--page", type=int, default=16)
    p.add_argument("--prefill-tps", type=float, default=20000.0)
    p.add_argument("--decode-ms", type=float, default=20.0)
    from radixkv.sglang_dp import DEFAULT_OPTIONS as d

    p.add_argument("--router-load", choices=["requests", "tokens"], default=d["load"])
    p.add_argument("--balance-abs", type=int, default=d["balance_abs"])
    p.add_argument("--balance-rel", type=float, default=d["balance_rel"])
    p.add_argument("--balance", choices=["global", "above_mean"], default=d["balance"])
    p.add_argument(
        "--keep-prefix-tokens",
        type=lambda v: None if v == "none" else int(v),
        default=d.get("keep_prefix_tokens"),
        help="a rank holding this many of a prompt's real tokens keeps it (none: never)",
    )
    p.add_argument(
        "--new-prefix",
        choices=["least_loaded", "least_written"],
        default=d.get("new_prefix", "least_loaded"),
        help="where a prompt no rank holds any of goes",
    )
    p.add_argument(
        "--given-away",
        action="store_true",
        help="radixkv: report the share of the cached tokens the longest held prefixes offered "
        "that the chosen ranks did not hold",
    )
    p.add_argument("--only", nargs="+", help="dispatchers to run (default all)")
    a = p.parse_args()
    if a.format == "gsp":
        # SGLang's bench_serving defaults; one token per block.
        trace, a.real_block, a.block_tokens = gsp(64, 16, 2048, 128, 256, 42), 1, 1
    elif a.format == "agentic":
        trace, a.real_block = read_agentic(a.trace, a.requests, a.mean_gap_s, a.seed)
    else:
        trace, a.real_block = read_mooncake(a.trace, a.requests), 512
    distinct = len({h for *_, hs in trace for h in hs}) * a.block_tokens
    rows = []
    for ranks in a.ranks:
        total_pool = int(distinct * a.pool_frac)
        for policy in a.only or ["round_robin", "total_requests", "total_tokens", "radixkv", "ceiling"]:
            per = total_pool if policy == "ceiling" else total_pool // ranks
            t = time.time()
            r = run(trace, policy, ranks, per, a)
            r["seconds"] = round(time.time() - t, 1)
            rows.append(r)
            print(json.dumps(r), flush=True)
    print()
    print("| ranks | dispatch | token hit rate | max/mean prompt tokens | TTFT mean / p50 / p99 s | dispatch p50/p99 µs |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        route = (
            f"{r['route_p50_us']:.1f}/{r['route_p99_us']:.1f}" if "route_p50_us" in r else ""
        )
        print(
            f"| {r['ranks']} | {r['policy']} | {100 * r['hit_rate']:.1f} % | {r['max_over_mean']:.2f} "
            f"| {r['ttft_mean_s']:.2f} / {r['ttft_p50_s']:.2f} / {r['ttft_p99_s']:.2f} | {route} |"
        )


if __name__ == "__main__":
    sys.exit(main())
