"""radixkv's cache-aware dispatch inside SGLang 0.5.23's own
DataParallelController, on the CPU.

The controller is SGLang's class, built by its own `__init__` with the
hook that `load_plugins()` and `HookRegistry.apply_hooks()` apply
(`RADIXKV_DP_DISPATCH=1`, the installed package's entry point); only what
needs GPUs or processes is replaced: the schedulers' launch (each rank's
worker socket is a recorder), the tokenizer's socket and the schedulers'
load snapshots. Each rank is SGLang's own `RadixCache` with a finite pool
(evictions), and in a second pass radixkv's backend
(`radixkv.sglang.RadixKVCache`), publishing through the publisher SGLang's scheduler makes
(`EventPublisherFactory.create` with the server's `--kv-events-config`
and the rank), so the router finds each rank's endpoint as SGLang derives
it.

Checked, request by request over multi-turn conversations with random
loads: every decision equals an oracle computed from the ranks' own
caches (`match_prefix`), the prompts sent to each rank and the same loads,
by the rule the docs state; a `routed_dp_rank` is honoured; a rank whose
publisher restarts is cleared and followed again; a rank whose batch is
lost with no replay makes the dispatcher fall back to `total_tokens`
until that rank clears; a rank whose publisher lags (its events held
back) still gets the follow-ups of what was sent to it, where a router
that forgets what it sent sends them elsewhere, and its late batch
applies without a gap; the switch off leaves SGLang's dispatch alone;
events off refuse the start, naming the flag. The negative control, a
router that forgets what it sent, must differ from the oracle on a burst
of one prefix. With `RADIXKV_DP_CHECK_OPTIONS` (a JSON object of
`DpRouter`'s keyword arguments, laid over the plug-in's defaults) it
checks that rule instead, on SGLang's caches only; with
`keep_prefix_tokens` in it, the oracle keeps a long prefix on its loaded
rank too, and at least 10 decisions must be of that kind. Under the
plug-in's `new_prefix="least_written"` the oracle counts each rank's
recent writes as the docs state, and at least 10 decisions must be ones
they made (unequal to the rule without them); the negative control
`RADIXKV_DIFF_FAULT=least_loaded` (the dispatcher's router placing new
prompts by load) must then differ. Exits 1 on the first failure.
"""

from __future__ import annotations

import functools
import json
import math
import os
import random
import socket
import sys
import time
import warnings
from array import array

warnings.filterwarnings("ignore")
os.environ["RADIXKV_DP_DISPATCH"] = "1"
os.environ["SGLANG_PLUGINS"] = "radixkv"
# The plug-in's default rule, with RADIXKV_DP_CHECK_OPTIONS (a JSON object
# of DpRouter's keyword arguments) laid over it; prompts sent count as sent
# for the whole run (the oracle's model).
EXTRA = json.loads(os.environ.get("RADIXKV_DP_CHECK_OPTIONS") or "{}")
os.environ["RADIXKV_DP_OPTIONS"] = json.dumps({**EXTRA, "pending_ttl_s": 3600})
# The negative control RADIXKV_DIFF_FAULT=least_loaded: the dispatcher's
# router places prompts no rank holds by load, not by recent writes, while
# the oracle keeps the plug-in's rule.
FAULT = os.environ.get("RADIXKV_DIFF_FAULT")

import torch  # noqa: E402
import zmq  # noqa: E402
from sglang.srt.disaggregation.kv_events import EventPublisherFactory, KVEventBatch  # noqa: E402
from sglang.srt.managers import data_parallel_controller as dpc  # noqa: E402
from sglang.srt.mem_cache import radix_cache as rc  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.plugins import load_plugins  # noqa: E402
from sglang.srt.runtime_context import publish  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

import radixkv  # noqa: E402
from radixkv import sglang_dp  # noqa: E402
from radixkv.sglang import RadixKVCache  # noqa: E402

