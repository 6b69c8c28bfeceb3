"""radixkv as SGLang 0.5.23's prefix cache: ``--radix-cache-backend radixkv``.

SGLang loads the package's entry point (group ``sglang.srt.plugins``, see
:mod:`radixkv.sglang_plugin`) in every process and the scheduler builds the
cache through its registry; this module is imported only then. It needs
``sglang`` and ``torch``.

:class:`RadixKVCache` keeps the contract of SGLang's own ``RadixCache``
(``sglang.srt.mem_cache.radix_cache``) for full-attention models, on
radixkv's tree: the same prefix lengths, the same slots freed in the same
calls and order, the same sizes, the same KV events (``BlockStored`` /
``BlockRemoved`` / ``AllBlocksCleared`` with SGLang's block-hash chain), the
same waiting-queue order under ``dfs-weight``. The tree is configured as
0.5.23 behaves: hits counted on insert past a request's ``inserted_len``,
slru protecting at its ``protected_threshold``, and a logical clock (every
operation a strictly later tick, so eviction order never depends on ties).

What it refuses, at construction, with the configuration named and
SGLang's built-in fallback said: hybrid models (sliding-window or Mamba
layers), EAGLE's bigram keys, HiCache, LMCache, FlexKV, the external cache
linker, HiSparse, session radix caches and streaming sessions,
prefill/decode disaggregation, allocators other than SGLang's token and
paged ones, and the ``tlru`` eviction policy.

Token ids and slot indices are unsigned 32-bit in radixkv: a slot index
crosses to the tree as one copy through host memory, and the path's
indices come back as an int64 tensor moved to the allocator's device.

What it holds to whatever order SGLang calls it in: a checkpoint never
lowers what the tree protects for a request (an ``up_to`` below the
request's ``cache_protected_len`` is refused with a ``ValueError``, before
anything changes: SGLang's own ``RadixCache`` would hand tree-owned slots
back to the request); no call raises after it changed the tree without its
KV events recorded; once the tree's mirror is inconsistent every call
raises :class:`radixkv.errors.CacheError` naming the first inconsistency
(never a wrong size; :meth:`RadixKVCache.reset` starts afresh); a lock
taken before a :meth:`RadixKVCache.reset` ended with it (releasing it
changes nothing). A Rust panic surfaces as a ``RuntimeError``, which
SGLang's ``except Exception`` catches.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence

import torch
from sglang.srt.disaggregation.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    StorageMedium,
    kv_event_namespace_seed,
    namespaced_block_hash,
)
from sglang.srt.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    DecLockRefParams,
    DecLockRefResult,
    EvictParams,
    EvictResult,
    IncLockRefResult,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
    TreeLock,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.events import KvEventLoraNames
from sglang.srt.mem_cache.utils import get_eviction_strategy

from radixkv._radixkv import SglangNode, SglangTree
from radixkv.errors import InvalidArgument, StaleHandle

__all__ = ["RadixKVCache", "UnsupportedConfiguration", "factory", "BACKEND_NAME"]

#: The name SGLang selects this backend by (``--radix-cache-backend``).
BACKEND_NAME = "radixkv"

_INT64_MAX = (1 << 63) - 1
_FALLBACK = "leave --radix-cache-backend unset to use SGLang's built-in cache (UnifiedRadixCache)"


class UnsupportedConfiguration(ValueError):
    """The server's configuration needs something radixkv's backend does not
    do (a hybrid model, EAGLE, HiCache, …): the message names it and
    SGLang's built-in fallback."""


def _match_result_tail() -> Optional[tuple]:
    """The default values of ``MatchResult``'s fields after its four node
    fields, in order; ``None`` if a later field has no default (another
    SGLang), which :meth:`RadixKVCache.match_prefix` then builds through the
    class itself."""
    fields = MatchResult._fields
    if fields[:4] != ("device_prefix_len", "last_device_node", "last_host_node", "best_match_node"):
        return None
    defaults = MatchResult._field_defaults
    if any(f not in defaults for f in fields[4:]):
        return None
    return tuple(defaults[f] for f in fields[4:])


#: See :func:`_match_result_tail`. A match builds its ``MatchResult`` as the
#: named tuple's own ``__new__`` does (``tuple.__new__`` of the class and
#: every field's value) but without binding 14 arguments, most of them
#: defaults, by keyword: 0.2-0.3 us of a 2.7 us match, measured.
_MATCH_TAIL = _match_result_tail()
_tuple_new = tuple.__new__


