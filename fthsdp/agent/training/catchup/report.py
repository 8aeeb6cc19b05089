"""How a replica caught up, as ``Manager.catch_up`` and the benchmarks read it."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class CatchUpReport:
    """What the last catch-up took (times on the monotonic clock, which is
    system-wide, so other processes' timestamps compare)."""

    source: str = ""
    snapshot_step: int = -1
    snapshot_bytes: int = 0
    """Bytes of this rank's snapshot."""
    began: float = 0.0
    loaded: float = 0.0
    """The snapshot is received and loaded."""
    ready: float = 0.0
    """Verified and close to the head: admission asked for."""
    admitted: float = 0.0
    replayed_steps: int = 0
    attempts: int = 0
    """Catch-ups started (more than one after a source failed or a refusal)."""
    transport: str = ""
    """http; https whenever the coordinator uses TLS (fthsdp/agent/training/catchup/tls.py);
    or the session group's, e.g. "distributed (nccl)" (fthsdp/agent/training/catchup/group.py)."""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


__all__ = ["CatchUpReport"]
