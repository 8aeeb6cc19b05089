"""The soak's control plane and its faults (tests/harness/soak.py): a private etcd
and one or two coordinators under a supervisor (tests/harness/supervised.py), and
what can happen to them: a coordinator SIGKILLed (its supervisor starts it
again; a follower, if there is one, takes over first), etcd stalled by
SIGSTOP for 5-30 s (a disk or host stall; the coordinator's lease runs out,
it exits and its supervisor restarts it until etcd answers again), and etcd
SIGKILLed and restarted on the same data dir."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
import uuid
from pathlib import Path

from fthsdp.client import CoordinatorClient
from fthsdp.protos.v1 import coordinator_pb2 as pb
from fthsdp.testing.local_etcd import EtcdServer
from tests.harness.supervised import SupervisedCoordinator, stall_etcd
from tests.harness.waiting import wait_until

KINDS = ("coordinator_kill", "etcd_stall", "etcd_restart")
NOT_BACK = "not reconnected since the coordinator started"


@dataclasses.dataclass
class ControlFault:
    t: float
    kind: str
    seconds: float = 0.0
    """How long the fault lasted (an etcd stall)."""
    target: str = ""


class ControlPlane:
    """A private etcd and ``coordinators`` supervised coordinators on it."""

    def __init__(self, tmp: Path, coordinators: int, *args: str, restart_sec: float = 0.5) -> None:
        self.etcd = EtcdServer()
        self.etcd.start()
        prefix = f"/fthsdp-soak/{uuid.uuid4().hex[:12]}"
        self.coordinators = [
            SupervisedCoordinator(tmp / f"coordinator-{i}.log", "--store", self.etcd.url, "--store-prefix", prefix,
                                  *args, restart_sec=restart_sec).start()
            for i in range(coordinators)
        ]
        self.addresses = ",".join(c.address for c in self.coordinators)
        self.faults: list[ControlFault] = []
        self.stalled = threading.Event()
        """Set while etcd is stopped: the soak kills no replica then (a member
        lost meanwhile holds its survivors until etcd is back, and a stall
        near FTHSDP_FTAR_TIMEOUT would end them; docs/operations.md)."""
        self._stall: threading.Thread | None = None
        self._closing = threading.Event()

    def wait_serving(self, timeout: float = 60.0) -> None:
        wait_until(lambda: self.leader() is not None, timeout, interval=0.1, message="a coordinator leading")

    def leader(self) -> SupervisedCoordinator | None:
        """The coordinator that says it leads, if any answers."""
        for c in self.coordinators:
            try:
                with CoordinatorClient([c.address], timeout=1) as client:
                    if not client.call("Status", pb.StatusRequest()).follower:
                        return c
            except Exception:  # noqa: BLE001 - down or restarting: ask the next one
                continue
        return None

    def busy(self) -> bool:
        """A fault still under way (an etcd stall)."""
        return self._stall is not None and self._stall.is_alive()

    def inject(self, rng: random.Random) -> ControlFault | None:
        """One control-plane fault of a random kind; None if none could be made now."""
        if self.busy():
            return None
        kind = rng.choice(KINDS)
        t = time.monotonic()
        if kind == "coordinator_kill":
            target = self.leader() or rng.choice(self.coordinators)
            target.kill()
            fault = ControlFault(t, kind, target=target.address)
        elif kind == "etcd_stall":
            seconds = rng.uniform(5.0, 30.0)
            fault = ControlFault(t, kind, seconds)
            self.stalled.set()
            self._stall = threading.Thread(target=self._stall_for, args=(seconds,), daemon=True, name="etcd-stall")
            self._stall.start()
        else:
            self.etcd.kill()
            self.etcd.restart()  # same ports and data dir; returns once it serves again
            fault = ControlFault(t, kind, time.monotonic() - t)
        self.faults.append(fault)
        return fault

    def _stall_for(self, seconds: float) -> None:
        try:
            stall_etcd(self.etcd, seconds, self._closing)
        finally:
            self.stalled.clear()

    def dropped_not_back(self) -> list[str]:
        """Quorum changes that dropped a member because it had not reconnected
        to a coordinator that had just started (healthy or not: a replica
        SIGKILLed before it reconnected is dropped so too)."""
        return [line for c in self.coordinators for line in c.log.lines()
                if "members leaving:" in line and NOT_BACK in line]

    def summary(self) -> dict:
        counts = {kind: sum(f.kind == kind for f in self.faults) for kind in KINDS}
        stalls = [f.seconds for f in self.faults if f.kind == "etcd_stall"]
        return {
            "control_faults": counts,
            "etcd_stall_s": round(sum(stalls), 1),
            "etcd_stall_max_s": round(max(stalls), 1) if stalls else 0.0,
            "coordinator_starts": sum(c.starts for c in self.coordinators),
            "dropped_not_back": len(self.dropped_not_back()),
            "control_log": [dataclasses.asdict(f) for f in self.faults],
        }

    def close(self) -> None:
        self._closing.set()
        if self._stall is not None:
            self._stall.join(timeout=10)
        for c in self.coordinators:
            c.stop()
        self.etcd.close()
