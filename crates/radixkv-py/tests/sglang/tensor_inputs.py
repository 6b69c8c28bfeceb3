"""Token ids and values from torch tensors (run by scripts/sglang-check.sh,
whose venv has torch): a contiguous one-dimensional int64 or int32 CPU
tensor is read at its data pointer, any other tensor through
``numpy(force=True)``; both give the ids a list gives, and bad tensors are
exceptions naming the argument. Exits non-zero on the first failure."""

from __future__ import annotations

import sys

import radixkv
import torch

failures = 0


def check(what: str, ok: bool) -> None:
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    failures += not ok


def raises(what: str, exc: type, needle: str, f) -> None:
    try:
        f()
    except exc as e:
        check(f"{what}: {exc.__name__} ({e})", needle in str(e))
        return
    except Exception as e:  # noqa: BLE001 - reported as the failure it is
        check(f"{what}: expected {exc.__name__}, got {type(e).__name__}: {e}", False)
        return
    check(f"{what}: expected {exc.__name__}, nothing raised", False)


want = [5, 6, 7, 8, 9, 10, 11, 12]
cache = radixkv.RadixCache()
cache.insert(want, torch.arange(100, 108, dtype=torch.int64))
m = cache.match_and_pin(want)
with m.lease:
    check("int64 values read in place", m.values.tolist() == list(range(100, 108)))
cache.insert([1, 2], torch.tensor([7, 8], dtype=torch.int32))
m = cache.match_and_pin([1, 2])
with m.lease:
    check("int32 values read in place", m.values.tolist() == [7, 8])

inputs = {
    "int64": torch.tensor(want, dtype=torch.int64),
    "int32": torch.tensor(want, dtype=torch.int32),
    "uint8": torch.tensor(want, dtype=torch.uint8),
    "int16": torch.tensor(want, dtype=torch.int16),
    "strided view": torch.tensor([x for w in want for x in (w, 0)], dtype=torch.int64)[::2],
    "offset slice": torch.tensor([0, 0, *want], dtype=torch.int64)[2:],
    "int32 slice of a 2-D row": torch.tensor([want, want], dtype=torch.int32)[1],
    "a default-dtype tensor (int64)": torch.tensor(want),
    "a column of a 2-D tensor (non-contiguous)": torch.tensor([[w, 0] for w in want], dtype=torch.int64)[:, 0],
}
for name, t in inputs.items():
    check(f"{name}: matches like the list", cache.match_prefix(t).len == len(want))
check("a contiguous int64 tensor is converted, not borrowed", not radixkv.reads_without_copy(inputs["int64"]))
check("an empty tensor is an empty key", cache.match_prefix(torch.empty(0, dtype=torch.int64)).len == 0)

raises("a negative id", ValueError, "tokens[1] = -1", lambda: cache.match_prefix(torch.tensor([5, -1])))
raises(
    "an id past 2^32",
    ValueError,
    "tokens[0] = 4294967296",
    lambda: cache.match_prefix(torch.tensor([1 << 32])),
)
raises(
    "an int32 negative id",
    ValueError,
    "tokens[2] = -7",
    lambda: cache.match_prefix(torch.tensor([5, 6, -7], dtype=torch.int32)),
)
raises("a float tensor", TypeError, "format", lambda: cache.match_prefix(torch.tensor([1.0, 2.0])))
raises("a 2-D tensor", ValueError, "one-dimensional", lambda: cache.match_prefix(torch.zeros(2, 2, dtype=torch.int64)))
raises(
    "values too short",
    ValueError,
    "values",
    lambda: cache.insert([1, 2, 3], torch.tensor([1, 2], dtype=torch.int64)),
)
neg = torch._neg_view(torch.tensor([5, 6], dtype=torch.int64)) if hasattr(torch, "_neg_view") else None
if neg is not None and neg.is_neg():
    raises("a negative view (its ids are negated)", ValueError, "tokens[0] = -5", lambda: cache.match_prefix(neg))
cache.audit()
check("the cache audits clean after every refusal", cache.check() is None)
if failures:
    print(f"{failures} tensor input check(s) failed")
    sys.exit(1)
print("torch tensors: every input read as the list reads it, every bad one refused by name")
