"""Cache-aware data-parallel dispatch for SGLang 0.5.23: each request sent
to the rank whose cache holds its prefix.

The switch is the environment variable ``RADIXKV_DP_DISPATCH=1`` in the
server's environment. SGLang's ``--load-balance-method`` accepts only its
own names (``round_robin``, ``follow_bootstrap_room``, ``total_requests``,
``total_tokens``) and refuses any other before a plug-in could read it, so
the plug-in needs a switch of its own; an environment variable reaches the
data-parallel controller's process, where the plug-in runs, with no change
to SGLang's command line. With it set, the ``radixkv`` plug-in
(:mod:`radixkv.sglang_plugin`, loaded by ``load_plugins()`` in every SGLang
process) registers an AFTER hook on ``DataParallelController.__init__``
with SGLang's ``HookRegistry``; the hook replaces the controller's
``dispatching`` with :class:`Dispatcher`'s.

The dispatcher keeps a :class:`radixkv.DpRouter` fed by every rank's own KV
events: SGLang's ``--kv-events-config`` (``"publisher": "zmq"``), each
rank's endpoint derived as SGLang's publisher derives it (the port plus
the rank; a wildcard host is reached on 127.0.0.1). The router follows the
sockets on a thread of its own, without the GIL, and replays gaps from the
replay endpoint when the config names one. Without events the controller
refuses to start, naming the flag.

Each request: a ``routed_dp_rank`` is honoured (an inactive one falls back
as below); otherwise the rank is the router's choice over the ranks'
caches, the prefixes already sent to each, and the loads SGLang's
``DPBudget`` keeps (refreshed from the schedulers' load snapshots as for
``total_tokens``). While a rank's stream has a gap, or for a request the
router cannot place, the request goes by ``total_tokens`` (each cause
logged once). Dispatch never raises: an exception in the controller's loop
stops the whole server.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Optional

__all__ = [
    "ENV",
    "OPTIONS_ENV",
    "DEFAULT_OPTIONS",
    "Dispatcher",
    "attach",
    "enabled",
    "install",
    "options",
    "rank_endpoint",
]

logger = logging.getLogger(__name__)

#: The switch.
ENV = "RADIXKV_DP_DISPATCH"
#: The router's options, a JSON object of :class:`radixkv.DpRouter`'s
#: keyword arguments, laid over :data:`DEFAULT_OPTIONS`.
OPTIONS_ENV = "RADIXKV_DP_OPTIONS"
#: The dispatcher's default options: the thresholds weigh the requests
#: SGLang's ``DPBudget`` counts, a rank steps aside only when it runs
#: more than 6 of them and more than 1.2 times the mean, and a prompt no
#: rank holds any of goes to the rank written least lately (the rule and
#: the figures that chose them: docs/dp-router.md and BENCHMARKS.md).
DEFAULT_OPTIONS: dict[str, Any] = {
    "load": "requests",
    "balance": "above_mean",
    "balance_abs": 6,
    "balance_rel": 1.2,
    "new_prefix": "least_written",
}

_TARGET = "sglang.srt.managers.data_parallel_controller.DataParallelController.__init__"


def enabled() -> bool:
    """Whether ``RADIXKV_DP_DISPATCH`` asks for radixkv's dispatch."""
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


_installed = False


def install() -> None:
    """Registers the controller hook with SGLang's ``HookRegistry`` when the
    switch is on (``load_plugins()`` applies it); once per process."""
    global _installed
    if _installed or not enabled():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(_TARGET, _after_init, HookType.AFTER)
    _installed = True


def _after_init(result: Any, controller: Any, *args: Any, **kwargs: Any) -> Any:
    attach(controller)
    return result


def options() -> dict[str, Any]:
    """The router's keyword arguments: the defaults, updated by
    ``RADIXKV_DP_OPTIONS``. Raises ``ValueError`` naming the variable for
    anything but a JSON object."""
    out: dict[str, Any] = dict(DEFAULT_OPTIONS)
    raw = os.environ.get(OPTIONS_ENV, "").strip()
    if raw:
        try:
            extra = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"{OPTIONS_ENV} is not JSON: {e}") from None
        if not isinstance(extra, dict):
            raise ValueError(f"{OPTIONS_ENV} must be a JSON object of DpRouter's keyword arguments")
        out.update(extra)
    return out


def rank_endpoint(endpoint: Optional[str], rank: int) -> Optional[str]:
    """The endpoint rank ``rank`` publishes on, as SGLang's
    ``ZmqEventPublisher.offset_endpoint_port`` derives it, in the form a
    subscriber connects to (a wildcard host becomes 127.0.0.1)."""
    if not endpoint:
        return None
    if not endpoint.startswith("tcp://"):
        raise ValueError(f"radixkv DP dispatch follows tcp:// endpoints only, not {endpoint!r}")
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    if host in ("*", "0.0.0.0", ""):
        host = "127.0.0.1"
    return f"tcp://{host}:{int(port) + rank}"