RANKS = 4
PAGE = 2
CAPACITY = 400  # tokens per rank's pool
OPTIONS = sglang_dp.options()  # the dispatcher's rule and thresholds
if FAULT == "least_loaded":
    os.environ["RADIXKV_DP_OPTIONS"] = json.dumps(
        {**EXTRA, "pending_ttl_s": 3600, "new_prefix": "least_loaded"}
    )
failures: list[str] = []


def expect(cond: bool, what: str) -> None:
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)


def free_block(n: int) -> int:
    """The first of `n` consecutive free ports."""
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
        s.close()
        ok = True
        for q in range(p, p + n):
            t = socket.socket()
            try:
                t.bind(("127.0.0.1", q))
            except OSError:
                ok = False
            finally:
                t.close()
        if ok and p + n < 65000:
            return p


class Slots:
    """The allocator SGLang's tree frees evicted values to (ids only)."""

    device = "cpu"
    page_size = PAGE

    def free(self, values) -> None:
        pass

    def free_segment(self, values, start_pos: int = 0) -> None:
        pass


class Rank:
    """One data-parallel rank: SGLang's RadixCache and the publisher its
    scheduler would make."""

    def __init__(self, rank: int, config: str, kind: str) -> None:
        self.rank = rank
        self.config = config
        self.kind = kind
        cache_class = RadixKVCache if kind == "radixkv" else rc.RadixCache
        self.cache = cache_class(
            CacheInitParams(
                disable=False,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=Slots(),
                page_size=PAGE,
                eviction_policy="lru",
                enable_kv_cache_events=True,
            )
        )
        # A restart binds the endpoints its predecessor just closed: ZeroMQ
        # releases them from its own thread, a moment later.
        deadline = time.monotonic() + 10
        while True:
            try:
                self.pub = EventPublisherFactory.create(config, attn_dp_rank=rank)
                break
            except zmq.error.ZMQError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.next_value = 1
        self.lose_next = False
        self.held: list = []

    def release_held(self) -> None:
        """Publishes what a lagging publisher held back, in one batch."""
        events, self.held = self.held, []
        self.pub.publish(KVEventBatch(ts=time.time(), events=events))
        self.pub._event_queue.join()

    def restart(self) -> None:
        """The rank's process restarts: an empty cache, a new publisher
        numbering from 0 on the same endpoint."""
        self.pub.shutdown()
        self.__init__(self.rank, self.config, self.kind)

    def match(self, tokens: list[int]) -> int:
        m = self.cache.match_prefix(MatchPrefixParams(key=rc.RadixKey(array("q", tokens))))
        return int(m.device_prefix_len)

    def serve(self, tokens: list[int], hold: bool = False) -> None:
        """Caches the request's prompt (evicting past the pool) and
        publishes the events, or with `hold` keeps them for `release_held`
        (a publisher that lags)."""
        n = len(tokens) // PAGE * PAGE
        values = torch.arange(self.next_value, self.next_value + n, dtype=torch.int64)
        self.next_value += n
        self.cache.insert(InsertParams(key=rc.RadixKey(array("q", tokens[:n])), value=values))
        over = self.cache.total_size() - CAPACITY
        if over > 0:
            self.cache.evict(EvictParams(num_tokens=over))
        events = self.cache.take_events()
        if hold:
            self.held.extend(events)
            return
        if not events:
            return
        lost = self.lose_next
        self.lose_next = False
        if lost:
            # Lost on the wire (numbered, never sent, as a PUB drops past its
            # high-water mark) and gone from the replay buffer too (as when
            # the subscriber asks too late): a gap that cannot be filled.
            real = self.pub._pub
            pub = self.pub

            class Drop:
                def send_multipart(self, *a, **k):
                    pub._pub = real

                def __getattr__(self, name):
                    return getattr(real, name)

            self.pub._pub = Drop()
        self.pub.publish(KVEventBatch(ts=time.time(), events=events))
        self.pub._event_queue.join()
        if lost:
            last = max(seq for seq, _ in self.pub._buffer)
            kept = [(seq, b) for seq, b in self.pub._buffer if seq != last]
            self.pub._buffer.clear()
            self.pub._buffer.extend(kept)