def _refuse(what: str) -> UnsupportedConfiguration:
    return UnsupportedConfiguration(f"--radix-cache-backend {BACKEND_NAME} does not support {what}; {_FALLBACK}")


class RadixKVCache(BasePrefixCache):
    """SGLang's ``BasePrefixCache`` for full-attention models on radixkv's tree.

    Built from SGLang's ``CacheInitParams`` (as ``RadixCache(params)`` is);
    the scheduler reaches it through :func:`factory`. Node handles are
    :class:`radixkv._radixkv.SglangNode` objects: opaque, hashable, valid
    across splits (a handle keeps naming the same end position), refused
    once their node left the tree or after :meth:`reset`.
    """

    def __init__(self, params: CacheInitParams):
        self.disable = params.disable
        self.req_to_token_pool = params.req_to_token_pool
        self.token_to_kv_pool_allocator = params.token_to_kv_pool_allocator
        self.page_size = params.page_size
        self.is_eagle = params.is_eagle
        self.eviction_policy = params.eviction_policy.lower()
        if params.is_eagle and not self.disable:
            raise _refuse("EAGLE speculative decoding (its keys are token bigrams)")
        if params.sliding_window_size is not None:
            raise _refuse("sliding-window attention layers")
        if self.eviction_policy == "tlru" and not self.disable:
            raise _refuse("--radix-eviction-policy tlru (SGLang allows it only for UnifiedRadixCache)")
        # SGLang's own validation of the policy and its config (the same
        # ValueError for an unknown policy, TypeError for an unknown kwarg).
        strategy = get_eviction_strategy(
            "lru" if self.disable else self.eviction_policy,
            None if self.disable else params.eviction_policy_config,
        )
        self._slru_threshold: Optional[int] = (
            int(strategy.protected_threshold) if self.eviction_policy == "slru" else None
        )
        self._events_on = bool(params.enable_kv_cache_events) and not self.disable
        self._dynamo_format = bool(params.dynamo_kv_event_format)
        # None (RadixCache.create_simulated's default) is an empty table,
        # as SGLang's own event recorder takes it.
        names = params.kv_event_lora_names
        self._lora_names = names if names is not None else KvEventLoraNames()
        self._queue: list = []
        # The trees a reset replaced (by id): a lock on one of their nodes
        # ended with it.
        self._retired: set[int] = set()
        if params.enable_metrics:
            self.init_metrics_collector()
        allocator = self.token_to_kv_pool_allocator
        dev = getattr(allocator, "device", None) if allocator is not None else None
        self.device = torch.device(dev) if isinstance(dev, (str, torch.device)) else torch.device("cpu")
        self.reset()

    # -- construction and state ------------------------------------------------

    def reset(self) -> None:
        """An empty tree (handles of the old one are refused from now on,
        but for releasing a lock, which ended with the old tree); frees no
        slot (SGLang's scheduler clears the pools itself). Records
        ``AllBlocksCleared``."""
        old = getattr(self, "_tree", None)
        if old is not None:
            self._retired.add(old.id)
        self._tree = SglangTree(
            page_size=self.page_size,
            eviction_policy="lru" if self.disable else self.eviction_policy,
            slru_protected_threshold=self._slru_threshold,
            events=self._events_on,
        )
        self.root_node: SglangNode = self._tree.root
        self._empty_device_indices = torch.empty((0,), dtype=torch.int64, device=self.device)
        self._empty_match_result = MatchResult(
            device_prefix_len=0,
            last_device_node=self.root_node,
            last_host_node=self.root_node,
            best_match_node=self.root_node,
        )
        if self._events_on:
            self._enqueue(AllBlocksCleared())

    def supports_prefix_sharing(self) -> bool:
        return not self.disable

    # -- matching and inserting ------------------------------------------------

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        """The longest cached prefix of ``params.key`` (page-aligned, up to
        its ``limit``); splits a node where the match ends inside it."""
        if self.disable:
            return self._empty_match_result
        n, node = self._tree.match_key(params.key)
        if n == 0:
            return self._empty_match_result
        if _MATCH_TAIL is None:
            return MatchResult(n, node, node, node)
        return _tuple_new(MatchResult, (n, node, node, node) + _MATCH_TAIL)

    def touch_prefix(self, key: Any) -> None:
        """Refreshes the recency of ``key``'s cached path (a match whose
        result is dropped)."""
        if not self.disable:
            self._tree.match_key(key)

    def insert(self, params: InsertParams) -> InsertResult:
        """Caches ``params.key`` with ``params.value`` (the first
        ``len(key)`` values); returns how many leading tokens were cached
        before (their values stay the caller's). Frees nothing."""
        if self.disable:
            return InsertResult(prefix_len=0)
        key = params.key
        value = params.value
        if value is None:
            # SGLang's debug fallback: the token ids as values.
            value = key.token_ids
        prefix_len = self._tree.insert_key(key, value, params.priority or 0, params.inserted_len or 0)
        if self._events_on:
            self._drain()
        return InsertResult(prefix_len=prefix_len)

    def checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
        """Caches the request's KV up to row position ``up_to`` (page-aligned),
        points its row at the tree's slots, frees its duplicates and moves its
        lock to the new end node (SGLang's ``RadixCache.checkpoint``).

        Refused with :class:`radixkv.errors.InvalidArgument` (a
        ``ValueError``), before anything changes: an ``up_to`` below the
        request's ``cache_protected_len`` (the tree already owns those
        slots; SGLang's scheduler never asks it), and one past the slots the
        request holds (``kv_allocated_len``).
        """
        if self.disable:
            return
        kv = req.kv
        if kv.swa_evict_floor > 0:
            raise _refuse("sliding-window eviction floors (a hybrid SWA request)")
        ids = req.full_untruncated_fill_ids
        key_len = min(len(ids), up_to) // self.page_size * self.page_size
        cpl = kv.cache_protected_len
        if key_len < cpl:
            raise InvalidArgument(
                f"checkpoint(up_to={up_to}) of request {req.rid!r}: the key's {key_len} tokens "
                f"(whole pages of at most {len(ids)} ids) are below its cache_protected_len={cpl}; "
                "a checkpoint never lowers what the tree protects"
            )
        if key_len > kv.kv_allocated_len:
            raise InvalidArgument(
                f"checkpoint(up_to={up_to}) of request {req.rid!r}: the key's {key_len} tokens "
                f"pass the {kv.kv_allocated_len} positions it holds KV slots for (kv_allocated_len)"
            )
        allocator = self._allocator("checkpoint")
        row = self.req_to_token_pool.req_to_token[kv.req_pool_idx]
        priority = req.priority or 0
        # The tree's part, in one call, ends with the new end node locked:
        # no other thread's eviction can take it before the lock.
        prefix_len, node, path, delta = self._tree.checkpoint(
            ids,
            row[:key_len],
            key_len,
            req.extra_key,
            req.cache_salt,
            priority,
            kv.cache_inserted_len,
            len(req.origin_input_ids),
        )
        # The tree changed: its events first, and the new lock recorded on
        # the request, so that nothing below can lose either.
        if self._events_on:
            self._drain()
        old_lock = req.lock
        req.lock = TreeLock(node, IncLockRefResult(delta=delta).to_dec_params())
        req.last_node = node
        kv.cache_inserted_len = max(kv.cache_inserted_len, key_len)
        try:
            allocator.free_segment(row[cpl:prefix_len], start_pos=cpl)
            new_indices = self._on_device(path)
            self.req_to_token_pool.write((kv.req_pool_idx, slice(cpl, len(new_indices))), new_indices[cpl:])
            kv.cache_protected_len = len(new_indices)
        finally:
            self.unlock(old_lock)

    # -- eviction ----------------------------------------------------------------

    def evict(self, params: EvictParams) -> EvictResult:
        """Evicts unlocked leaves in policy order until ``params.num_tokens``
        are freed (whole nodes, so possibly more), each node's slots freed to
        the allocator in its own call, in eviction order."""
        if self.disable:
            return EvictResult()
        start = time.perf_counter()
        free_segment = self._allocator("evict").free_segment
        tokens, values, ends = self._tree.evict(max(params.num_tokens, 0))
        if tokens:
            if self._events_on:
                self._drain()
            slots = self._on_device(values)
            begin = 0
            for end in ends:
                free_segment(slots[begin:end], start_pos=0)
                begin = end
        self.update_eviction_metrics(tokens, start)
        return EvictResult(num_tokens_evicted=tokens)

    # -- locks -------------------------------------------------------------------

    def inc_lock_ref(self, node: Any) -> IncLockRefResult:
        """Locks ``node``'s path against eviction (locks nest); ``delta`` is
        the change of the evictable size (≤ 0)."""
        if self.disable:
            return IncLockRefResult(delta=0)
        if getattr(node, "tree_id", None) in self._retired:
            raise StaleHandle(f"{node!r} belongs to a tree that reset() replaced")
        return IncLockRefResult(delta=self._tree.inc_lock_ref(node))

    def dec_lock_ref(self, node: Any, params: Optional[DecLockRefParams] = None) -> DecLockRefResult:
        """Releases one lock of ``node``; ``delta`` (≥ 0) is the change of the
        evictable size. A lock taken before :meth:`reset` ended with the old
        tree: releasing it changes nothing (``delta`` 0)."""
        if self.disable:
            return DecLockRefResult(delta=0)
        if getattr(node, "tree_id", None) in self._retired:
            return DecLockRefResult(delta=0)
        return DecLockRefResult(delta=self._tree.dec_lock_ref(node))

    # -- reading -------------------------------------------------------------------

    def path_device_indices(self, node: Any) -> torch.Tensor:
        """The slots of the path from the root to ``node``: a contiguous int64
        tensor on the allocator's device."""
        if self.disable:
            return self._empty_device_indices
        # The root too: the tree answers it (empty), or raises once broken.
        return self._on_device(self._tree.path_values(node))

    def evictable_size(self) -> int:
        return self._tree.evictable_size()

    def protected_size(self) -> int:
        return self._tree.protected_size()

    def total_size(self) -> int:
        return self._tree.evictable_size() + self._tree.protected_size()

    def node_count(self) -> int:
        """Nodes in the tree, the root not counted (radixkv's addition)."""
        return self._tree.node_count()

    def dfs_weight_order(self, node_handles: Sequence[Any]) -> list[int]:
        """SGLang's dfs-weight order of a waiting queue (heavier subtrees
        first, ties in the order children joined their parent, a node's own
        requests after its subtrees, unmatched requests last)."""
        return self._tree.dfs_weight_order(list(node_handles))

    def sanity_check(self) -> None:
        """Checks the tree's invariants and that the sizes SGLang reads
        agree with a count of the tree; raises ``radixkv.errors.CacheError``
        naming the first violation."""
        self._tree.audit()

    def pretty_print(self) -> None:
        for depth, length, lock_ref in self._tree.outline():
            print(" " * depth, length, f"r={lock_ref}")
        print(f"#tokens: {self.total_size()}")

    # -- events ----------------------------------------------------------------------

    def take_events(self) -> list:
        """The KV events since the last call (SGLang's ``BlockStored`` /
        ``BlockRemoved`` / ``AllBlocksCleared``, coalesced as SGLang's
        recorder does); empty unless built with events on."""
        events, self._queue = self._queue, []
        return events

    def _drain(self) -> None:
        """Turns the tree's raw events into SGLang's, with the LoRA name
        table as it is now (SGLang evaluates it when it records)."""
        for e in self._tree.take_events():
            if e[0] == "stored":
                _, extra_key, cache_salt, parent, hashes, tokens, block_size = e
                seed = self._seed(extra_key, cache_salt)
                names = self._lora_names
                self._enqueue(
                    BlockStored(
                        block_hashes=[namespaced_block_hash(h, namespace_seed=seed) for h in hashes],
                        parent_block_hash=(
                            None if parent is None else namespaced_block_hash(parent, namespace_seed=seed)
                        ),
                        token_ids=tokens,
                        block_size=block_size,
                        lora_id=None,
                        medium=StorageMedium.GPU,
                        cache_salt=cache_salt,
                        session_id=None,
                        lora_name=names.resolve(extra_key) if self._dynamo_format else names.get(extra_key),
                    )
                )
            else:
                _, extra_key, cache_salt, hashes = e
                seed = self._seed(extra_key, cache_salt)
                self._enqueue(
                    BlockRemoved(
                        block_hashes=[namespaced_block_hash(h, namespace_seed=seed) for h in hashes],
                        medium=StorageMedium.GPU,
                    )
                )

    def _seed(self, extra_key: Optional[str], cache_salt: Optional[str]) -> Optional[bytes]:
        if self._dynamo_format:
            return kv_event_namespace_seed(extra_key=extra_key, cache_salt=cache_salt)
        named = extra_key if self._lora_names.get(extra_key) is not None else None
        return kv_event_namespace_seed(extra_key=named, cache_salt=None)

    def _enqueue(self, event: Any) -> None:
        """Appends ``event``, merged into the queue's tail when SGLang's
        recorder would merge them (removals of one medium; stores that
        continue the tail's chain with equal attributes)."""
        if self._queue:
            tail = self._queue[-1]
            if isinstance(tail, BlockRemoved) and isinstance(event, BlockRemoved):
                if tail.medium == event.medium:
                    tail.block_hashes.extend(event.block_hashes)
                    return
            elif isinstance(tail, BlockStored) and isinstance(event, BlockStored):
                if (
                    tail.block_hashes
                    and event.parent_block_hash == tail.block_hashes[-1]
                    and (tail.medium, tail.lora_id, tail.block_size, tail.cache_salt, tail.session_id, tail.lora_name)
                    == (
                        event.medium,
                        event.lora_id,
                        event.block_size,
                        event.cache_salt,
                        event.session_id,
                        event.lora_name,
                    )
                ):
                    tail.block_hashes.extend(event.block_hashes)
                    tail.token_ids.extend(event.token_ids)
                    return
        self._queue.append(event)

    # -- helpers ------------------------------------------------------------------------

    def _allocator(self, call: str) -> Any:
        """The KV allocator, which ``call`` frees slots to (checked before
        the tree changes: ``RadixCache.create_simulated`` builds a cache
        without one)."""
        allocator = self.token_to_kv_pool_allocator
        if allocator is None:
            raise InvalidArgument(
                f"{call}: this cache has no token_to_kv_pool_allocator to free slots to "
                "(built without one, as RadixCache.create_simulated does without mock_allocator)"
            )
        return allocator

    def _on_device(self, values: Any) -> torch.Tensor:
        """An int64 numpy array of slots as a tensor on the allocator's device."""
        t = torch.from_numpy(values)
        return t if self.device.type == "cpu" else t.to(self.device, non_blocking=False)


