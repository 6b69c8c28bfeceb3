"""radixkv.DpRouter from Python: batches encoded by msgpack in vLLM's and
SGLang's shapes, scores per rank, routes with SGLang-style loads, the
burst that follows its first request, gaps, and refusals."""

from __future__ import annotations

from array import array

import msgpack
import pytest

import radixkv
from radixkv import errors


def stored(hashes, parent, tokens, *, block_size=2, salt=None):
    e = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": block_size,
    }
    if salt is not None:
        e["cache_salt"] = salt
    return e


def batch(*events, rank=None):
    # SGLang 0.5.23 and vLLM publish [ts, events, data-parallel rank].
    return msgpack.packb([1.5, list(events), rank])


def test_scores_and_routes_follow_each_ranks_cache():
    r = radixkv.DpRouter(3, 2)
    assert (r.ranks, r.page_size) == (3, 2)
    assert r.ingest(1, batch(stored([11, -12], None, [5, 6, 7, 8])), seq=0) == 1
    # vLLM's array-like event form, bytes hashes.
    arr = ["BlockStored", [b"\x01\x02"], None, [5, 6], 2, None, None, None]
    assert r.ingest(2, batch(arr), seq=0) == 1
    assert r.scores(array("q", [5, 6, 7, 8, 9])) == [0, 4, 2]
    assert r.route([5, 6, 7, 8, 9]) == 1
    # SGLang's DPBudget loads: (requests, tokens) per rank.
    assert r.route([5, 6, 7, 8], loads=[(3, 0), (40, 0), (1, 0)]) == 2
    assert r.route([5, 6, 7, 8], active=[True, False, True]) == 2
    assert r.route([5, 6], active=[False, False, False]) is None


def test_namespaces_keep_apart():
    r = radixkv.DpRouter(2, 2)
    r.ingest(1, batch(stored([1], None, [5, 6], salt="tenant")))
    assert r.scores([5, 6]) == [0, 0]
    ns = radixkv.namespace_for(cache_salt="tenant")
    assert r.scores([5, 6], ns) == [0, 2]
    assert r.route([5, 6], ns) == 1


def test_a_burst_follows_its_first_request_and_a_blind_router_spreads_it():
    def burst(ttl):
        r = radixkv.DpRouter(4, 2, pending_ttl_s=ttl)
        requests = [0, 0, 0, 0]
        ranks = []
        for i in range(8):
            rank = r.route([40, 41, 42, 43, 100 + i], loads=[(q, 0) for q in requests])
            requests[rank] += 1
            ranks.append(rank)
        return ranks, r

    ranks, r = burst(60.0)
    assert ranks == [0] * 8
    assert r.dispatched() == 8
    r.settled([40, 41, 42, 43, 100], 0)
    assert r.dispatched() == 7
    blind, _ = burst(0.0)
    assert blind[:4] == [0, 1, 2, 3]


def test_a_gap_makes_the_rank_stale_until_it_clears():
    r = radixkv.DpRouter(2, 2)
    r.ingest(0, batch(stored([1], None, [5, 6])), seq=0)
    r.ingest(0, batch(stored([2], 1, [7, 8])), seq=4)
    assert r.stale_ranks() == [0]
    assert r.scores([5, 6]) == [0, 0]
    r.ingest(0, batch({"type": "AllBlocksCleared"}, stored([3], None, [5, 6])), seq=0)
    assert r.stale_ranks() == []
    assert r.scores([5, 6]) == [2, 0]
    r.clear(0)
    assert r.scores([5, 6]) == [0, 0]


def test_bad_input_raises_invalid_argument():
    r = radixkv.DpRouter(2, 2)
    with pytest.raises(errors.InvalidArgument, match="msgpack"):
        r.ingest(0, b"\xc1")
    with pytest.raises(errors.InvalidArgument, match="rank 5"):
        r.ingest(5, batch())
    with pytest.raises(errors.InvalidArgument, match="per rank"):
        r.route([1, 2], loads=[(0, 0)])
    with pytest.raises(errors.InvalidArgument, match="load"):
        radixkv.DpRouter(2, 2, load="latency")
    with pytest.raises(errors.InvalidArgument):
        radixkv.DpRouter(0, 2)
    with pytest.raises(errors.InvalidArgument, match="pending_ttl_s"):
        radixkv.DpRouter(2, 2, pending_ttl_s=-1.0)
    with pytest.raises(errors.InvalidArgument, match="above_mean"):
        radixkv.DpRouter(2, 2, balance="mean")
    # An event it cannot apply is skipped; the router keeps serving.
    assert r.ingest(0, batch(stored([9], 77, [1, 2]))) == 0
    assert r.route([1, 2]) in (0, 1)


def test_above_mean_keeps_a_prefix_the_global_rule_would_move():
    # Rank 1 holds [1, 2]; rank 3 is idle. The global rule calls the load
    # imbalanced (8 > 4 and 8 > 1.2 x 0) and sends the request to rank 3;
    # against the mean (5.5 requests, bound 1.2 x 5.5 = 6.6) rank 1 (6)
    # keeps it.
    loads = [(8, 0), (6, 0), (8, 0), (0, 0)]
    routes = {}
    for rule in ("global", "above_mean"):
        r = radixkv.DpRouter(4, 2, balance=rule, balance_abs=4, balance_rel=1.2)
        r.ingest(1, batch(stored([7], None, [1, 2])))
        routes[rule] = r.route([1, 2, 3], loads=loads)
    assert routes == {"global": 3, "above_mean": 1}