class Req:
    """The fields of SGLang's TokenizedGenerateReqInput the dispatch reads."""

    def __init__(self, tokens: list[int], routed: int | None = None) -> None:
        self.input_ids = array("q", tokens)
        self.routed_dp_rank = routed
        self.lora_name = None
        self.cache_salt = None
        self.rid = f"r{id(self)}"


class Recorder:
    def __init__(self, rank: int) -> None:
        self.rank = rank


def build_controller(config: str | None):
    sa = ServerArgs(
        model_path="dummy",
        dp_size=RANKS,
        kv_events_config=config,
        page_size=PAGE,
        load_balance_method="round_robin",
        device="cpu",
    )
    publish(sa, role="dp_controller")

    class PortArgs:
        scheduler_input_ipc_name = "ipc:///tmp/radixkv-dp-unused"

    return dpc.DataParallelController(sa, PortArgs(), lambda *a: None)


def forgetful_router():
    """The negative control: the dispatcher's router with no memory of
    what it sent (prompts sent count for 0 s)."""
    return radixkv.DpRouter(RANKS, PAGE, **{**OPTIONS, "pending_ttl_s": 0.0})


def measure(load: tuple[int, int]) -> int:
    """The part of a rank's (requests, tokens) the thresholds weigh."""
    return load[1] if OPTIONS["load"] == "tokens" else load[0]


def overloaded(loads, active) -> list[int]:
    """The active ranks the rule keeps from the longest prefix: under
    "global", all but the least loaded when the busiest is above
    balance_abs and balance_rel times the least busy; under "above_mean",
    those above balance_abs and balance_rel times the active ranks' mean."""
    idx = [r for r in range(RANKS) if active[r]]
    load = {r: measure(loads[r]) for r in idx}
    rel, abs_ = OPTIONS["balance_rel"], OPTIONS["balance_abs"]
    if OPTIONS["balance"] == "global":
        hi, lo = max(load.values()), min(load.values())
        if hi > abs_ and hi > lo * rel:
            least = min(idx, key=lambda r: (load[r], r))
            return [r for r in idx if r != least]
        return []
    bound = max(float(abs_), sum(load.values()) / len(idx) * rel)
    return [r for r in idx if load[r] > bound]


def pressure(writes, r: int) -> int:
    """Rank `r`'s recent writes as the router compares them (whole tokens,
    halves rounded up), or 0 where the rule does not count them."""
    if OPTIONS.get("new_prefix") != "least_written":
        return 0
    return math.floor(writes[r] + 0.5)


