"""The gloo transport: FTAR's groups as gloo process groups (CPU, or CUDA tensors through host memory)."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist


class GlooTransport:
    name = "gloo"
    device = torch.device("cpu")

    def __init__(self, host: str = "", interface: str = "") -> None:
        self._host, self._interface = host, interface
        """Where this rank's gloo pairs listen: the advertised host (the data
        path), or GLOO_SOCKET_IFNAME's interface when set ("" and "": gloo's
        default, the address the host name resolves to)."""

    def build(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> dist.ProcessGroupGloo:
        """A gloo group whose pairs use the data path. Gloo's default device
        is the address the host name resolves to, which on many hosts is a
        loopback or the management network, not the address peers were told
        (FTHSDP_ADVERTISE_HOST). The device can only be chosen through the
        group's options, which torch names ``_Options`` (its own new_group
        uses them): there is no public spelling."""
        if not (self._host or self._interface):
            return dist.ProcessGroupGloo(store, rank, size, timeout)
        options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # torch's stubs call it Options
        options._timeout = timeout
        options._devices = [dist.ProcessGroupGloo.create_device(interface=self._interface) if self._interface
                            else dist.ProcessGroupGloo.create_device(hostname=self._host)]
        return dist.ProcessGroupGloo(store, rank, size, options)

    def abort(self, group: object) -> None:
        """Nothing: gloo's ``abort()`` does not unblock a waiting collective
        (docs/measurements.md), and FTAR never waits blindly; the group
        is kept until its collectives time out (QuorumGroups.retire)."""


__all__ = ["GlooTransport"]
