"""What only a wheel built with the feature `test-hooks` can show (never the
released one: scripts/python-package-check.sh runs this file against such a
wheel, and checks that the released wheel has none of these hooks):

* every Python entry point runs inside the panic guard: with
  `_panic_at_next_entry` armed, each method, getter, setter, constructor and
  function of the extension raises a `RuntimeError` (an `Exception`), never
  PyO3's `PanicException` (a `BaseException`); a table covers every public
  name of every class, so a new method without an entry fails the test;
* once the SGLang tree's mirror is inconsistent, every call on the tree and
  its nodes raises `radixkv.errors.CacheError` naming the first
  inconsistency, and no size is answered;
* the GIL is released while an insert is inside the tree (the store gate).
"""

from __future__ import annotations

import threading
from array import array
from types import SimpleNamespace

import pytest

import radixkv
from radixkv import _radixkv as ext
from radixkv import errors


def key(tokens):
    return SimpleNamespace(token_ids=array("q", tokens), extra_key=None, cache_salt=None, limit=None, is_bigram=False)


def world() -> SimpleNamespace:
    """One live object of every class, and what their calls take."""
    w = SimpleNamespace()
    w.rc = radixkv.RadixCache(events=True)
    w.rc.insert([1, 2, 3], [4, 5, 6])
    w.match = w.rc.match_and_pin([1, 2, 3])
    w.lease, w.handle = w.match.lease, w.match.handle
    w.pc = radixkv.PagedCache(pages_per_device=16, devices=2, host_pages=16, events=True)
    w.pc.insert_pages([7, 8], w.pc.alloc(2))
    w.span = w.pc.alloc(2)
    w.req = w.pc.begin([1, 2])
    w.copy = w.pc.copy_prefix([7, 8], 0, 1)
    w.view = w.copy.view()
    w.evicted = w.rc.evict(0)
    w.sizes = w.rc.sizes()
    w.inserted = w.rc.insert([1], [4])
    w.watched = radixkv.PagedCache(pages_per_device=16, watermarks=(2, 4))
    w.evictor = w.watched.start_evictor()
    w.tree = radixkv.SglangTree(page_size=1, events=True)
    w.tree.insert_key(key([1, 2, 3]), [1, 2, 3], 0, 0)
    _, w.node = w.tree.match_key(key([1, 2, 3]))
    w.dp = radixkv.DpRouter(2, 2)
    return w


def shared(c: str) -> dict:
    """The calls both kinds of cache have, on `w.<c>`."""
    return {
        "__new__": None,  # the kind's own
        "page_size": lambda w: getattr(w, c).page_size,
        "devices": lambda w: getattr(w, c).devices,
        "has_host_tier": lambda w: getattr(w, c).has_host_tier,
        "eviction_policy": lambda w: getattr(w, c).eviction_policy,
        "eviction_policy=": lambda w: setattr(getattr(w, c), "eviction_policy", "lru"),
        "peek": lambda w: getattr(w, c).peek([1]),
        "peek_tiers": lambda w: getattr(w, c).peek_tiers([1]),
        "match_prefix": lambda w: getattr(w, c).match_prefix([1]),
        "match_and_pin": lambda w: getattr(w, c).match_and_pin([1]),
        "pin": lambda w: getattr(w, c).pin(w.handle),
        "evict": lambda w: getattr(w, c).evict(0),
        "evict_from": lambda w: getattr(w, c).evict_from([1]),
        "sizes": lambda w: getattr(w, c).sizes(),
        "resident_tokens": lambda w: getattr(w, c).resident_tokens(),
        "node_count": lambda w: getattr(w, c).node_count(),
        "check": lambda w: getattr(w, c).check(),
        "audit": lambda w: getattr(w, c).audit(),
        "reclaim": lambda w: getattr(w, c).reclaim(),
        "eviction_metrics": lambda w: getattr(w, c).eviction_metrics(),
        "take_events": lambda w: getattr(w, c).take_events(),
        "_hold_next_store": lambda w: getattr(w, c)._hold_next_store(),
        "_wait_store_parked": lambda w: getattr(w, c)._wait_store_parked(0.0),
        "_release_store": lambda w: getattr(w, c)._release_store(),
        "_store_timed_out": lambda w: getattr(w, c)._store_timed_out(),
    }


