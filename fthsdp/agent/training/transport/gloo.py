"""The gloo transport: a gloo process group per quorum (CPU, or CUDA tensors through host memory)."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from fthsdp.agent.training.transport.pending import Built


class GlooTransport:
    name = "gloo"
    device = torch.device("cpu")
    in_place = False

    def __init__(self, host: str = "", interface: str = "") -> None:
        self._host, self._interface = host, interface
        """Where this rank's gloo pairs listen: the advertised host (the data
        path), or GLOO_SOCKET_IFNAME's interface when set ("" and "": gloo's
        default, the address the host name resolves to)."""

    def backend(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta,
                reconfigure: bool = False) -> dist.ProcessGroupGloo:
        """A gloo group whose pairs use the data path. Gloo's default device
        is the address the host name resolves to, which on many hosts is a
        loopback or the management network, not the address peers were told
        (FTHSDP_ADVERTISE_HOST). The device can only be chosen through the
        group's options, which torch names ``_Options`` (its own new_group
        uses them): there is no public spelling. ``reconfigure``: built with
        no peers, to be reconfigured (torch >= 2.14:
        fthsdp/agent/training/transport/reconfigure.py)."""
        if not (self._host or self._interface or reconfigure):
            return dist.ProcessGroupGloo(store, rank, size, timeout)
        options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # torch's stubs call it Options
        options._timeout = timeout
        if self._host or self._interface:
            options._devices = [dist.ProcessGroupGloo.create_device(interface=self._interface) if self._interface
                                else dist.ProcessGroupGloo.create_device(hostname=self._host)]
        else:
            options._devices = [dist.ProcessGroupGloo.create_default_device()]
        if reconfigure:
            options.enable_reconfigure = True
        return dist.ProcessGroupGloo(store, rank, size, options)

    def build(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> dist.ProcessGroupGloo:
        return self.backend(store, rank, size, timeout)

    def prepare(self, store: dist.Store, rank: int, size: int, quorum_id: int, timeout: datetime.timedelta,
                grows: object | None = None) -> Built:
        """A new group for quorum ``quorum_id`` (gloo cannot shrink): built here, whole."""
        return Built(self.build(store, rank, size, timeout))

    def held(self) -> tuple[object, ...]:
        return ()

    def abort(self, group: object) -> None:
        """Nothing: gloo's ``abort()`` does not unblock a waiting collective
        (docs/measurements.md), and FTAR never waits blindly; the group
        is kept until its collectives time out (QuorumGroups.retire)."""


__all__ = ["GlooTransport"]
