"""The step's all-reduce started bucket by bucket during the backward pass.

Torch DDP overlaps its all-reduce with the backward pass; this does the same
for FTAR. At a step boundary the replica *arms* the next step in the group it
trains in (only a group already in step: the first step in a new group, and
a joiner's, run the same buckets' all-reduces after the backward pass, so
that their sums have the same bits: FTAR._start_sum). During the
backward pass a hook on every parameter (``register_post_accumulate_grad_hook``)
counts the gradients that are ready; once every parameter of a bucket
(fthsdp/agent/training/ftar/buckets.py) has one, and every bucket before it has started, the
bucket's gradients are copied into their slice of the step's flat buffer and
summed in place by an all-reduce in that group. ``allreduce_gradients()``
then starts what has not started (parameters with no gradient this step)
and hands the lot to FTAR, which adds the small tail (batch-norm statistics
and control slots) and waits.

FSDP2 replica groups: FSDP2 sets each sharded parameter's gradient (this
rank's shard of the replica group's reduce-scatter) after the backward pass
of its module and then calls that parameter's post-accumulate-grad hooks
itself, so the same hooks start the cross-replica buckets of the local
shards, module by module, while the backward pass goes on. (FSDP2's
``set_all_reduce_hook`` would hand over the reduce-scatter output to be
summed in place, leaving no intact local gradient to redo a step from after
a failure, and is refused for modules with several parameter groups.)

The gradients themselves are never touched, so everything FTAR does on a
failure stays as it was: a bucket in flight in a group that a newer quorum
replaced is dropped with that group, and the survivors redo the step flat
from the intact gradients.

Gradient accumulation: the hooks fire in every micro-batch's backward pass.
A bucket starts on the pass that is the step's last by the count of the step
before (1 at first), so the micro-batches before it send nothing. A loop
whose count changes is caught: a gradient accumulated into a bucket already
started marks the step *stale* (in FTAR's STALE_SLOT, so every member learns
it from the same sum) and the members sum the step again, flat, in the same
group; the next step starts on the new count.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.profiler import record_function

from fthsdp.agent.training.ftar.buckets import Bucket, BucketPlan, bucket_of, plan_buckets
from fthsdp.agent.training.ftar.buffer_pool import BufferPool
from fthsdp.agent.training.state.codec import local


@dataclasses.dataclass(frozen=True)
class Prelaunched:
    """A step whose buckets were started in ``group`` (FTAR's ``prelaunched``)."""

    group: object
    """The FTAR group they run in (the step uses them only if it runs there)."""
    buffer: torch.Tensor
    """The step's flat buffer: the buckets write their sums into its gradient part."""
    works: tuple[object, ...]
    """The buckets' all-reduces, in the order they started."""
    gradients: int
    """Elements of the gradient part: the tail (statistics, control slots) follows."""
    stale: bool
    """A gradient changed after its bucket started (another backward pass): the sum must be redone."""
    in_backward: int = 0
    """Buckets started during the backward pass (the others at ``complete``)."""


@dataclasses.dataclass
class _Armed:
    group: object
    pg: object
    buffer: torch.Tensor
    fired: list[int]
    ready: list[int]
    started: int = 0
    works: list[object] = dataclasses.field(default_factory=list)
    stale: bool = False


class Overlap:
    def __init__(self, params: list[torch.Tensor], cap_bytes: int, tail: int,
                 buffers: BufferPool | None = None) -> None:
        """``params``: the parameters with gradients, in the flat buffer's
        order; ``tail``: elements after the gradients (statistics, control
        slots). FSDP2 parameters count by this rank's shard. Overlap is off
        (``enabled`` False) for ``cap_bytes`` 0 and for gradients of mixed
        dtypes or devices. ``buffers``: where each step's flat buffer comes
        from (fthsdp/agent/training/ftar/buffer_pool.py); None: a fresh one per step."""
        self._params = params
        self._buffers = buffers if buffers is not None else BufferPool(0)
        self._tail = tail
        shards = [local(p) for p in params]
        dtypes = {(p.dtype, p.device) for p in shards}
        self.enabled = cap_bytes > 0 and bool(params) and len(dtypes) == 1
        numels = [p.numel() for p in shards]
        self.buckets: tuple[Bucket, ...] = (
            plan_buckets(numels, shards[0].element_size(), cap_bytes) if self.enabled else ())
        self.plan = BucketPlan.of(self.buckets)
        """FTAR's copy of it (compared in every new group's agree; slices for a step summed afterwards)."""
        self._gradients = sum(numels)
        self._bucket_of = bucket_of(self.buckets, len(params))
        self._lock = threading.Lock()
        """The hooks run on autograd's threads; ``complete`` on the training thread."""
        self._armed: _Armed | None = None
        self._passes = 1
        """Backward passes per step, learned from the step before (gradient accumulation)."""
        self._expected = [True] * len(params)
        """The parameters that had a gradient in the step before (the others do not hold a bucket back)."""
        self._need = [b.stop - b.first for b in self.buckets]
        self._handles = ([p.register_post_accumulate_grad_hook(self._hook(i)) for i, p in enumerate(params)]
                         if self.enabled else [])

    def arm(self, group: object, pg: object) -> None:
        """At a step boundary: start the next step's buckets in ``group`` (its process group ``pg``)."""
        if not self.enabled:
            return
        p = local(self._params[0])
        buffer = self._buffers.take(self._gradients + self._tail, p.dtype, p.device)
        with self._lock:
            if self._armed is not None:
                self._buffers.forget(self._armed.buffer)
            self._armed = _Armed(group, pg, buffer, [0] * len(self._params), [0] * len(self.buckets))

    def disarm(self) -> None:
        with self._lock:
            if self._armed is not None:
                self._buffers.forget(self._armed.buffer)  # a bucket of it may be in flight
            self._armed = None

    def complete(self) -> Prelaunched | None:
        """At ``allreduce_gradients()``: start every bucket not started yet (in
        order) and return the step's buckets; None if the step was not armed."""
        with self._lock:
            armed, self._armed = self._armed, None
            if armed is None:
                return None
            in_backward = armed.started
            while armed.started < len(self.buckets):
                self._start(armed)
        fired = armed.fired
        self._passes = max(1, max(fired))
        self._expected = [n > 0 for n in fired]
        self._need = [sum(self._expected[b.first:b.stop]) for b in self.buckets]
        return Prelaunched(armed.group, armed.buffer, tuple(armed.works), self._gradients, armed.stale, in_backward)

    def close(self) -> None:
        """Take the hooks off the script's model."""
        self.disarm()
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # ----- autograd's side -------------------------------------------------------------

    def _hook(self, index: int):
        def ready(_param: torch.Tensor) -> None:
            with self._lock:
                armed = self._armed
                if armed is None:
                    return
                armed.fired[index] += 1
                bucket = self._bucket_of[index]
                if bucket < armed.started:
                    armed.stale = True  # accumulated into a bucket already on its way
                    return
                if armed.fired[index] == self._passes and self._expected[index]:
                    armed.ready[bucket] += 1
                while armed.started < len(self.buckets) and armed.ready[armed.started] >= self._need[armed.started]:
                    self._start(armed)
        return ready

    def _start(self, armed: _Armed) -> None:
        """Copy the next bucket's gradients into its slice and start its all-reduce (under the lock)."""
        with record_function("fthsdp.bucket_start"):  # a phase of benchmarks/step_profile.py
            bucket = self.buckets[armed.started]
            offset = bucket.start_element
            with torch.no_grad():
                for p in self._params[bucket.first:bucket.stop]:
                    n = local(p).numel()
                    piece = armed.buffer[offset:offset + n]
                    if p.grad is None:
                        piece.zero_()
                    else:
                        piece.copy_(local(p.grad).reshape(-1))
                    offset += n
            opts = dist.AllreduceOptions()
            opts.reduceOp = cast(Any, dist.ReduceOp.SUM)  # pybind11 converts it; torch 2.13's stubs do not say so
            view = armed.buffer[bucket.start_element:bucket.stop_element]
            armed.works.append(armed.pg.allreduce([view], opts))  # type: ignore[attr-defined]
            armed.started += 1

__all__ = ["Overlap", "Prelaunched"]
