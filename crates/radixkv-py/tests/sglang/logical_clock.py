"""A stand-in for the `time` module of SGLang's `radix_cache`, shared by
the differential scripts: both sides must see the same access times, so
`monotonic` counts calls instead of reading a clock."""

from __future__ import annotations

import time


class LogicalClock:
    """`time` for SGLang's radix_cache module: a strictly increasing
    `monotonic`, the real `perf_counter` (eviction metrics)."""

    def __init__(self) -> None:
        self.t = 0

    def monotonic(self) -> float:
        self.t += 1
        return float(self.t)

    perf_counter = staticmethod(time.perf_counter)
