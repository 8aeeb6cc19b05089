"""The NCCL transport: FTAR's groups as NCCL communicators, one per quorum.

How NCCL is used here, for torch 2.13 (docs/measurements.md):

* One communicator per quorum, under the quorum's own store prefix (an
  aborted communicator cannot be reused), **non-blocking**
  (``ProcessGroupNCCL.Options().config.blocking = 0``: no NCCL call blocks
  the host) and **connected eagerly** (``eager_connect_single_device``), so
  that a member's first collective in the group does not pay for the setup.
* **Error handling off for these groups**: torch reads
  ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` once per process group, at
  construction, and its default (3) ends the process when the watchdog sees
  a peer's error. A survivor must outlive its peers, so the variable is 0
  while these groups are built (and put back after): FTAR aborts a group
  itself when a newer quorum replaces it.
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
import threading

import torch
import torch.distributed as dist

_ENV_LOCK = threading.Lock()
ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"


class NcclTransport:
    name = "nccl"

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def build(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> object:
        nccl = dist.ProcessGroupNCCL  # absent from CPU builds: choose() checked it is here
        options = nccl.Options()
        options.config.blocking = 0
        options._timeout = timeout
        with _ENV_LOCK:
            before = os.environ.get(ERROR_HANDLING)
            os.environ[ERROR_HANDLING] = "0"
            try:
                group = nccl(store, rank, size, options)
            finally:
                if before is None:
                    os.environ.pop(ERROR_HANDLING, None)
                else:
                    os.environ[ERROR_HANDLING] = before
        group.eager_connect_single_device(self.device)
        return group

    def abort(self, group: object) -> None:
        """``ncclCommAbort``: a collective in flight ends (with an error FTAR no longer waits for)."""
        group.abort()  # type: ignore[attr-defined]


__all__ = ["NcclTransport"]
