"""Polls the coordinator's Status over gRPC into the recorder, and turns its
changes (a new quorum, an agent's transition, a replica catching up, a new
checkpoint) into events for the views."""

from __future__ import annotations

import threading
import time

from fthsdp.core.errors import FthsdpError
from fthsdp.demo.record import Recorder, StatusSample, short_reason

POLL_INTERVAL = 0.05
"""Seconds between Status calls: the timeline's resolution. Detection and
recovery times do not depend on it: they come from the quorums' own timestamps."""


def changes(before: StatusSample | None, now: StatusSample) -> list[str]:
    """What changed between two samples, in words."""
    out = []
    if now.quorum_id and (before is None or before.quorum_id != now.quorum_id):
        out.append(f"quorum {now.quorum_id}: {', '.join(now.members) or 'none'} ({short_reason(now.quorum_reason)})")
    if now.checkpoint_step and now.checkpoint_step != (before.checkpoint_step if before else 0):
        out.append(f"checkpoint of step {now.checkpoint_step} complete")
    for replica, view in now.replicas.items():
        old = before.replicas.get(replica) if before else None
        if view.agent_state and (old is None or old.agent_state != view.agent_state):
            out.append(f"{replica}: agent {view.agent_state}")
        if view.state != (old.state if old else "") and view.state in ("catching-up", "failed"):
            source = f" from {view.catch_up_source}" if view.catch_up_source else ""
            out.append(f"{replica}: {view.state}{source}")
    return out


class StatusPoller:
    def __init__(self, client, rec: Recorder, interval: float = POLL_INTERVAL) -> None:
        self.client = client
        self.rec = rec
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-status-poller", daemon=True)

    def start(self) -> StatusPoller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        before = None
        while not self._stop.wait(self.interval):  # a fixed rate, not a synchronisation
            try:
                status = self.client.status()
            except FthsdpError:
                continue  # starting, or stopping: the next poll tells
            now = self.rec.status(status, time.monotonic())
            for text in changes(before, now):
                self.rec.event(text)
            before = now
