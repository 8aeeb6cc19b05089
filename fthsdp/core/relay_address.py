"""What a rank and its node agent agree on about the agent's relay (fthsdp/agent/node/relay/)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

LOCAL_PING_EVERY = 1.0
"""Seconds between a rank's pings to its node agent's relay (``HeartbeatRequest.local_only``), by which the
agent sees a stopped rank in seconds whatever the coordinator's pace (fthsdp/agent/node/relay/liveness.py)."""


def through_relay(addresses: Sequence[str]) -> bool:
    """Whether these are a node agent's relay (a Unix socket) rather than coordinators."""
    return any(address.startswith("unix:") for address in addresses)


def ping_phase(group: str) -> float:
    """Where in each heartbeat interval the ranks of ``group`` (its job and replica id) ping under node
    agents, as a share of it (0 to 1). The same for every rank of a group, so that the pings of a host come
    together and its relay sends them upstream as one batch, and the group's host 0 sends its hosts' as one
    (fthsdp/agent/node/relay/tree.py); spread over the interval across groups, so that thousands of hosts
    do not send at the same instant."""
    digest = hashlib.blake2b(group.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def until_next_ping(now: float, interval: float, phase: float) -> float:
    """Seconds from ``now`` (a clock every host shares: ``time.time``, NTP-synced) to the next instant at
    ``phase`` of an ``interval``: in (0, interval]."""
    if interval <= 0:
        raise ValueError(f"interval must be positive, got {interval}")
    offset = phase * interval
    slot = math.floor((now - offset) / interval) + 1
    return max(slot * interval + offset - now, 0.0) or interval
