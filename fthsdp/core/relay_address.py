"""What a rank and its node agent agree on about the agent's relay (fthsdp/agent/node/relay/)."""

from __future__ import annotations

from collections.abc import Sequence

LOCAL_PING_EVERY = 1.0
"""Seconds between a rank's pings to its node agent's relay (``HeartbeatRequest.local_only``), by which the
agent sees a stopped rank in seconds whatever the coordinator's pace (fthsdp/agent/node/relay/liveness.py)."""


def through_relay(addresses: Sequence[str]) -> bool:
    """Whether these are a node agent's relay (a Unix socket) rather than coordinators."""
    return any(address.startswith("unix:") for address in addresses)
