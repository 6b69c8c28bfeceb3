"""The core's API from Python: every call, the inputs it takes, its errors.
Run by scripts/python-package-check.sh in its own venv, against the
released wheel (what needs the test hooks is in test_hooks.py)."""

from __future__ import annotations

import gc
import threading
from array import array

import numpy as np
import pytest

import radixkv
from radixkv import errors


def test_evict_from_takes_a_block_and_what_continues_it():
    cache = radixkv.RadixCache(page_size=2, devices=2)
    cache.insert([1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14, 15], tier=0)
    cache.insert([1, 2, 3, 4, 7, 7], [10, 11, 12, 13, 16, 17], tier=0)
    cache.insert([1, 2, 3, 4], [20, 21, 22, 23], tier=1)
    ev = cache.evict_from(array("q", [1, 2, 3, 4]), tier=0)
    assert (ev.tokens, ev.leaves, sorted(ev.values.tolist())) == (6, 3, [12, 13, 14, 15, 16, 17])
    assert cache.peek([1, 2, 3, 4, 5, 6]) == [2, 4]
    assert cache.evict_from([9, 9], tier=0).tokens == 0
    with pytest.raises(errors.InvalidArgument):
        cache.evict_from([1, 2, 3])
    cache.audit()


def test_insert_match_peek_evict_as_the_core_does():
    cache = radixkv.RadixCache(devices=2)
    r = cache.insert([1, 2, 3, 4], [10, 11, 12, 13], tier=0)
    assert r.prefix_len == 0
    assert r.adopted == [(0, 4)]
    m = cache.match_and_pin(array("q", [1, 2, 3, 9]), tier=0)
    assert m.len == 3
    assert m.values.dtype == np.uint32
    assert m.values.tolist() == [10, 11, 12]
    assert cache.peek([1, 2, 3, 4]) == [4, 0]
    ev = cache.evict(100, tier=0)
    assert ev.values.tolist() == [13], "the pinned prefix stays"
    m.lease.close()
    assert cache.evict(100, tier=0).tokens == 3
    cache.audit()
    assert cache.check() is None


def test_every_input_kind_reads_the_same_ids():
    cache = radixkv.RadixCache()
    want = [5, 6, 7, 8]
    inputs = [
        want,
        tuple(want),
        array("q", want),
        array("I", want),
        array("i", want),
        np.array(want, dtype=np.int64),
        np.array(want, dtype=np.uint32),
        np.array(want, dtype=np.int32),
        np.array(want, dtype=np.uint64),
    ]
    cache.insert(want, [1, 2, 3, 4])
    for x in inputs:
        assert cache.match_prefix(x).len == 4, type(x)
    # Read-only contiguous unsigned 32-bit arrays are read in place; a
    # writable one is copied (another thread could write it while the walk
    # runs without the GIL); others are converted.
    frozen = np.array(want, dtype=np.uint32)
    frozen.setflags(write=False)
    assert radixkv.reads_without_copy(frozen)
    assert radixkv.reads_without_copy(memoryview(array("I", want).tobytes()).cast("I"))
    assert not radixkv.reads_without_copy(np.array(want, dtype=np.uint32))
    assert not radixkv.reads_without_copy(array("I", want))
    assert not radixkv.reads_without_copy(array("q", want))
    assert not radixkv.reads_without_copy(want)
    assert cache.match_prefix(frozen).len == 4
    # A non-contiguous view is converted too, with the same ids.
    strided = np.array([5, 0, 6, 0, 7, 0, 8, 0], dtype=np.uint32)[::2]
    assert cache.match_prefix(strided).len == 4
    cache.audit()


