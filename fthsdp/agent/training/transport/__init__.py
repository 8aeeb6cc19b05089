"""The cross-replica transport: the process group FTAR builds for each quorum.

FTAR (fthsdp/agent/training/ftar/allreduce.py) needs little of a transport:

* ``build(store, rank, size, timeout)``: a group of the quorum's members,
  under a store prefix of its own (a new group per quorum: gloo cannot
  shrink, and an aborted NCCL communicator cannot be reused);
* the group's ``allreduce`` (of a bucket, or of the flat buffer),
  ``allgather`` and ``broadcast``, each returning a work handle that FTAR
  polls with ``is_completed()`` together with the coordinator's push
  (fthsdp/agent/training/ftar/groups.py: never a blind blocking wait);
* ``abort(group)``: let go of a group that a newer quorum replaced.

Two implementations: gloo (fthsdp/agent/training/transport/gloo.py, CPU or CUDA tensors through
host memory) and NCCL (fthsdp/agent/training/transport/nccl.py, CUDA tensors only).
tests/test_transport.py holds both to one contract.
"""

from __future__ import annotations

import datetime
from typing import Protocol

import torch
import torch.distributed as dist

from fthsdp.core.errors import ConfigError

BACKENDS = ("auto", "gloo", "nccl")


class Transport(Protocol):
    name: str
    device: torch.device
    """Where the group's own small tensors live (FTAR's agree rows and control values)."""

    def build(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> object:
        """The group of one quorum (on FTAR's build thread)."""
        ...

    def abort(self, group: object) -> None:
        """Let go of a group replaced by a newer quorum; a collective of it may still be in flight."""
        ...


class Collectives(Protocol):
    """The collectives FTAR runs in a quorum's group (what ``Transport.build`` returns has them)."""

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor]) -> dist.Work: ...

    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions) -> dist.Work: ...

    def allreduce(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions) -> dist.Work: ...


def choose(backend: str, device: torch.device, host: str = "", interface: str = "") -> Transport:
    """The transport for ``--cross-replica-backend`` (``auto``: NCCL for CUDA
    gradients when this torch has it, else gloo).

    Choosing NCCL sets ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` for the process:
    the one change to the process's environment that the training library
    makes past its entry point (``Manager.from_env``), made here alone. It runs in ``Manager.start()``,
    before FTAR's threads exist; torch 2.13 has no per-group way to turn the
    handling off for FTAR's groups, and the script's groups built before
    ``start()`` keep theirs (fthsdp/agent/training/transport/nccl.py)."""
    from fthsdp.agent.training.transport.gloo import GlooTransport

    if backend not in BACKENDS:
        raise ConfigError(f"--cross-replica-backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" and dist.is_nccl_available() else "gloo"
    if backend == "gloo":
        return GlooTransport(host, interface)
    if device.type != "cuda":
        raise ConfigError(f"--cross-replica-backend nccl needs the gradients on a GPU; they are on {device}")
    if not dist.is_nccl_available():
        raise ConfigError("--cross-replica-backend nccl: this torch has no NCCL (a CPU build?); use gloo")
    from fthsdp.agent.training.transport.nccl import NcclTransport, error_handling_off

    error_handling_off()
    return NcclTransport(device)


__all__ = ["BACKENDS", "Collectives", "Transport", "choose"]
