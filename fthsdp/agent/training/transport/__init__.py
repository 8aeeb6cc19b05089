"""The cross-replica transport: the process group FTAR builds for each quorum.

FTAR (fthsdp/agent/training/ftar/allreduce.py) needs little of a transport:

* ``prepare(store, rank, size, quorum_id, timeout, grows)`` then the
  result's ``join()``: the group of a quorum's members, meeting under a
  store prefix of the quorum's own. Either a new group per quorum
  (``in_place`` False: gloo on torch < 2.14 cannot shrink, and an aborted
  NCCL communicator cannot be reused), built whole by ``prepare``; or one
  group for the life of the process, reconfigured in place by ``join``
  (torch >= 2.14: fthsdp/agent/training/transport/reconfigure.py), whose
  ``prepare`` only exchanges the members' handles, so that a quorum that
  grows the group is ready before the step boundary where it switches;
* ``build(store, rank, size, timeout)``: a one-off group (a catch-up
  transfer's: fthsdp/agent/training/catchup/group.py);
* the group's ``allreduce`` (of a bucket, or of the flat buffer),
  ``allgather`` and ``broadcast``, each returning a work handle that FTAR
  polls with ``is_completed()`` together with the coordinator's push
  (fthsdp/agent/training/ftar/groups.py: never a blind blocking wait);
* ``abort(group)``: let go of a group that a newer quorum replaced.

Three implementations: gloo, a group per quorum
(fthsdp/agent/training/transport/gloo.py, CPU or CUDA tensors through host
memory); gloo, one group reconfigured per quorum
(fthsdp/agent/training/transport/reconfigure.py); and NCCL, a communicator
per quorum (fthsdp/agent/training/transport/nccl.py, CUDA tensors only).
tests/test_transport.py holds them to one contract.
"""

from __future__ import annotations

import datetime
import logging
from typing import Protocol

import torch
import torch.distributed as dist

from fthsdp.core.errors import ConfigError

log = logging.getLogger("fthsdp.agent.transport")

BACKENDS = ("auto", "gloo", "nccl")
GROUPS = ("auto", "reconfigure", "per-quorum")
"""``--cross-replica-groups``: one group reconfigured per quorum (torch >=
2.14), a new group per quorum, or auto (reconfigure where torch can)."""


class Pending(Protocol):
    """A quorum's group on its way (``Transport.prepare``)."""

    def join(self) -> object:
        """The group, ready for the quorum's collectives (every member joins at the same time)."""
        ...

    def drop(self) -> None:
        """Not joined: a newer quorum came first."""
        ...


class Transport(Protocol):
    name: str
    device: torch.device
    """Where the group's own small tensors live (FTAR's agree rows and control values)."""
    in_place: bool
    """Whether one group is reconfigured per quorum (else a new group is built per quorum)."""

    def prepare(self, store: dist.Store, rank: int, size: int, quorum_id: int, timeout: datetime.timedelta,
                grows: object | None = None) -> Pending:
        """Quorum ``quorum_id``'s group up to its last step, ``Pending.join``
        (on FTAR's build thread). ``grows``: the group of the quorum it only
        adds replicas to, which trains on meanwhile."""
        ...

    def build(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> object:
        """A one-off group (a catch-up transfer's)."""
        ...

    def abort(self, group: object) -> None:
        """Let go of a group replaced by a newer quorum; a collective of it may still be in flight."""
        ...

    def held(self) -> tuple[object, ...]:
        """The groups the transport itself keeps (QuorumGroups.release keeps them past the interpreter's exit)."""
        ...


class Collectives(Protocol):
    """The collectives FTAR runs in a quorum's group (what ``Transport.build`` returns has them)."""

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor]) -> dist.Work: ...

    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions) -> dist.Work: ...

    def allreduce(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions) -> dist.Work: ...


def choose(backend: str, device: torch.device, host: str = "", interface: str = "", groups: str = "auto") -> Transport:
    """The transport for ``--cross-replica-backend`` (``auto``: NCCL for CUDA
    gradients when this torch has it, else gloo) and ``--cross-replica-groups``
    (gloo: ``auto`` reconfigures one group per quorum where this torch can),
    said in one log line.

    Choosing NCCL sets ``TORCH_NCCL_ASYNC_ERROR_HANDLING=0`` for the process:
    the one change to the process's environment that the training library
    makes past its entry point (``Manager.from_env``), made here alone. It runs in ``Manager.start()``,
    before FTAR's threads exist; torch 2.13 has no per-group way to turn the
    handling off for FTAR's groups, and the script's groups built before
    ``start()`` keep theirs (fthsdp/agent/training/transport/nccl.py)."""
    from fthsdp.agent.training.transport import reconfigure
    from fthsdp.agent.training.transport.gloo import GlooTransport

    if backend not in BACKENDS:
        raise ConfigError(f"--cross-replica-backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if groups not in GROUPS:
        raise ConfigError(f"--cross-replica-groups must be one of {', '.join(GROUPS)}, got {groups!r}")
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" and dist.is_nccl_available() else "gloo"
    if backend == "gloo":
        if groups == "reconfigure" and not reconfigure.supported():
            raise ConfigError(f"--cross-replica-groups reconfigure needs torch >= 2.14 (this is {torch.__version__}); "
                              "use per-quorum or auto")
        if groups != "per-quorum" and reconfigure.supported():
            log.info("cross-replica groups: gloo, one group reconfigured in place per quorum (torch %s)",
                     torch.__version__)
            return reconfigure.ReconfigureTransport(GlooTransport(host, interface))
        log.info("cross-replica groups: gloo, a new group per quorum (torch %s%s)", torch.__version__,
                 "" if groups == "per-quorum" else ": no reconfigure")
        return GlooTransport(host, interface)
    if groups == "reconfigure":
        raise ConfigError("--cross-replica-groups reconfigure is gloo's only for now: NCCL builds a communicator "
                          "per quorum; use auto or per-quorum")
    if device.type != "cuda":
        raise ConfigError(f"--cross-replica-backend nccl needs the gradients on a GPU; they are on {device}")
    if not dist.is_nccl_available():
        raise ConfigError("--cross-replica-backend nccl: this torch has no NCCL (a CPU build?); use gloo")
    from fthsdp.agent.training.transport.nccl import NcclTransport, error_handling_off

    error_handling_off()
    log.info("cross-replica groups: NCCL, a new communicator per quorum (torch %s)", torch.__version__)
    return NcclTransport(device)


__all__ = ["BACKENDS", "GROUPS", "Collectives", "Pending", "Transport", "choose"]
