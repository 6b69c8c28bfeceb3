"""The exceptions radixkv raises: one family under :class:`CacheError`,
each also the built-in exception a caller would catch for that kind of
mistake (``ValueError``, ``KeyError``, ``OverflowError``). The message is
the core's."""

from __future__ import annotations

__all__ = [
    "CacheError",
    "InvalidArgument",
    "UnknownTier",
    "StaleHandle",
    "ForeignObject",
    "PinOverflow",
    "OutOfPages",
    "LeaseClosed",
]


class CacheError(Exception):
    """A cache operation that could not be done; the cache is unchanged."""


class InvalidArgument(CacheError, ValueError):
    """A key that is not page-aligned, values that do not match their
    tokens, a setting out of range, an unknown eviction policy, a copy
    from a tier to itself."""


class _Keyed(CacheError, KeyError):
    # KeyError quotes its message in str(); the core's message reads better.
    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownTier(_Keyed):
    """A device the cache does not have, or the host tier of a cache built
    without one."""


class StaleHandle(_Keyed):
    """A node handle whose node left the tree on its tier since its match."""


class ForeignObject(CacheError, ValueError):
    """A node handle or a page span of another cache."""


class PinOverflow(CacheError, OverflowError):
    """2**32 - 1 leases on one node and tier."""


class OutOfPages(CacheError):
    """A tier's allocator could not serve an allocation, even after
    evicting the shortfall (everything left is pinned)."""


class LeaseClosed(CacheError, ValueError):
    """A lease, request or copy used after it was closed or completed."""
