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
        tree(eviction_policy="tlru")
    t.audit()
    other.audit()


def test_checkpoint_splits_at_the_prompt_and_returns_the_path():
    t = tree(page_size=2)
    prefix, node, path = t.checkpoint([1, 2, 3, 4, 5, 6, 7], [10, 11, 12, 13, 14, 15], 6, None, None, 0, 0, 4)
    assert prefix == 0 and path.tolist() == [10, 11, 12, 13, 14, 15]
    # The prompt [1 2 3 4] ends a node of its own.
    assert [length for _, length, _ in t.outline()] == [4, 2]
    assert t.match_key(key([1, 2, 3, 4]))[1] != node
    t.audit()
