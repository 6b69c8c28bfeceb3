"""The tree under the SGLang backend (`radixkv.SglangTree`), without SGLang:
keys are stand-ins with `RadixKey`'s attributes. What SGLang's own code
checks is in tests/sglang (scripts/sglang-check.sh)."""

from __future__ import annotations

from array import array
from types import SimpleNamespace

import numpy as np
import pytest
import radixkv
from radixkv import errors


def key(tokens, extra_key=None, cache_salt=None, limit=None, is_bigram=False):
    return SimpleNamespace(
        token_ids=array("q", tokens), extra_key=extra_key, cache_salt=cache_salt, limit=limit, is_bigram=is_bigram
    )


def tree(**kw):
    kw.setdefault("page_size", 1)
    return radixkv.SglangTree(**kw)


def test_match_insert_lock_and_sizes_as_sglang_counts_them():
    t = tree()
    assert t.insert_key(key([1, 2, 3, 4]), np.arange(10, 14), 0, 0) == 0
    assert t.insert_key(key([1, 2, 9]), [10, 11, 20], 0, 0) == 2
    n, node = t.match_key(key([1, 2, 3, 7]))
    assert n == 3 and not node.is_root
    assert t.path_values(node).tolist() == [10, 11, 12] and t.path_values(node).dtype == np.int64
    assert (t.evictable_size(), t.protected_size(), t.node_count()) == (5, 0, 4)
    assert t.inc_lock_ref(node) == -3
    assert t.inc_lock_ref(node) == 0
    assert (t.evictable_size(), t.protected_size()) == (2, 3)
    assert node.lock_ref == 2 and t.root.lock_ref == 1
    # Locked: only the unlocked leaves go.
    tokens, values, ends = t.evict(100)
    assert (tokens, sorted(values.tolist()), len(ends)) == (2, [13, 20], 2)
    assert t.dec_lock_ref(node) == 0 and t.dec_lock_ref(node) == 3
    t.audit()


def test_a_handle_survives_splits_and_is_refused_once_evicted():
    t = tree(page_size=2)
    t.insert_key(key([1, 2, 3, 4, 5, 6]), [1, 2, 3, 4, 5, 6], 0, 0)
    _, node = t.match_key(key([1, 2, 3, 4, 5, 6]))
    t.match_key(key([1, 2, 3, 4, 9, 9]))  # splits the node at 4
    t.insert_key(key([1, 2, 7, 7]), [1, 2, 8, 8], 0, 0)  # and at 2
    assert t.path_values(node).tolist() == [1, 2, 3, 4, 5, 6]
    assert t.inc_lock_ref(node) == -6 and t.dec_lock_ref(node) == 6
    t.evict(100)
    with pytest.raises(errors.StaleHandle):
        t.inc_lock_ref(node)
    with pytest.raises(errors.StaleHandle):
        t.path_values(node)
    t.audit()


def test_keys_follow_limit_pages_and_namespaces():
    t = tree(page_size=2)
    assert t.insert_key(key([1, 2, 3, 4, 5], limit=4), [1, 2, 3, 4, 5], 0, 0) == 0
    assert t.match_key(key([1, 2, 3, 4, 5]))[0] == 4
    # "" and None are different namespaces, as in SGLang.
    assert t.match_key(key([1, 2, 3, 4], extra_key=""))[0] == 0
    assert t.match_key(key([1, 2, 3, 4], cache_salt="s"))[0] == 0
    t.insert_key(key([1, 2], extra_key=""), [7, 7], 0, 0)
    assert t.match_key(key([1, 2], extra_key=""))[0] == 2
    assert t.match_key(key([1]))[1].is_root


def test_dfs_weight_order_puts_heavy_subtrees_first_and_the_root_last():
    t = tree()
    t.insert_key(key([1, 2, 3]), [1, 2, 3], 0, 0)
    t.insert_key(key([1, 2, 4]), [1, 2, 4], 0, 0)
    t.insert_key(key([5]), [5], 0, 0)
    a = t.match_key(key([1, 2, 3]))[1]
    b = t.match_key(key([1, 2, 4]))[1]
    c = t.match_key(key([5]))[1]
    nodes = [t.root, c, b, a, b]
    # [1 2] weighs 3 (b twice, a once): b's subtree first, then a; then c.
    assert t.dfs_weight_order(nodes) == [2, 4, 3, 1, 0]


def test_events_carry_sglangs_hash_chain():
    t = tree(page_size=2, events=True)
    t.insert_key(key([1, 2, 3, 4]), [1, 2, 3, 4], 0, 0)
    t.insert_key(key([1, 2, 3, 4, 5, 6], cache_salt="s"), [1, 2, 3, 4, 5, 6], 0, 0)
    t.evict(100)
    ev = t.take_events()
    kinds = [e[0] for e in ev]
    assert kinds == ["stored", "stored", "removed", "removed"]
    stored = ev[0]
    # SGLang's native hash of [1, 2 | 3, 4]: 34fb5c82… and c57b445f… (first 8 bytes, signed).
    assert stored[3] is None and stored[4] == [0x34FB5C825DE7CA4A, 0xC57B445F90651B9A - (1 << 64)]
    assert stored[5] == [1, 2, 3, 4] and stored[6] == 2
    salted = ev[1]
    assert salted[2] == "s" and salted[4][0] != stored[4][0]
    assert t.take_events() == []


