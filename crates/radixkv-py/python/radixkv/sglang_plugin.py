"""SGLang's plug-in hook for radixkv (entry point group
``sglang.srt.plugins``, name ``radixkv``).

SGLang calls :func:`register` with no arguments in each of its processes
(``sglang.srt.plugins.load_plugins``). It registers the factory of
``--radix-cache-backend radixkv`` and imports nothing heavy: the backend
(:mod:`radixkv.sglang`) is imported when the scheduler builds its cache.
``SGLANG_PLUGINS=radixkv`` restricts SGLang to this plug-in. With
``RADIXKV_DP_DISPATCH=1`` it also installs the cache-aware data-parallel
dispatch on SGLang's ``DataParallelController`` (:mod:`radixkv.sglang_dp`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def _factory(ctx: Any) -> Any:
    from radixkv.sglang import factory

    return factory(ctx)


def register() -> None:
    """Registers ``radixkv`` with SGLang's radix-cache registry (once: a
    second call, or a backend of that name already there, changes
    nothing), and, with ``RADIXKV_DP_DISPATCH=1``, the cache-aware
    data-parallel dispatch (:mod:`radixkv.sglang_dp`)."""
    from radixkv import sglang_dp

    sglang_dp.install()
    from sglang.srt.mem_cache.registry import (
        get_radix_cache_factory,
        register_radix_cache_backend,
    )

    if get_radix_cache_factory("radixkv") is not None:
        return
    register_radix_cache_backend("radixkv", _factory)
