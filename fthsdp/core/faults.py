"""The faults an operator injects (`fthsdp inject`): their names and how
they are told, shared by the coordinator that records them
(fthsdp/coordinator/job/injection.py), the agents and ranks that carry them out
(fthsdp/agent/injection.py) and the CLI."""

from __future__ import annotations

from fthsdp.protos.v1 import coordinator_pb2 as pb

FAULT_NAMES = {pb.FAULT_KIND_KILL: "kill", pb.FAULT_KIND_HANG: "hang", pb.FAULT_KIND_SLOW: "slow"}
KIND_OF = {name: kind for kind, name in FAULT_NAMES.items()}


def fault_text(fault: str, seconds: float | None = None, steps: int | None = None) -> str:
    """'kill', 'hang' or 'slow (+2s per step for 10 steps)'."""
    return fault + (f" (+{seconds:g}s per step for {steps} steps)" if fault == "slow" else "")


def describe(injection: pb.FaultInjection) -> str:
    """'kill', 'hang' or 'slow (+2s per step for 10 steps)'."""
    return fault_text(FAULT_NAMES.get(injection.kind, "unknown"), injection.seconds, injection.steps)


def asked_by(injection: pb.FaultInjection) -> str:
    who = injection.requested_by or "an unnamed operator"
    return f"{who} from {injection.peer}" if injection.peer else who