def test_bad_input_is_an_exception_naming_it_and_the_tree_stays_sound():
    t = tree(page_size=2)
    with pytest.raises(errors.InvalidArgument, match="value: 1 values for a key of 2 tokens"):
        t.insert_key(key([1, 2]), [1], 0, 0)
    with pytest.raises(ValueError, match=r"key.token_ids\[0\] = -1"):
        t.insert_key(key([-1, 2]), [1, 2], 0, 0)
    with pytest.raises(ValueError, match=r"value\[1\] = 4294967296"):
        t.insert_key(key([1, 2]), [1, 1 << 32], 0, 0)
    with pytest.raises(errors.InvalidArgument, match="bigram"):
        t.match_key(key([1, 2], is_bigram=True))
    with pytest.raises(TypeError, match="key.token_ids"):
        t.match_key(SimpleNamespace(token_ids="ab", extra_key=None, cache_salt=None, limit=None, is_bigram=False))
    with pytest.raises(AttributeError):
        t.match_key(object())
    t.insert_key(key([1, 2]), [1, 2], 0, 0)
    _, node = t.match_key(key([1, 2]))
    with pytest.raises(errors.InvalidArgument, match="holds no lock"):
        t.dec_lock_ref(node)
    other = tree(page_size=2)
    with pytest.raises(errors.ForeignObject):
        other.inc_lock_ref(node)
    with pytest.raises(errors.InvalidArgument, match="whole pages"):
        t.checkpoint([1, 2, 3], [1, 2, 3], 3, None, None, 0, 0, 3)
    with pytest.raises(errors.InvalidArgument, match="page size 0"):
        tree(page_size=0)
    with pytest.raises(errors.InvalidArgument, match="unknown eviction policy"):
        tree(eviction_policy="nope")
    with pytest.raises(errors.InvalidArgument, match="does not rank by it"):
        tree(eviction_policy="tlru")
    t.audit()
    other.audit()


def test_checkpoint_splits_at_the_prompt_and_returns_the_path():
    t = tree(page_size=2)
    prefix, node, path, delta = t.checkpoint([1, 2, 3, 4, 5, 6, 7], [10, 11, 12, 13, 14, 15], 6, None, None, 0, 0, 4)
    assert prefix == 0 and path.tolist() == [10, 11, 12, 13, 14, 15]
    # The end node comes back locked (the caller releases its old lock).
    assert delta == -6 and node.lock_ref == 1 and t.protected_size() == 6
    assert t.dec_lock_ref(node) == 6
    # The prompt [1 2 3 4] ends a node of its own.
    assert [length for _, length, _ in t.outline()] == [4, 2]
    assert t.match_key(key([1, 2, 3, 4]))[1] != node
    t.audit()


def test_a_lock_held_below_a_node_is_not_released_from_it():
    # Request A locks [1 2 3 4]; nobody locked [1 2] itself, so a release
    # of [1 2] is refused (SGLang's own RadixCache would unprotect A's path).
    t = tree()
    t.insert_key(key([1, 2, 3, 4]), [1, 2, 3, 4], 0, 0)
    t.insert_key(key([1, 2, 9]), [1, 2, 9], 0, 0)
    _, a = t.match_key(key([1, 2, 3, 4]))
    _, upper = t.match_key(key([1, 2]))
    assert t.inc_lock_ref(a) == -4
    assert upper.lock_ref == 1
    with pytest.raises(errors.InvalidArgument, match="holds no lock"):
        t.dec_lock_ref(upper)
    assert (t.evictable_size(), t.protected_size()) == (1, 4)
    assert t.evict(100)[0] == 1, "only the unlocked leaf goes"
    # Two holders of one node: one release leaves the other's lock.
    assert t.inc_lock_ref(a) == 0
    assert t.dec_lock_ref(a) == 0
    assert (t.evictable_size(), t.protected_size(), a.lock_ref) == (0, 4, 1)
    assert t.dec_lock_ref(a) == 4
    t.audit()


def test_locks_pins_and_sizes_stay_together_under_threads():
    # Four Python threads insert, match, lock, release and evict on one
    # tree at once (walks release the GIL, so their calls interleave inside
    # Rust); every value is adopted once and handed back once, the sizes
    # never wrap, and the audit (lock counts against the core's pins and a
    # scan of the tree) holds at the end.
    import random
    import threading

    t = tree(page_size=2, eviction_policy="lru")
    adopted, evicted, errors_seen = [], [], []
    lock = threading.Lock()
    next_value = iter(range(1, 1 << 30))

    def values(n):
        with lock:
            return [next(next_value) for _ in range(n)]

    def worker(seed):
        rng = random.Random(seed)
        held = []
        try:
            for _ in range(1500):
                x = rng.random()
                tokens = [rng.randint(1, 3) for _ in range(2 * rng.randint(1, 5))]
                if x < 0.35:
                    v = values(len(tokens))
                    cached = t.insert_key(key(tokens), v, rng.randint(0, 2), 0)
                    with lock:
                        adopted.extend(v[cached:])
                elif x < 0.6:
                    n, node = t.match_key(key(tokens))
                    try:
                        t.inc_lock_ref(node)
                        held.append(node)
                    except errors.StaleHandle:
                        pass  # evicted by another thread since the match
                elif x < 0.8 and held:
                    t.dec_lock_ref(held.pop(rng.randrange(len(held))))
                elif x < 0.95:
                    n, v, ends = t.evict(rng.randint(0, 6))
                    assert n == len(v) and (not ends or ends[-1] == n)
                    with lock:
                        evicted.extend(v.tolist())
                else:
                    e, p = t.evictable_size(), t.protected_size()
                    assert 0 <= e < 1 << 40 and 0 <= p < 1 << 40, (e, p)
            for node in held:
                t.dec_lock_ref(node)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors_seen.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors_seen, errors_seen
    assert t.protected_size() == 0
    t.audit()
    n, v, _ = t.evict(1 << 30)
    evicted.extend(v.tolist())
    assert (t.evictable_size(), t.node_count()) == (0, 0)
    assert sorted(evicted) == sorted(adopted), "a value lost or handed back twice"
    t.audit()