def test_keep_prefix_tokens_keeps_a_long_prefix_on_its_busy_rank():
    # Rank 1 holds [1, 2, 3, 4] and runs 12 requests (mean 7.25, bound
    # 1.2 x 7.25 = 8.7): it steps aside unless its 4 tokens are enough.
    loads = [(5, 0), (12, 0), (8, 0), (4, 0)]
    routes = {}
    for rule in ("global", "above_mean"):
        for keep in (None, 4, 5):
            r = radixkv.DpRouter(
                4, 2, balance=rule, balance_abs=4, balance_rel=1.2, keep_prefix_tokens=keep
            )
            r.ingest(1, batch(stored([7, 8], None, [1, 2, 3, 4])))
            routes[rule, keep] = r.route([1, 2, 3, 4, 9], loads=loads)
    assert routes == {
        ("global", None): 3,
        ("global", 4): 1,
        ("global", 5): 3,
        ("above_mean", None): 3,
        ("above_mean", 4): 1,
        ("above_mean", 5): 3,
    }
    with pytest.raises(OverflowError):
        radixkv.DpRouter(2, 2, keep_prefix_tokens=-1)


def test_new_prefix_least_written_sends_a_new_prompt_where_fewest_tokens_went():
    # Rank 0 is sent 4 new tokens, rank 1 (idle) 2, which decay rank 0's
    # count to 4/e (the window is one block while nothing is held). A
    # third new prompt with rank 0 the busier: "least_written" sends it
    # to rank 0 (1.47 < 2 tokens), "least_loaded" to rank 1.
    chosen = {}
    for rule in ("least_loaded", "least_written"):
        r = radixkv.DpRouter(2, 2, new_prefix=rule)
        assert r.route([1, 2, 3, 4]) == 0
        assert r.route([5, 6], loads=[(3, 0), (0, 0)]) == 1
        chosen[rule] = r.route([7, 8], loads=[(3, 0), (0, 0)])
    assert chosen == {"least_loaded": 1, "least_written": 0}
    with pytest.raises(errors.InvalidArgument, match="new_prefix"):
        radixkv.DpRouter(2, 2, new_prefix="random")


def test_a_subscribed_rank_is_followed_from_a_pyzmq_publisher():
    import socket
    import struct
    import time

    import zmq

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    try:
        r = radixkv.DpRouter(2, 2)
        r.subscribe(1, f"tcp://127.0.0.1:{port}")
        with pytest.raises(errors.InvalidArgument, match="subscribed"):
            r.ingest(1, batch())
        with pytest.raises(errors.InvalidArgument, match="tcp://"):
            r.subscribe(0, "ipc:///tmp/x")
        payload = batch(stored([1, 2], None, [5, 6, 7, 8]))
        deadline = time.monotonic() + 20
        # vLLM's and SGLang's frames: topic, 8-byte big-endian sequence,
        # payload. Sent again until the subscription has joined (a PUB
        # drops what it sends before); the repeats are duplicates.
        while r.scores([5, 6, 7, 8]) != [0, 4]:
            assert time.monotonic() < deadline, "never followed"
            pub.send_multipart([b"", struct.pack(">q", 0), payload])
            time.sleep(0.02)
        assert r.route([5, 6, 7, 8, 9]) == 1
        assert r.stale_ranks() == []
    finally:
        pub.close(linger=0)


def test_sglang_dp_derives_endpoints_and_options_as_sglang_does(monkeypatch):
    from radixkv import sglang_dp

    # SGLang's ZmqEventPublisher.offset_endpoint_port: the port plus the
    # rank; a wildcard bind is reached on the loopback.
    assert sglang_dp.rank_endpoint("tcp://*:5557", 0) == "tcp://127.0.0.1:5557"
    assert sglang_dp.rank_endpoint("tcp://10.0.0.2:5557", 3) == "tcp://10.0.0.2:5560"
    assert sglang_dp.rank_endpoint(None, 2) is None
    with pytest.raises(ValueError, match="tcp://"):
        sglang_dp.rank_endpoint("inproc://cache", 1)
    monkeypatch.delenv(sglang_dp.ENV, raising=False)
    assert not sglang_dp.enabled()
    monkeypatch.setenv(sglang_dp.ENV, "1")
    assert sglang_dp.enabled()
    monkeypatch.setenv(sglang_dp.OPTIONS_ENV, '{"balance_rel": 2.0, "pending_ttl_s": 1}')
    opts = sglang_dp.options()
    assert opts == {**sglang_dp.DEFAULT_OPTIONS, "balance_rel": 2.0, "pending_ttl_s": 1}
    radixkv.DpRouter(2, 16, **opts)
    monkeypatch.setenv(sglang_dp.OPTIONS_ENV, "[1]")
    with pytest.raises(ValueError, match="RADIXKV_DP_OPTIONS"):
        sglang_dp.options()
