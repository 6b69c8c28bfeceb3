"""radixkv: a concurrent radix-tree prefix (KV) cache for multi-GPU LLM
serving, from Python.

Two kinds of cache, as in the Rust core:

* :class:`RadixCache`: values (KV slot indices) come from the caller's own
  allocator: ``insert(tokens, values)``; eviction returns them.
* :class:`PagedCache`: the cache owns a page allocator per tier: page
  spans, requests (``begin`` / ``reserve`` / ``commit_chunk`` /
  ``finish``), copies between tiers, write-back, a background evictor.

Tiers are device indices ``0, 1, …`` and ``"host"`` (the host tier, with
``host_pages``). Token ids and values come from ``array('q')``, numpy
arrays, torch tensors or lists; results are ``numpy.uint32`` arrays.
A call that walks the tree with a key of at least
:func:`gil_release_tokens` tokens releases the GIL while it walks
(evictions, audits and copies always do). Errors are
:mod:`radixkv.errors` exceptions with the core's message.

:class:`DpRouter` is a data-parallel dispatcher's view of its ranks'
caches, fed by their KV-event batches, and the rank each request should
go to.

:mod:`radixkv.sglang` is SGLang 0.5.23's ``--radix-cache-backend radixkv``
(loaded by SGLang through the package's entry point); :class:`SglangTree`
is the tree under it.
"""

from __future__ import annotations

from . import errors
from ._radixkv import (
    HOST,
    MAX_DEVICES,
    MAX_PAGE_SIZE,
    CopyView,
    DpRouter,
    Evicted,
    Evictor,
    InsertResult,
    Lease,
    MatchResult,
    NodeHandle,
    PagedCache,
    PageSpan,
    PrefixCopy,
    RadixCache,
    Request,
    SglangNode,
    SglangTree,
    Sizes,
    gil_release_tokens,
    namespace_for,
    reads_without_copy,
    set_gil_release_tokens,
)
from .errors import CacheError

__all__ = [
    "HOST",
    "MAX_DEVICES",
    "MAX_PAGE_SIZE",
    "CacheError",
    "CopyView",
    "DpRouter",
    "Evicted",
    "Evictor",
    "InsertResult",
    "Lease",
    "MatchResult",
    "NodeHandle",
    "PagedCache",
    "PageSpan",
    "PrefixCopy",
    "RadixCache",
    "Request",
    "SglangNode",
    "SglangTree",
    "Sizes",
    "errors",
    "gil_release_tokens",
    "namespace_for",
    "reads_without_copy",
    "set_gil_release_tokens",
]

__version__ = "0.1.0"