def wrote(writes, ranks, rank: int, new: int) -> None:
    """`rank` was sent `new` tokens it neither held nor was sent: every
    rank's writes decay by `exp(-new / W)`, `W` the tokens the ranks hold
    (whole pages, at least one), then `rank`'s grow by `new`."""
    window = max(sum(r.cache.total_size() for r in ranks) // PAGE, 1) * PAGE
    decay = math.exp(-new / window)
    for i in range(RANKS):
        writes[i] *= decay
    writes[rank] += new


def oracle(ranks, sent, tokens, loads, active, writes):
    """The rank the docs' rule picks, its prefix, and whether it won by
    keeping its prefix: among the active ranks the rule does not keep away
    (see `overloaded`; with `keep_prefix_tokens`, a rank holding or sent at
    least that many tokens of the request is not kept away), the longest
    prefix cached on the rank or sent to it (whole pages), then the lighter
    load, then the fewer recent writes (`pressure`), then the lower index;
    under `new_prefix="least_written"`, when none of those ranks holds or
    was sent any of it, the fewest recent writes, then the lighter load,
    then the lower index."""
    out = overloaded(loads, active)
    keep = OPTIONS.get("keep_prefix_tokens")
    whole = len(tokens) // PAGE * PAGE

    def common(a, b):
        n = 0
        for x, y in zip(a[:whole], b):
            if x != y:
                break
            n += 1
        return n // PAGE * PAGE

    # Once per rank (a match is a cache's whole walk), and only for the
    # ranks asked about.
    @functools.cache
    def prefix(r):
        cached = ranks[r].match(tokens)
        was_sent = max((common(tokens, p) for p, q in sent if q == r), default=0)
        return max(cached, was_sent)

    kept = [r for r in out if keep is not None and prefix(r) >= keep]
    idx = [r for r in range(RANKS) if active[r] and (r not in out or r in kept)]
    if OPTIONS.get("new_prefix") == "least_written" and all(prefix(r) == 0 for r in idx):
        best = min(idx, key=lambda r: (pressure(writes, r), measure(loads[r]), r))
    else:
        best = max(
            idx, key=lambda r: (prefix(r), -measure(loads[r]), -pressure(writes, r), -r)
        )
    return best, prefix(best), best in out


def wait_applied(router, ranks, tokens) -> None:
    """Until the router's scores of `tokens` equal each rank's own match
    (the last batch of every rank applied)."""
    deadline = time.monotonic() + 20
    want = [r.match(tokens) for r in ranks]
    while router.scores(tokens) != want:
        if time.monotonic() > deadline:
            expect(False, f"the router caught up: {router.scores(tokens)} != {want}")
        time.sleep(0.002)


def probe(router, ranks, r: int) -> None:
    """Rank `r` serves fresh prompts until the router shows them: a batch a
    rank publishes before the subscription has joined is lost to it (a PUB
    drops what no subscriber takes), and only a later batch shows the gap
    its replay fills."""
    deadline = time.monotonic() + 20
    attempt = 0
    while True:
        attempt += 1
        tokens = [5000 + r, attempt] * 2
        ranks[r].serve(tokens)
        want = [x.match(tokens) for x in ranks]
        t = time.monotonic() + 0.2
        while time.monotonic() < t:
            if router.scores(tokens) == want:
                return
            time.sleep(0.005)
        if time.monotonic() > deadline:
            expect(False, f"rank {r} followed: {router.scores(tokens)} != {want}")


def conversations(rng: random.Random, n: int):
    """Multi-turn conversations over a shared system prompt, interleaved,
    and one-off prompts among them."""
    system = [rng.randrange(1, 1000) for _ in range(24)]
    convs = [list(system) for _ in range(12)]
    for _ in range(n):
        if rng.random() < 0.1:
            # A one-off prompt: no rank holds any of it.
            yield [rng.randrange(1000, 2000) for _ in range(rng.randrange(8, 40))]
            continue
        c = rng.randrange(len(convs))
        convs[c] += [rng.randrange(1, 1000) for _ in range(rng.randrange(4, 30))]
        if len(convs[c]) > 300:
            convs[c] = list(system)
        yield list(convs[c])


def main() -> None:
    load_plugins()
    # A pass with extra options checks the rule on SGLang's caches only.
    for kind in ["sglang"] if EXTRA else ["sglang", "radixkv"]:
        names = {"sglang": "SGLang's RadixCache", "radixkv": "radixkv's backend"}
        print(f"== ranks of {names[kind]}")
        check(kind)


def check(kind: str) -> None:
    rng = random.Random(5)
    base = free_block(2 * RANKS)
    config = json.dumps(
        {
            "publisher": "zmq",
            "endpoint": f"tcp://*:{base}",
            "replay_endpoint": f"tcp://*:{base + RANKS}",
            "topic": "",
        }
    )

    print("-- events off: the controller refuses to start, naming the flag")
    sent_frames: list[tuple[int, object]] = []
    dpc.sock_send = lambda sock, obj: sent_frames.append((sock.rank, obj))
    dpc.get_zmq_socket = lambda *a, **k: None

    class Snapshots:
        def read_all(self):
            return []

    dpc.create_load_snapshot_reader = lambda *a, **k: Snapshots()

    def launch(self, server_args, port_args):
        for r in range(self.launch_dp_size):
            self.workers[r] = Recorder(r)

    dpc.DataParallelController.launch_dp_schedulers = launch
    try:
        build_controller(None)
        expect(False, "refused without --kv-events-config")
    except RuntimeError as e:
        expect("--kv-events-config" in str(e) and "RADIXKV_DP_DISPATCH" in str(e), f"refused: {e}")

    print("-- the hook installed by load_plugins(); each rank followed on its own endpoint")
    ranks = [Rank(r, config, kind) for r in range(RANKS)]
    c = build_controller(config)
    d = c._radixkv_dispatcher
    expect(c.dispatching == d.dispatch, "the controller's dispatching is radixkv's")
    router = d.router
    for r in range(RANKS):
        probe(router, ranks, r)

    print("-- every decision equals the oracle (caches, prompts sent, loads)")
    sent: list[tuple[list[int], int]] = []
    decisions = mismatches = balanced = by_prefix = by_keep = new_prefixes = by_writes = 0
    writes = [0.0] * RANKS
    for tokens in conversations(rng, 300):
        loads = [(rng.randrange(0, 8), rng.choice([0, 100, 2000, 9000])) for _ in range(RANKS)]
        if rng.random() < 0.15:
            loads[rng.randrange(RANKS)] = (9, 40000)
        active = [True] * RANKS
        if rng.random() < 0.1:
            active[rng.randrange(RANKS)] = False
        c.dp_budget.total_requests = [q for q, _ in loads]
        c.dp_budget.total_tokens = [t for _, t in loads]
        c._active_workers = [r for r in range(RANKS) if active[r]]
        want, want_prefix, want_kept = oracle(ranks, sent, tokens, loads, active, writes)
        new_prefixes += int(want_prefix == 0)
        # Decisions the recent writes made: unequal to the rule without them.
        by_writes += int(want != oracle(ranks, sent, tokens, loads, active, [0.0] * RANKS)[0])
        by_prefix += int(want_prefix > 0)
        by_keep += int(want_kept)
        sent_frames.clear()
        c.dispatching(Req(tokens))
        got = sent_frames[0][0] if sent_frames else None
        decisions += 1
        balanced += int(bool(overloaded(loads, active)))
        if got != want:
            mismatches += 1
            print(
                f"  request {decisions}: radixkv {got}, oracle {want}, "
                f"loads {loads}, active {active}"
            )
        if got is not None:
            wrote(writes, ranks, got, len(tokens) - want_prefix)
        sent.append((tokens, got))
        ranks[got].serve(tokens)
        wait_applied(router, ranks, tokens)
    c._active_workers = list(range(RANKS))
    if mismatches:
        print(f"DIFFERENT: {mismatches} of {decisions} decisions unequal to the oracle")
    expect(
        mismatches == 0,
        f"{decisions} decisions, {mismatches} unequal to the oracle "
        f"({by_prefix} to a rank holding a prefix, {balanced} under imbalance)",
    )
    expect(by_prefix >= 100 and balanced >= 10, "both rules exercised")
    if OPTIONS.get("new_prefix") == "least_written":
        expect(
            new_prefixes >= 10 and by_writes >= 10,
            f"{new_prefixes} decisions of a prompt no rank held any of; "
            f"{by_writes} decided by the ranks' recent writes",
        )
    if "keep_prefix_tokens" in EXTRA:
        expect(by_keep >= 10, f"{by_keep} decisions to a loaded rank keeping its prefix")
    expect(
        d.fallbacks == 0 and d.routed == decisions,
        f"all routed by radixkv ({d.routed}), no fallback",
    )

    print("-- routed_dp_rank is honoured")
    sent_frames.clear()
    c.dispatching(Req(sent[-1][0], routed=(sent[-1][1] + 1) % RANKS))
    expect(sent_frames[0][0] == (sent[-1][1] + 1) % RANKS, "sent to the rank the request names")

    print("-- a restarted rank is cleared and followed again")
    victim = sent[-1][1]
    prompt = sent[-1][0]
    ranks[victim].restart()
    probe(router, ranks, victim)
    wait_applied(router, ranks, prompt)
    expect(router.scores(prompt)[victim] == 0, f"rank {victim}'s old blocks gone after its restart")

    print("-- a lost batch (no replay): total_tokens until the rank clears")
    lossy = (victim + 1) % RANKS
    ranks[lossy].lose_next = True
    ranks[lossy].serve([7, 7, 7, 7, 7, 7])
    ranks[lossy].serve([8, 8, 8, 8])  # the next batch shows the gap
    deadline = time.monotonic() + 20
    while lossy not in router.stale_ranks():
        if time.monotonic() > deadline:
            expect(False, "the gap seen")
        time.sleep(0.005)
    expect(True, f"rank {lossy}'s gap seen: stale")
    c.dp_budget.total_requests = [0] * RANKS
    c.dp_budget.total_tokens = [500, 10, 300, 400]
    sent_frames.clear()
    before = d.fallbacks
    c.dispatching(Req(prompt))
    expect(
        d.fallbacks == before + 1 and sent_frames[0][0] == 1,
        "by total_tokens (the least tokens: rank 1)",
    )
    # Its clearing: SGLang's cache reset publishes AllBlocksCleared.
    ranks[lossy].cache.reset()
    events = ranks[lossy].cache.take_events()
    ranks[lossy].pub.publish(KVEventBatch(ts=time.time(), events=events))
    ranks[lossy].pub._event_queue.join()
    deadline = time.monotonic() + 20
    while router.stale_ranks():
        if time.monotonic() > deadline:
            expect(False, "the rank no longer stale after its clearing")
        time.sleep(0.005)
    expect(True, "the rank followed again after its AllBlocksCleared")

    print("-- a lagging rank: its events late, its requests still follow it")
    c.dp_budget.total_tokens = [0] * RANKS
    head = [rng.randrange(3000, 4000) for _ in range(24)]
    c.dp_budget.total_requests = [0] * RANKS
    sent_frames.clear()
    c.dispatching(Req(head))
    laggard = sent_frames[0][0]
    ranks[laggard].serve(head, hold=True)
    # The laggard is busier than the others but not overloaded (2 of a
    # bound of 6): only what the router sent it says it has the prefix.
    c.dp_budget.total_requests = [2 if r == laggard else 0 for r in range(RANKS)]
    expect(router.scores(head)[laggard] == 0, "the laggard's events not in yet")
    sent_frames.clear()
    c.dispatching(Req(head + [9, 9]))
    expect(sent_frames[0][0] == laggard, f"the follow-up sent to rank {laggard}, where its prefix was sent")
    loads = [(2 if r == laggard else 0, 0) for r in range(RANKS)]
    expect(
        forgetful_router().route(head + [9, 9], None, loads) != laggard,
        "the negative control (no memory of what it sent) sends it elsewhere",
    )
    ranks[laggard].release_held()
    wait_applied(router, ranks, head)
    expect(router.scores(head)[laggard] == len(head), "the late events applied: the prefix is cached there")
    expect(laggard not in router.stale_ranks(), "lag is not a gap: the rank is not stale")

    print("-- a burst of one prefix, dispatched before any rank caches it")

    def burst(dispatcher_router) -> list[int]:
        radixkv.sglang_dp.attach(c, router=dispatcher_router)
        c.dp_budget.total_requests = [0] * RANKS
        c.dp_budget.total_tokens = [0] * RANKS
        head = [rng.randrange(2000, 3000) for _ in range(40)]
        out = []
        for i in range(6):
            sent_frames.clear()
            c.dispatching(Req(head + [5000 + i, 1]))
            out.append(sent_frames[0][0])
        return out

    real = burst(router)
    expect(len(set(real)) == 1, f"radixkv sends the burst to one rank: {real}")
    blind = burst(forgetful_router())
    expect(
        len(set(blind)) > 1,
        f"the negative control (no memory of what it sent) spreads it: {blind}",
    )

    for r in ranks:
        r.pub.shutdown()
    print(f"dp_dispatch ({kind} ranks): {decisions} decisions equal to the oracle, faults handled")


if __name__ == "__main__":
    main()