CALLS = {
    "RadixCache": {
        **shared("rc"),
        "__new__": lambda w: radixkv.RadixCache(),
        "insert": lambda w: w.rc.insert([9], [9]),
    },
    "PagedCache": {
        **shared("pc"),
        "__new__": lambda w: radixkv.PagedCache(pages_per_device=4),
        "alloc": lambda w: w.pc.alloc(1),
        "insert_pages": lambda w: w.pc.insert_pages([9], w.span),
        "free_pages": lambda w: w.pc.free_pages(),
        "num_pages": lambda w: w.pc.num_pages(),
        "watermarks": lambda w: w.pc.watermarks,
        "set_watermarks": lambda w: w.pc.set_watermarks(1, 2),
        "begin": lambda w: w.pc.begin([1]),
        "copy_prefix": lambda w: w.pc.copy_prefix([7, 8], 0, 1),
        "evict_with_write_back": lambda w: w.pc.evict_with_write_back(1, lambda c: True),
        "start_evictor": lambda w: w.pc.start_evictor(),
    },
    "Lease": {
        "close": lambda w: w.lease.close(),
        "closed": lambda w: w.lease.closed,
        "empty": lambda w: w.lease.empty,
        "tier": lambda w: w.lease.tier,
        "__enter__": lambda w: w.lease.__enter__(),
        "__exit__": lambda w: w.lease.__exit__(None, None, None),
        "__repr__": lambda w: repr(w.lease),
    },
    "NodeHandle": {
        "is_root": lambda w: w.handle.is_root,
        "tier": lambda w: w.handle.tier,
    },
    "MatchResult": {"__repr__": lambda w: repr(w.match)},
    "InsertResult": {"__repr__": lambda w: repr(w.inserted)},
    "Evicted": {"__repr__": lambda w: repr(w.evicted)},
    "Sizes": {"__repr__": lambda w: repr(w.sizes)},
    "CopyView": {},
    "PageSpan": {
        "pages": lambda w: w.span.pages,
        "slots": lambda w: w.span.slots,
        "tokens": lambda w: w.span.tokens,
        "tier": lambda w: w.span.tier,
        "close": lambda w: w.span.close(),
        "__enter__": lambda w: w.span.__enter__(),
        "__exit__": lambda w: w.span.__exit__(None, None, None),
    },
    "Request": {
        "cached_len": lambda w: w.req.cached_len,
        "backed_len": lambda w: w.req.backed_len,
        "host_len": lambda w: w.req.host_len,
        "peer": lambda w: w.req.peer,
        "tokens": lambda w: w.req.tokens,
        "slots": lambda w: w.req.slots(),
        "extend": lambda w: w.req.extend([3]),
        "reserve": lambda w: w.req.reserve(),
        "commit_chunk": lambda w: w.req.commit_chunk(0),
        "finish": lambda w: w.req.finish(),
        "load_from": lambda w: w.req.load_from("host", lambda c: True),
        "close": lambda w: w.req.close(),
        "__enter__": lambda w: w.req.__enter__(),
        "__exit__": lambda w: w.req.__exit__(None, None, None),
    },
    "PrefixCopy": {
        "view": lambda w: w.copy.view(),
        "complete": lambda w: w.copy.complete(),
        "close": lambda w: w.copy.close(),
        "__enter__": lambda w: w.copy.__enter__(),
        "__exit__": lambda w: w.copy.__exit__(None, None, None),
    },
    "Evictor": {
        "stats": lambda w: w.evictor.stats(),
        "stop": lambda w: w.evictor.stop(),
    },
    "SglangTree": {
        "__new__": lambda w: radixkv.SglangTree(page_size=1),
        "id": lambda w: w.tree.id,
        "root": lambda w: w.tree.root,
        "page_size": lambda w: w.tree.page_size,
        "match_key": lambda w: w.tree.match_key(key([1])),
        "insert_key": lambda w: w.tree.insert_key(key([5]), [5], 0, 0),
        "checkpoint": lambda w: w.tree.checkpoint([1, 2], [1, 2], 2, None, None, 0, 0, 2),
        "evict": lambda w: w.tree.evict(1),
        "inc_lock_ref": lambda w: w.tree.inc_lock_ref(w.node),
        "dec_lock_ref": lambda w: w.tree.dec_lock_ref(w.node),
        "path_values": lambda w: w.tree.path_values(w.node),
        "evictable_size": lambda w: w.tree.evictable_size(),
        "protected_size": lambda w: w.tree.protected_size(),
        "node_count": lambda w: w.tree.node_count(),
        "dfs_weight_order": lambda w: w.tree.dfs_weight_order([w.node]),
        "take_events": lambda w: w.tree.take_events(),
        "outline": lambda w: w.tree.outline(),
        "audit": lambda w: w.tree.audit(),
        "_break_mirror": lambda w: w.tree._break_mirror("x"),
    },
    "DpRouter": {
        "__new__": lambda w: radixkv.DpRouter(2, 2),
        "ranks": lambda w: w.dp.ranks,
        "page_size": lambda w: w.dp.page_size,
        # An empty SGLang batch: [ts, [], rank].
        "ingest": lambda w: w.dp.ingest(0, b"\x93\x00\x90\xc0"),
        "scores": lambda w: w.dp.scores([1, 2]),
        "route": lambda w: w.dp.route([1, 2]),
        "settled": lambda w: w.dp.settled([1, 2], 0),
        "subscribe": lambda w: w.dp.subscribe(1, "tcp://127.0.0.1:9"),
        "stale_ranks": lambda w: w.dp.stale_ranks(),
        "clear": lambda w: w.dp.clear(0),
        "dispatched": lambda w: w.dp.dispatched(),
        "__repr__": lambda w: repr(w.dp),
    },
    "SglangNode": {
        "id": lambda w: w.node.id,
        "tree_id": lambda w: w.node.tree_id,
        "is_root": lambda w: w.node.is_root,
        "lock_ref": lambda w: w.node.lock_ref,
        "__hash__": lambda w: hash(w.node),
        "__eq__": lambda w: w.node == w.node,
        "__repr__": lambda w: repr(w.node),
    },
}

