"""The shared conformance vectors (`tests/conformance`: op traces and SGLang's
own answers) replayed through radixkv's Python API, twice:

* `radixkv.RadixCache` (the core's API; its default configuration is
  SGLang 0.5.9's, which computed the vectors);
* `radixkv.sglang.RadixKVCache` (the SGLang backend) driven with SGLang's
  own parameter objects (`RadixKey`, `InsertParams`, `MatchPrefixParams`,
  `EvictParams`) and a recording allocator for the freed slots.

Every field of every expected line must be reproduced. Prints the line
count per vector; on a difference, the vector, the op and both lines, and
exits 1.
"""

from __future__ import annotations

import json
import sys
import warnings
from array import array
from pathlib import Path

warnings.filterwarnings("ignore")

import radixkv  # noqa: E402
import torch  # noqa: E402
from radixkv.sglang import RadixKVCache  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402

VECTORS = Path(__file__).resolve().parents[4] / "tests" / "conformance"


class RecordingAllocator:
    """The allocator SGLang's cache frees evicted slots to."""

    device = "cpu"

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.freed: list[int] = []

    def free_segment(self, values, start_pos: int = 0) -> None:
        self.freed.extend(values.tolist())


class CoreRunner:
    """The ops on `radixkv.RadixCache`."""

    def __init__(self, ps: int, policy: str) -> None:
        self.cache = radixkv.RadixCache(page_size=ps, eviction_policy=policy)
        self.handles: dict = {}
        self.locks: dict = {}

    def apply(self, i: int, op: dict, out: dict) -> None:
        c = self.cache
        if op["op"] == "insert":
            r = c.insert(op["key"], op["value"], namespace=op.get("extra"), priority=op.get("priority", 0))
            out["prefix_len"] = r.prefix_len
        elif op["op"] == "match":
            m = c.match_and_pin(op["key"], namespace=op.get("extra"))
            out["len"] = m.len
            out["value"] = m.values.tolist()
            m.lease.close()
            self.handles[i] = m.handle
        elif op["op"] == "lock":
            self.locks.setdefault(op["match"], []).append(c.pin(self.handles[op["match"]]))
        elif op["op"] == "unlock":
            self.locks[op["match"]].pop().close()
        elif op["op"] == "evict":
            e = c.evict(op["tokens"])
            out["evicted"] = e.tokens
            out["values"] = sorted(e.values.tolist())
        s = c.sizes()
        out.update(evictable=s.evictable, protected=s.protected, total=s.total, nodes=s.nodes)


class BackendRunner:
    """The ops on the SGLang backend, through SGLang's objects."""

    def __init__(self, ps: int, policy: str) -> None:
        self.alloc = RecordingAllocator(ps)
        self.cache = RadixKVCache(
            CacheInitParams(
                disable=False,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=self.alloc,
                page_size=ps,
                eviction_policy=policy,
            )
        )
        self.nodes: dict = {}

    def apply(self, i: int, op: dict, out: dict) -> None:
        c = self.cache
        if op["op"] == "insert":
            r = c.insert(
                InsertParams(
                    key=RadixKey(array("q", op["key"]), extra_key=op.get("extra")),
                    value=torch.tensor(op["value"], dtype=torch.int64),
                    priority=op.get("priority", 0),
                )
            )
            out["prefix_len"] = r.prefix_len
        elif op["op"] == "match":
            m = c.match_prefix(MatchPrefixParams(key=RadixKey(array("q", op["key"]), extra_key=op.get("extra"))))
            out["len"] = m.device_prefix_len
            out["value"] = c.path_device_indices(m.last_device_node).tolist()
            self.nodes[i] = m.last_device_node
        elif op["op"] == "lock":
            c.inc_lock_ref(self.nodes[op["match"]])
        elif op["op"] == "unlock":
            c.dec_lock_ref(self.nodes[op["match"]])
        elif op["op"] == "evict":
            self.alloc.freed.clear()
            out["evicted"] = c.evict(EvictParams(num_tokens=op["tokens"])).num_tokens_evicted
            out["values"] = sorted(self.alloc.freed)
        out.update(
            evictable=c.evictable_size(),
            protected=c.protected_size(),
            total=c.total_size(),
            nodes=c.node_count(),
        )


def replay(trace: Path, runner_class) -> tuple[int, str | None]:
    ps_part, policy, _ = trace.name.split("_", 2)
    runner = runner_class(int(ps_part[2:]), policy)
    ops = [json.loads(line) for line in trace.read_text().splitlines() if line.strip() and not line.startswith("#")]
    expected_path = trace.with_name(trace.name.replace(".jsonl", ".expected.jsonl"))
    expected = [json.loads(line) for line in expected_path.read_text().splitlines() if line.strip()]
    if len(ops) != len(expected):
        return 0, f"{len(ops)} ops, {len(expected)} expected lines"
    for i, (op, want) in enumerate(zip(ops, expected, strict=True)):
        got = {"i": i, "op": op["op"]}
        runner.apply(i, op, got)
        for k, v in want.items():
            if got.get(k) != v:
                return i, f"op {i} field {k}: got {got}, want {want}"
    return len(ops), None


def main() -> int:
    traces = sorted(p for p in VECTORS.glob("*.jsonl") if not p.name.endswith(".expected.jsonl"))
    if len(traces) < 20:
        print(f"FAIL: expected the 20 shipped vectors in {VECTORS}, found {len(traces)}")
        return 1
    for runner_class, what in ((CoreRunner, "radixkv.RadixCache"), (BackendRunner, "radixkv.sglang.RadixKVCache")):
        lines = 0
        for trace in traces:
            n, diff = replay(trace, runner_class)
            if diff is not None:
                print(f"DIFFERENT ({what}, {trace.name}): {diff}")
                return 1
            lines += n
        print(f"{what}: {len(traces)} conformance vectors, {lines} ops, every expected field equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