def test_bad_input_is_a_python_exception_naming_the_argument():
    cache = radixkv.RadixCache(page_size=2)
    with pytest.raises(TypeError, match="tokens"):
        cache.insert(np.array([1.0, 2.0]), [1, 2])
    with pytest.raises(TypeError, match="tokens"):
        cache.insert("abcd", [1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"tokens\[1\] = -3"):
        cache.insert([1, -3], [1, 2])
    with pytest.raises(ValueError, match=r"values\[0\] = 4294967296"):
        cache.insert([1, 2], [2**32, 1])
    with pytest.raises(ValueError, match="one-dimensional"):
        cache.insert(np.zeros((2, 2), dtype=np.int64), [1, 2, 3, 4])
    with pytest.raises(errors.InvalidArgument, match="2 values for 4 tokens"):
        cache.insert([1, 2, 3, 4], [1, 2])
    with pytest.raises(ValueError, match="not a multiple of the page size"):
        cache.insert([1, 2, 3], [1, 2, 3])
    with pytest.raises(errors.UnknownTier) as e:
        cache.match_prefix([1, 2], tier=5)
    assert isinstance(e.value, KeyError)
    assert "device 5 does not exist" in str(e.value)
    with pytest.raises(errors.UnknownTier, match="no host tier"):
        cache.resident_tokens("host")
    with pytest.raises(ValueError, match="a tier is a device index"):
        cache.sizes("gpu")
    with pytest.raises(TypeError, match="a tier"):
        cache.sizes(True)
    with pytest.raises(errors.InvalidArgument, match="page size 0"):
        radixkv.RadixCache(page_size=0)
    with pytest.raises(errors.InvalidArgument, match="unknown eviction policy"):
        radixkv.RadixCache(eviction_policy="nope")
    with pytest.raises(errors.InvalidArgument, match="clock"):
        radixkv.RadixCache(clock="wall")
    cache.audit()


def test_a_lease_closes_once_works_as_a_context_and_keeps_its_cache_alive():
    cache = radixkv.RadixCache()
    cache.insert([1, 2], [3, 4])
    with cache.match_and_pin([1, 2]).lease as lease:
        assert not lease.closed and not lease.empty
        assert cache.sizes().protected == 2
    assert lease.closed
    lease.close()  # again: nothing
    assert cache.sizes().protected == 0
    # The lease holds the cache: dropping every other reference keeps it.
    m = cache.match_and_pin([1, 2])
    held = m.lease
    del cache, m
    gc.collect()
    assert not held.closed
    held.close()


def test_a_stale_handle_is_a_key_error_and_a_foreign_one_a_value_error():
    cache = radixkv.RadixCache()
    cache.insert([1, 2], [3, 4])
    m = cache.match_prefix([1, 2])
    cache.evict(2)
    with pytest.raises(errors.StaleHandle) as e:
        cache.pin(m.handle)
    assert isinstance(e.value, KeyError)
    other = radixkv.RadixCache()
    with pytest.raises(errors.ForeignObject):
        other.pin(m.handle)


def test_namespaces_share_nothing_and_follow_the_core_rule():
    cache = radixkv.RadixCache()
    ns = radixkv.namespace_for("math", "t1")
    assert ns == "lora:math\x1ft1"
    assert radixkv.namespace_for(None, None) is None
    cache.insert([1, 2, 3], [4, 5, 6], namespace=ns)
    assert cache.peek([1, 2, 3], namespace=ns) == [3]
    assert cache.peek([1, 2, 3]) == [0]
    assert cache.peek([1, 2, 3], namespace="t1") == [0]


def test_the_host_tier_and_tier_lengths():
    cache = radixkv.RadixCache(devices=2, host_pages=64)
    assert cache.has_host_tier
    cache.insert([1, 2, 3], [7, 8, 9], tier="host")
    cache.insert([1, 2], [4, 5], tier=0)
    assert cache.peek_tiers([1, 2, 3]) == ([2, 0], 3)
    m = cache.match_prefix([1, 2, 3], tier=0)
    assert (m.len, m.host_len) == (2, 3)
    assert cache.resident_tokens("host") == 3
    cache.audit()


def test_policies_switch_and_metrics_count():
    cache = radixkv.RadixCache(eviction_policy="lfu")
    assert cache.eviction_policy == "lfu"
    cache.eviction_policy = "mru"
    assert cache.eviction_policy == "mru"
    with pytest.raises(errors.InvalidArgument):
        cache.eviction_policy = "nope"
    cache.insert([1, 2, 3], [4, 5, 6])
    cache.evict(1)
    m = cache.eviction_metrics()
    assert (m["evict_calls"], m["evicted_leaves"], m["evicted_tokens"]) == (1, 1, 3)


def test_hits_counted_on_insert_past_inserted_len_and_the_slru_threshold():
    match = radixkv.RadixCache()
    match.insert([1, 2], [5, 6])
    match.match_prefix([1, 2])
    assert match.match_prefix([1, 2]).hits == 2
    cache = radixkv.RadixCache(hit_counts="insert")
    cache.insert([1, 2], [5, 6])
    # The same request, two tokens further: [1, 2] is not counted again.
    cache.insert([1, 2, 3, 4], [5, 6, 7, 8], inserted_len=2)
    assert cache.match_prefix([1, 2]).hits == 1
    assert cache.match_prefix([1, 2, 3, 4]).hits == 1
    # Another request's insert counts every node it passes.
    cache.insert([1, 2, 3, 4], [9, 9, 9, 9])
    assert cache.match_prefix([1, 2]).hits == 2
    # slru with a threshold of 2: the leaf hit twice outlives the one hit once.
    slru = radixkv.RadixCache(eviction_policy="slru", hit_counts="insert", slru_protected_threshold=2)
    slru.insert([1], [10])
    slru.insert([1], [11])
    slru.insert([2], [20])
    assert slru.evict(1).values.tolist() == [20]
    with pytest.raises(errors.InvalidArgument, match="hit_counts"):
        radixkv.RadixCache(hit_counts="sometimes")
    with pytest.raises(errors.InvalidArgument, match="threshold"):
        radixkv.RadixCache(slru_protected_threshold=0)


def test_events_report_stores_splits_and_removals():
    cache = radixkv.RadixCache(page_size=2, events=True)
    cache.insert([1, 2, 3, 4], [5, 6, 7, 8])
    cache.insert([1, 2, 9, 9], [5, 6, 1, 2])
    cache.evict(2)
    kinds = [e[0] for e in cache.take_events()]
    assert kinds == ["stored", "split", "stored", "removed"]
    assert cache.take_events() == []
    with pytest.raises(errors.InvalidArgument, match="events=True"):
        radixkv.RadixCache().take_events()


def test_a_request_lifecycle_on_a_paged_cache():
    cache = radixkv.PagedCache(pages_per_device=64, page_size=2)
    r = cache.begin([1, 2, 3, 4, 5])
    assert r.cached_len == 0
    r.reserve()
    assert len(r.slots()) == 6
    res = r.finish()
    assert res.adopted == [(0, 4)]
    with pytest.raises(errors.LeaseClosed):
        r.reserve()
    r2 = cache.begin([1, 2, 3, 4, 5, 6])
    assert r2.cached_len == 4
    r2.close()
    cache.audit()
    assert cache.free_pages() == 63 - 2


def test_page_spans_copies_and_write_back():
    cache = radixkv.PagedCache(pages_per_device=16, page_size=2, devices=2, host_pages=64)
    span = cache.alloc(6, tier=0)
    assert span.tokens == 6 and span.tier == 0
    cache.insert_pages([1, 2, 3, 4, 5, 6], span)
    with pytest.raises(errors.LeaseClosed):
        span.tokens
    copy = cache.copy_prefix([1, 2, 3, 4, 5, 6], 0, 1)
    v = copy.view()
    assert (v.source, v.dest, v.range) == (0, 1, (0, 6))
    assert sum(run[2] for run in v.runs) == 6
    copy.complete()
    assert cache.peek([1, 2, 3, 4, 5, 6]) == [6, 6]
    seen = []
    ev = cache.evict_with_write_back(6, lambda c: seen.append(c.range) or True, tier=0)
    assert (ev.tokens, ev.written_back) == (6, 6)
    assert seen == [(0, 6)]
    assert cache.peek_tiers([1, 2, 3, 4, 5, 6]) == ([0, 6], 6)
    # A request on device 0 loads its prefix from the host.
    r = cache.begin([1, 2, 3, 4, 5, 6, 7])
    assert r.cached_len == 0 and r.host_len == 6
    assert r.load_from("host", lambda c: True) == 6
    assert r.cached_len == 6
    r.close()
    cache.audit()


def test_a_paged_cache_refuses_plain_values_and_a_plain_cache_pages():
    paged = radixkv.PagedCache(pages_per_device=8)
    assert not hasattr(paged, "insert")
    assert not hasattr(radixkv.RadixCache(), "alloc")


def test_the_background_evictor_starts_and_stops():
    cache = radixkv.PagedCache(pages_per_device=65, page_size=4, watermarks=(8, 16))
    ev = cache.start_evictor()
    for k in range(30):
        cache.insert_pages([k, k, 1, 2, 3, 4, 5, 6], cache.alloc(8))
    ev.stop()
    cache.audit()
    with pytest.raises(errors.InvalidArgument, match="already"):
        cache.start_evictor()


def test_tlru_trims_a_conversation_past_its_budget_first():
    c = radixkv.RadixCache(eviction_policy="tlru", tlru_threshold=4)
    c.insert([20] * 8, [30] * 8)  # older, all within its budget
    c.insert([1, 2, 3, 4], [10, 11, 12, 13])
    c.insert(list(range(1, 9)), list(range(10, 18)))  # its last 4 past it
    assert c.evict(1).values.tolist() == [14, 15, 16, 17]
    assert c.evict(1).values.tolist() == [30] * 8
    lru = radixkv.RadixCache(eviction_policy="lru", tlru_threshold=4)
    lru.insert([20] * 8, [30] * 8)
    lru.insert(list(range(1, 9)), list(range(10, 18)))
    assert lru.evict(1).values.tolist() == [30] * 8
    with pytest.raises(OverflowError):
        radixkv.RadixCache(eviction_policy="tlru", tlru_threshold=-1)
