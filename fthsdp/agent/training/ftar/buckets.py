"""Which gradients travel together: the buckets of the overlapped all-reduce, as a pure function.

The step's flat buffer keeps the parameters' order (fthsdp/agent/training/step/buffer.py:
the gradients, then the batch-norm statistics, then FTAR's control slots), so
that the sum, the gradient log and a joiner's replay do not change. A bucket
is a run of consecutive parameters, and so a contiguous slice of that buffer
that an all-reduce can sum in place.

The backward pass produces gradients roughly from the last parameter to the
first, so buckets are cut from the end: bucket 0 holds the last parameters and
starts first. Like DDP, the first bucket is small (``FIRST_BUCKET_BYTES``), so
that communication starts early, and the others hold about ``cap_bytes``.
Every member computes the same plan from the same model, and the buckets start
in index order on every member whatever order the hooks fire in, so that the
members' collectives pair up one for one (gloo matches them by order).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

FIRST_BUCKET_BYTES = 1 << 20
"""The first bucket's cap (DDP's ``first_bucket_bytes_cap`` is 1 MiB too)."""

DEFAULT_CAP_BYTES = 25 << 20
"""The other buckets' cap: DDP's ``bucket_cap_mb=25``."""


@dataclasses.dataclass(frozen=True)
class Bucket:
    first: int
    """The index of its first parameter; it holds parameters ``first .. stop - 1``."""
    stop: int
    start_element: int
    """Where it begins in the flat buffer (elements)."""
    stop_element: int


def plan_buckets(numels: Sequence[int], element_size: int, cap_bytes: int) -> tuple[Bucket, ...]:
    """Cut the parameters (their element counts, in the flat buffer's order)
    into buckets, the last parameters first; () for ``cap_bytes`` 0 (no
    overlap: one all-reduce after the backward pass). A parameter larger
    than the cap is a bucket alone."""
    if cap_bytes <= 0 or not numels:
        return ()
    offsets = [0]
    for n in numels:
        offsets.append(offsets[-1] + n)
    buckets: list[Bucket] = []
    stop = len(numels)
    cap = min(FIRST_BUCKET_BYTES, cap_bytes)
    while stop > 0:
        first, size = stop - 1, numels[stop - 1] * element_size
        while first > 0 and size + numels[first - 1] * element_size <= cap:
            first -= 1
            size += numels[first] * element_size
        buckets.append(Bucket(first, stop, offsets[first], offsets[stop]))
        stop, cap = first, cap_bytes
    return tuple(buckets)


@dataclasses.dataclass(frozen=True)
class BucketPlan:
    """How a replica cuts its gradients into buckets, as FTAR needs it: its
    signature, compared in every new group's agree, and the buckets' slices
    of the gradient part in the order they start (a step summed after the
    backward pass runs them too, so that it sums bit for bit as the overlapped
    step does)."""

    signature: int = 0
    slices: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, buckets: Sequence[Bucket]) -> BucketPlan:
        return cls(plan_signature(buckets), tuple((b.start_element, b.stop_element) for b in buckets))


NO_BUCKETS = BucketPlan()
"""A replica whose step is summed flat after the backward pass."""


def plan_signature(buckets: Sequence[Bucket]) -> int:
    """A 31-bit digest of a plan, compared in a new group's agree: members
    with different plans (a different ``--bucket-cap-mb``) would pair
    collectives of different sizes, so they are refused there, loudly."""
    text = ";".join(f"{b.start_element}-{b.stop_element}" for b in buckets)
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


def bucket_of(buckets: Sequence[Bucket], count: int) -> list[int]:
    """The bucket index of each of ``count`` parameters."""
    out = [-1] * count
    for index, b in enumerate(buckets):
        for p in range(b.first, b.stop):
            out[p] = index
    return out


__all__ = ["DEFAULT_CAP_BYTES", "FIRST_BUCKET_BYTES", "Bucket", "bucket_of", "plan_buckets", "plan_signature"]
