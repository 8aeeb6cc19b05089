"""The NCCL transport: FTAR's groups as NCCL communicators, one per quorum.

How NCCL is used here, for torch 2.13 (docs/measurements.md):

* One communicator per quorum, under the quorum's own store prefix (an
  aborted communicator cannot be reused), **non-blocking**
  (``ProcessGroupNCCL.Options().config.blocking = 0``: no NCCL call blocks
  the host) and **connected eagerly** (``eager_connect_single_device``), so
  that a member's first collective in the group does not pay for the setup.
* **Error handling off for these groups**: torch reads
  ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` in each ``ProcessGroupNCCL``'s
  constructor (``getCvarInt``, from the C environment, not cached), and its
  default (3, SkipCleanUp) ends the process when the group's watchdog sees
  a peer's error or a timeout. A survivor must outlive its peers, so these
  groups need 0 (the watchdog only logs; FTAR aborts a group itself when a
  newer quorum replaces it; torch turns 0 back to 3 where
  ``TORCH_NCCL_DESYNC_DEBUG`` or ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` is set,
  so those must stay unset). torch 2.13 has no per-group setting for it
  (``ProcessGroupNCCL.Options`` carries the NCCL config, the stream
  priority, the split parent and the group's name only), so ``choose()``
  (fthsdp/agent/training/transport/__init__.py) sets the variable once, in
  ``Manager.start()``, before FTAR's threads exist (``error_handling_off``),
  and ``build`` never touches the environment: setting it around each build
  raced the script's own threads (their reads, and a group of theirs built
  meanwhile) and C++ ``getenv`` calls on torch's and NCCL's threads. The
  script's groups built before ``start()`` (its FSDP world, which a replica
  group of several ranks must build first) keep the handling they were
  built with; NCCL groups it builds after ``start()`` get 0 too.
* **Waits**: FTAR polls ``work.is_completed()`` (a CUDA event query, never a
  blocking host wait) together with the coordinator's push, up to its
  deadline (fthsdp/agent/training/ftar/groups.py), then ``work.wait()`` orders the
  current stream after the collective.
* ``dist.shrink_group`` (NCCL >= 2.27) could drop a dead peer without a new
  communicator; it is not used: a new group per quorum serves both a loss
  and a growth, and shrinking cannot add a member.

Not yet run on a GPU: the suite runs on CPU builds of torch, which have no
NCCL; tests/test_transport.py runs this against the contract where two
GPUs are visible, and benchmarks/gpu.py measures it on one.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from fthsdp.agent.training.transport.pending import Built

ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"


def error_handling_off() -> None:
    """Have every ``ProcessGroupNCCL`` built from now on leave a peer's
    error to FTAR (see the module docstring): called by ``choose()`` alone,
    on the thread that starts the Manager, before FTAR's threads exist."""
    # Written only if it differs: a second Manager of the process finds it set,
    # and a setenv is unsafe while other threads (the first one's) call getenv.
    if os.environ.get(ERROR_HANDLING) != "0":
        os.environ[ERROR_HANDLING] = "0"


class NcclTransport:
    name = "nccl"
    in_place = False

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def build(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> object:
        """The quorum's communicator, with error handling off (``choose()`` set it for the process)."""
        nccl = dist.ProcessGroupNCCL  # absent from CPU builds: choose() checked it is here
        options = nccl.Options()
        options.config.blocking = 0
        options._timeout = timeout
        group = nccl(store, rank, size, options)
        group.eager_connect_single_device(self.device)
        return group

    def prepare(self, store: dist.Store, rank: int, size: int, quorum_id: int, timeout: datetime.timedelta,
                grows: object | None = None) -> Built:
        """A new communicator for quorum ``quorum_id``, built here, whole."""
        return Built(self.build(store, rank, size, timeout))

    def held(self) -> tuple[object, ...]:
        return ()

    def abort(self, group: object) -> None:
        """``ncclCommAbort``: a collective in flight ends (with an error FTAR no longer waits for)."""
        group.abort()  # type: ignore[attr-defined]


__all__ = ["ERROR_HANDLING", "NcclTransport", "error_handling_off"]