FUNCTIONS = {
    "namespace_for": lambda: radixkv.namespace_for("a"),
    "reads_without_copy": lambda: radixkv.reads_without_copy([1]),
    "gil_release_tokens": lambda: radixkv.gil_release_tokens(),
    "set_gil_release_tokens": lambda: radixkv.set_gil_release_tokens(radixkv.gil_release_tokens()),
    "_panic_inside": lambda: ext._panic_inside("x"),
    "_panic_at_next_entry": lambda: ext._panic_at_next_entry(),
}

#: Classes whose other attributes are fields PyO3 generates (`get_all`):
#: they copy a value out and run none of radixkv's code.
DATA_CLASSES = {"MatchResult", "InsertResult", "Evicted", "Sizes", "CopyView"}


def names(cls: type) -> set:
    """A class's attributes from its own code: public ones and test hooks
    (a setter is listed in the table as `name=` beside its getter)."""
    return {name for name in vars(cls) if not name.startswith("__")}


def test_the_table_covers_every_entry_point():
    classes = {n: c for n, c in vars(ext).items() if isinstance(c, type)}
    assert set(classes) == set(CALLS), "a class without a table entry (or an entry without a class)"
    for n, cls in classes.items():
        have = names(cls)
        covered = {k.rstrip("=") for k in CALLS[n] if not k.startswith("__")}
        if n in DATA_CLASSES:
            assert not covered, n
            continue
        assert have == covered, f"{n}: not in the table {sorted(have - covered)}, gone {sorted(covered - have)}"
    functions = {n for n, f in vars(ext).items() if callable(f) and not isinstance(f, type)}
    assert functions == set(FUNCTIONS)


def panics_as_runtime_error(call) -> None:
    ext._panic_at_next_entry()
    try:
        call()
    except BaseException as e:  # noqa: BLE001 - the point: nothing but an Exception
        assert type(e) is RuntimeError, f"{type(e).__mro__}: {e}"
        assert "caught at the boundary" in str(e) and "_panic_at_next_entry" in str(e), str(e)
    else:
        # Fire the hook still armed, so that no other test meets it.
        with pytest.raises(RuntimeError):
            radixkv.namespace_for("a")
        raise AssertionError("the call returned: it never entered the guard")
    # The hook fired once: the next call runs normally.
    assert radixkv.namespace_for("a") == "lora:a"


