"""SGLang builds radixkv's backend through its own path: the installed
package's entry point (group `sglang.srt.plugins`) found and run by
`sglang.srt.plugins.load_plugins()`, then `create_tree_cache` on a real
`TreeCacheBuildContext` with `--radix-cache-backend radixkv` in the
server arguments. Checks also that each configuration the backend does
not support is refused at construction with an error naming it and the
fallback, that SGLang's own policy validation applies (an unknown policy,
an unknown policy option), and that a cache built this way serves a
request. Exits 1 on the first failure.
"""

from __future__ import annotations

import sys
import warnings
from array import array
from importlib.metadata import entry_points

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams, MatchResult  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.registry import (  # noqa: E402
    TreeCacheBuildContext,
    create_tree_cache,
    registered_radix_cache_backends,
)
from sglang.srt.plugins import load_plugins  # noqa: E402
from sglang.srt.runtime_context import get_context  # noqa: E402

failures: list[str] = []


def expect(cond: bool, what: str) -> None:
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def context(server_args, **over):
    pool = ReqToTokenPool(size=4, max_context_len=64, device="cpu", enable_memory_saver=False)
    alloc = TokenToKVPoolAllocator(size=128, dtype=torch.float16, device="cpu", kvcache=None, need_sort=False)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=alloc,
        page_size=1,
        eviction_policy=over.pop("policy", server_args.radix_eviction_policy),
        eviction_policy_config=over.pop("policy_config", None),
        is_eagle=over.pop("is_eagle", False),
    )
    fields = dict(
        server_args=server_args,
        params=params,
        is_hybrid_swa=False,
        is_hybrid_ssm=False,
        enable_hierarchical_cache=False,
        disable_radix_cache=False,
        tp_worker=None,
        model_config=None,
        tp_size=1,
        tp_rank=0,
        tp_group=None,
    )
    fields.update(over)
    return TreeCacheBuildContext(**fields)


def refused(server_args, what: str, needle: str, **over) -> None:
    try:
        create_tree_cache(context(server_args, **over))
    except Exception as e:  # noqa: BLE001 - the check is on the message
        msg = str(e)
        expect(needle in msg and "radix-cache-backend" in msg, f"{what}: refused ({type(e).__name__}: {msg})")
        return
    expect(False, f"{what}: refused (it was built)")


def simulated(server_args) -> None:
    """Built as `RadixCache.create_simulated` builds SGLang's (no pools,
    events on, the LoRA name table left None): its events equal SGLang's,
    and a call that needs the missing allocator is refused before the tree
    changes."""
    import msgspec
    from radixkv.errors import InvalidArgument
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams
    from sglang.srt.mem_cache.radix_cache import RadixCache

    params = CacheInitParams(
        disable=False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=None,
        page_size=1,
        enable_kv_cache_events=True,
        kv_event_lora_names=None,
    )
    ctx = context(server_args)
    ctx.params = params
    ours = create_tree_cache(ctx)
    theirs = RadixCache.create_simulated(enable_kv_cache_events=True)
    got = []
    for c in (theirs, ours):
        c.take_events()
        c.insert(InsertParams(key=RadixKey(array("q", [1, 2, 3]), "k"), value=torch.arange(3)))
        c.insert(InsertParams(key=RadixKey(array("q", [1, 2, 4]), "k"), value=torch.arange(3), priority=None))
        got.append(msgspec.msgpack.encode(c.take_events()))
    expect(
        got[0] == got[1] and b"BlockStored" in got[1],
        "lora names left None (create_simulated): insert records BlockStored, as SGLang's does",
    )
    before = (ours.total_size(), ours.node_count())
    try:
        ours.evict(EvictParams(num_tokens=10))
        expect(False, "evict without an allocator is refused")
    except InvalidArgument as e:
        expect(
            "token_to_kv_pool_allocator" in str(e) and (ours.total_size(), ours.node_count()) == before,
            f"evict without an allocator: refused before the tree changed ({e})",
        )


def main() -> int:
    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "radixkv"]
    expect(len(eps) == 1 and eps[0].value == "radixkv.sglang_plugin:register", f"entry point installed: {eps}")
    load_plugins()
    expect(
        "radixkv" in registered_radix_cache_backends(),
        f"registered after load_plugins(): {registered_radix_cache_backends()}",
    )
    load_plugins()  # idempotent

    with get_context().override_server_args(radix_cache_backend="radixkv") as sa:
        cache = create_tree_cache(context(sa))
        from radixkv.sglang import RadixKVCache, UnsupportedConfiguration

        expect(type(cache) is RadixKVCache, f"create_tree_cache built {type(cache).__name__}")
        v = torch.arange(10, 14, dtype=torch.int64)
        r = cache.insert(InsertParams(key=RadixKey(array("q", [1, 2, 3, 4])), value=v))
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 3, 9]))))
        path = cache.path_device_indices(m.last_device_node)
        expect(
            r.prefix_len == 0
            and m.device_prefix_len == 3
            and path.tolist() == [10, 11, 12]
            and path.dtype == torch.int64,
            f"it serves: insert {r.prefix_len}, match {m.device_prefix_len}, path {path.tolist()} ({path.dtype})",
        )
        # The backend builds its MatchResult without the class's keyword
        # binding: the same type and every field as SGLang's constructor.
        node = m.last_device_node
        want = MatchResult(m.device_prefix_len, node, node, node)
        expect(
            type(m) is MatchResult and m == want and m._asdict() == want._asdict(),
            f"the match is SGLang's MatchResult with its defaults: {m!r}",
        )
        expect(
            getattr(cache, "disable", True) is False and cache.supports_prefix_sharing(),
            "the scheduler sees a cache-aware tree (disable is False)",
        )
        refused(sa, "hybrid sliding-window model", "sliding-window", is_hybrid_swa=True)
        refused(sa, "hybrid Mamba model", "Mamba", is_hybrid_ssm=True)
        refused(sa, "HiCache", "hierarchical", enable_hierarchical_cache=True)
        refused(sa, "EAGLE", "EAGLE", is_eagle=True)
        refused(sa, "tlru", "tlru", policy="tlru")
        try:
            create_tree_cache(context(sa, policy="nope"))
            expect(False, "an unknown policy is refused")
        except ValueError as e:
            expect("Unknown eviction policy" in str(e), f"an unknown policy: SGLang's ValueError ({e})")
        try:
            create_tree_cache(context(sa, policy="lru", policy_config={"protected_threshold": 2}))
            expect(False, "an lru option is refused")
        except TypeError as e:
            expect(True, f"an option lru does not take: SGLang's TypeError ({e})")
        slru = create_tree_cache(context(sa, policy="slru", policy_config={"protected_threshold": 3}))
        expect(slru._slru_threshold == 3, "slru's protected_threshold reaches the tree")
        expect(issubclass(UnsupportedConfiguration, ValueError), "refusals are ValueErrors")
        simulated(sa)

    for flag, value in (
        ("enable_lmcache", True),
        ("enable_flexkv", True),
        ("enable_hisparse", True),
        ("enable_streaming_session", True),
        ("disaggregation_decode_retraction_backup", "host_pool"),
        ("disaggregation_mode", "prefill"),
    ):
        with get_context().override_server_args(radix_cache_backend="radixkv", **{flag: value}) as sa:
            refused(sa, flag, flag.replace("_", "-"))

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("SGLang loads, builds and refuses radixkv's backend through its own path")
    return 0


if __name__ == "__main__":
    sys.exit(main())