def _events_config(controller: Any) -> Any:
    raw = getattr(controller.server_args, "kv_events_config", None)
    if raw is None:
        try:
            from sglang.srt.runtime_context import get_observability

            raw = get_observability().kv_events_config
        except Exception:  # noqa: BLE001 - an older layout: no config
            raw = None
    if not raw:
        return None
    from sglang.srt.disaggregation.kv_events import KVEventsConfig

    cfg = KVEventsConfig.from_cli(raw)
    return cfg if cfg.publisher == "zmq" else None


def attach(controller: Any, router: Any = None) -> "Dispatcher":
    """Installs radixkv's dispatch on ``controller`` (a
    ``DataParallelController`` whose ranks are launched): a router over its
    ranks, subscribed to each rank's KV events unless ``router`` is given.
    Raises ``RuntimeError`` naming ``--kv-events-config`` when the ranks
    publish no events."""
    import radixkv

    ranks = len(controller.dp_budget.total_requests)
    page_size = getattr(controller.server_args, "page_size", None) or 1
    cfg = None
    if router is None:
        cfg = _events_config(controller)
        if cfg is None:
            raise RuntimeError(
                f"{ENV}=1 (radixkv's cache-aware DP dispatch) needs each rank's KV events: "
                "start SGLang with --kv-events-config "
                '\'{"publisher": "zmq", "endpoint": "tcp://*:5557", '
                '"replay_endpoint": "tcp://*:5600"}\''
            )
        router = radixkv.DpRouter(ranks, page_size, **options())
        for rank in range(ranks):
            router.subscribe(
                rank,
                rank_endpoint(cfg.endpoint, rank),
                rank_endpoint(cfg.replay_endpoint, rank),
                cfg.topic,
            )
    d = Dispatcher(controller, router, lora_in_events=cfg is not None and cfg.format == "dynamo")
    controller.dispatching = d.dispatch
    # The loads are refreshed from the schedulers' snapshots before each
    # dispatch, as for total_tokens.
    controller.refresh_load_budget_on_dispatch = True
    controller._radixkv_dispatcher = d
    logger.info(
        "radixkv: cache-aware DP dispatch over %d ranks (pages of %d tokens)", ranks, page_size
    )
    return d


class Dispatcher:
    """The controller's ``dispatching``: see the module docs."""

    def __init__(self, controller: Any, router: Any, *, lora_in_events: bool = False) -> None:
        self.controller = controller
        self.router = router
        #: SGLang's default event format names no LoRA adapter: its blocks
        #: are scored without one.
        self.lora_in_events = lora_in_events
        self.routed = 0
        self.fallbacks = 0
        self._logged: set[str] = set()

    def _once(self, cause: str, detail: str) -> None:
        if cause not in self._logged:
            self._logged.add(cause)
            logger.warning("radixkv DP dispatch: %s: %s (logged once)", cause, detail)

    def choose(self, req: Any) -> Optional[int]:
        """The rank for ``req`` by the router, or ``None`` to fall back."""
        c = self.controller
        ranks = self.router.ranks
        routed = getattr(req, "routed_dp_rank", None)
        active_set = set(c._active_workers)
        if routed is not None:
            if routed in active_set and 0 <= routed < ranks and c.workers[routed] is not None:
                return routed
            self._once("routed_dp_rank", f"rank {routed} is not active; routing the request")
        stale = self.router.stale_ranks()
        if stale:
            self._once("stale", f"ranks {stale} lost events; total_tokens until they clear")
            return None
        tokens = getattr(req, "input_ids", None)
        if tokens is None or len(tokens) == 0:
            return None
        import radixkv

        lora = getattr(req, "lora_name", None) if self.lora_in_events else None
        ns = radixkv.namespace_for(lora, getattr(req, "cache_salt", None))
        budget = c.dp_budget
        loads = list(zip(budget.total_requests, budget.total_tokens))
        active = [r in active_set and c.workers[r] is not None for r in range(ranks)]
        return self.router.route(tokens, ns, loads, active)

    def dispatch(self, req: Any) -> None:
        """Sends ``req`` to its rank; never raises (a failure falls back to
        ``total_tokens``, and that one's failure is logged)."""
        c = self.controller
        try:
            rank = self.choose(req)
        except Exception as e:  # noqa: BLE001 - dispatch must not raise
            self._once("error", repr(e))
            rank = None
        try:
            if rank is None:
                self.fallbacks += 1
                if getattr(req, "routed_dp_rank", None) is not None:
                    req.routed_dp_rank = None
                c.total_tokens_scheduler(req)
                return
            # The controller module's own sender (what its schedulers use).
            from sglang.srt.managers import data_parallel_controller as dpc

            # The budget's speculative count, as DPBudget.dispatch keeps it.
            c.dp_budget.total_requests[rank] += 1
            c.dp_budget.total_tokens[rank] += len(req.input_ids)
            self.routed += 1
            dpc.sock_send(c.workers[rank], req)
        except Exception as e:  # noqa: BLE001 - dispatch must not raise
            self._once("send", repr(e))