def _settings() -> dict:
    """The server settings that decide a refusal, from SGLang's runtime
    context (its resolved configuration, where ``--enable-lmcache`` and the
    rest live)."""
    from sglang.srt.runtime_context import get_disagg, get_memory, get_serving

    memory, serving, disagg = get_memory(), get_serving(), get_disagg()
    return {
        "--enable-hierarchical-cache (HiCache)": memory.enable_hierarchical_cache,
        "--enable-lmcache": memory.enable_lmcache,
        "--enable-flexkv": memory.enable_flexkv,
        "--enable-unified-cache-external-linker": memory.enable_unified_cache_external_linker,
        "--enable-hisparse": memory.enable_hisparse,
        "--enable-session-radix-cache": memory.enable_session_radix_cache,
        "--enable-streaming-session": serving.enable_streaming_session,
        "--disaggregation-decode-retraction-backup host_pool": (
            disagg.disaggregation_decode_retraction_backup == "host_pool"
        ),
        f"--disaggregation-mode {disagg.disaggregation_mode} (prefill/decode disaggregation)": (
            disagg.disaggregation_mode not in (None, "null")
        ),
    }


def factory(ctx: Any) -> RadixKVCache:
    """SGLang's radix-cache factory for ``--radix-cache-backend radixkv``
    (``ctx`` is its ``TreeCacheBuildContext``): refuses what the backend
    does not support, with the configuration named, then builds
    :class:`RadixKVCache` from ``ctx.params``."""
    params = ctx.params
    if ctx.is_hybrid_swa or params.sliding_window_size is not None:
        raise _refuse("hybrid models with sliding-window attention layers")
    if ctx.is_hybrid_ssm:
        raise _refuse("hybrid models with Mamba or linear-attention layers")
    if params.is_eagle:
        raise _refuse("EAGLE speculative decoding (its keys are token bigrams)")
    if ctx.enable_hierarchical_cache:
        raise _refuse("--enable-hierarchical-cache (HiCache)")
    for what, on in _settings().items():
        if on:
            raise _refuse(what)
    if hasattr(params.req_to_token_pool, "req_to_c128_sidecar"):
        raise _refuse("the C128 sidecar pool (DeepSeek-V4 on NPU)")
    _check_allocator(params.token_to_kv_pool_allocator)
    return RadixKVCache(params)


def _check_allocator(allocator: Any) -> None:
    """Only SGLang's plain token and paged allocators (and the NPU paged
    one): the others carry state (SWA, page interleaving, Mamba) this
    backend does not keep."""
    if allocator is None:
        return
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

    allowed: tuple = (TokenToKVPoolAllocator, PagedTokenToKVPoolAllocator)
    name = type(allocator).__name__
    if type(allocator) in allowed or name == "NPUPagedTokenToKVPoolAllocator":
        return
    raise _refuse(f"the KV allocator {name}")


#: The factory SGLang's registry calls (also reachable as ``factory``).
radix_cache_factory: Callable[[Any], RadixKVCache] = factory