@pytest.mark.parametrize("cls,name", [(c, n) for c, calls in CALLS.items() for n in calls])
def test_every_method_turns_a_panic_into_a_runtime_error(cls, name):
    w = world()
    panics_as_runtime_error(lambda: CALLS[cls][name](w))
    w.evictor.stop()


@pytest.mark.parametrize("name", [n for n in FUNCTIONS if n != "_panic_at_next_entry"])
def test_every_function_turns_a_panic_into_a_runtime_error(name):
    panics_as_runtime_error(FUNCTIONS[name])


def test_a_rust_panic_is_a_runtime_error():
    with pytest.raises(RuntimeError, match="boom") as e:
        ext._panic_inside("boom")
    assert isinstance(e.value, Exception)


#: Calls on the tree and its nodes that answer constants (ids, the page
#: size, the root): right whatever the mirror says, so they still answer.
CONSTANTS = {"id", "root", "page_size", "tree_id", "is_root", "_break_mirror", "__new__"}


def test_once_the_mirror_is_inconsistent_every_call_raises_naming_it():
    tree_calls = {
        **{n: f for n, f in CALLS["SglangTree"].items() if n not in CONSTANTS},
        **{f"node.{n}": f for n, f in CALLS["SglangNode"].items() if n not in CONSTANTS and not n.startswith("__")},
    }
    w = world()
    lock_before = w.tree.inc_lock_ref(w.node)
    assert lock_before == -3
    w.tree._break_mirror("node 7: the test's inconsistency")
    for name, call in tree_calls.items():
        with pytest.raises(errors.CacheError, match="node 7: the test's inconsistency") as e:
            call(w)
        assert "refuses every call" in str(e.value), name
    # The constants still answer.
    assert w.tree.page_size == 1 and w.node.tree_id == w.tree.id


def test_the_gil_is_released_while_an_insert_is_inside_the_tree():
    # The insert's store parks its thread inside Rust (the tree's lock
    # held) until another Python thread lets it go: which that thread can
    # do only if the insert released the GIL. Without it, the park gives up
    # after 30 s and the test fails (nothing here depends on timing). The
    # key is as long as the threshold from which calls release the GIL.
    cache = radixkv.RadixCache(events=True)
    n = radixkv.gil_release_tokens()
    cache._hold_next_store()
    done = []
    inserter = threading.Thread(target=lambda: done.append(cache.insert(list(range(n)), list(range(n)))))
    inserter.start()
    assert cache._wait_store_parked(60.0), "the insert never reached its store"
    assert cache._release_store(), "no store was parked"
    inserter.join(60)
    assert not inserter.is_alive()
    assert not cache._store_timed_out(), "the GIL was held inside the insert"
    assert done[0].prefix_len == 0
    cache.audit()


def test_a_key_shorter_than_the_threshold_keeps_the_gil():
    # The same park, for a key one token short of the threshold: the insert
    # keeps the GIL, so this thread cannot run (and let the store go) until
    # the park gives up after 2 s. Had the insert released the GIL, this
    # thread would let it go at once (it polls without blocking).
    cache = radixkv.RadixCache(events=True)
    n = radixkv.gil_release_tokens() - 1
    cache._hold_next_store(2.0)
    inserter = threading.Thread(target=lambda: cache.insert(list(range(n)), list(range(n))))
    inserter.start()
    while inserter.is_alive():
        if cache._wait_store_parked(0.0):
            cache._release_store()
            break
    inserter.join(60)
    assert cache._store_timed_out(), "the insert released the GIL for a short key"
    cache.audit()


def test_the_threshold_is_a_process_setting():
    before = radixkv.gil_release_tokens()
    try:
        radixkv.set_gil_release_tokens(0)
        assert radixkv.gil_release_tokens() == 0
        # Now even a 2-token insert releases it.
        cache = radixkv.RadixCache(events=True)
        cache._hold_next_store()
        inserter = threading.Thread(target=lambda: cache.insert([1, 2], [3, 4]))
        inserter.start()
        assert cache._wait_store_parked(60.0)
        assert cache._release_store()
        inserter.join(60)
        assert not cache._store_timed_out()
    finally:
        radixkv.set_gil_release_tokens(before)
