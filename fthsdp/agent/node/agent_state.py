"""The node agent's lifecycle (``AgentState``) and the transitions it allows.

The values are the proto's ``AgentState``: the agent reports every
transition to the coordinator as it is (fthsdp/agent/node/reporter.py), and
``fthsdp status`` shows the last.
"""

from __future__ import annotations

import enum

from fthsdp.protos.v1 import coordinator_pb2 as pb


class AgentState(enum.IntEnum):
    """The lifecycle of a node agent; the values are the proto's ``AgentState``.

    ::

        STARTING ──> RUNNING ──(every rank exits 0)──────────────> SUCCEEDED
          │  ▲          │
          │  │          ├──(a rank exits non-zero, or it hangs)───> FAILED ─┬─(restarts left)──> RESTARTING
          │  │          │                                                   └─(none left)──────> GAVE_UP
          │  └──────────┼──────────(back-off over, restart_count+1)──────────────────────────── RESTARTING
          │             │
          │             └──(SIGTERM/SIGINT)──> DRAINING ──(every rank exits 0)──> SUCCEEDED
          │                                     ▲  ▲   └──(otherwise)─────────> GAVE_UP
          ├──(SIGTERM/SIGINT)───────────────────┘  │
          │                   FAILED, RESTARTING ──┘ (SIGTERM: no restart; nothing left to drain -> SUCCEEDED)
          ├──(the rank command cannot be started)──> GAVE_UP
          └──(a group of several hosts: the coordinator releases this host)──> SUCCEEDED

    * STARTING: launching the local ranks (a fresh MASTER_PORT when it is 0).
    * RUNNING: all local ranks started; checked every --monitor-interval.
    * FAILED: a rank died, or the coordinator took the replica out as hung
      (fthsdp/agent/node/hang_watch.py); the ranks are SIGTERMed (SIGKILLed after
      --stop-timeout, or --hang-grace for a hang). Reported before they are stopped.
      A replica the coordinator took out for a checksum mismatch twice in a
      row after catching up is not restarted: GAVE_UP, "gave up: <why>"
      (fthsdp/coordinator/decisions/divergence.py).
    * RESTARTING: waiting out the back-off; a SIGTERM ends the wait.
    * DRAINING: the agent was asked to stop; ranks got SIGTERM and leave the
      quorum at their next step boundary.
    * SUCCEEDED and GAVE_UP are final: the agent exits 0 and 1 respectively.
      A rank that exits 0 because its job finished before it arrived
      (fthsdp/agent/training/session/job_finished.py) ends the agent as SUCCEEDED, "job finished at step N".
    """

    STARTING = pb.AGENT_STATE_STARTING
    RUNNING = pb.AGENT_STATE_RUNNING
    FAILED = pb.AGENT_STATE_FAILED
    RESTARTING = pb.AGENT_STATE_RESTARTING
    DRAINING = pb.AGENT_STATE_DRAINING
    SUCCEEDED = pb.AGENT_STATE_SUCCEEDED
    GAVE_UP = pb.AGENT_STATE_GAVE_UP

    @property
    def final(self) -> bool:
        return self in (AgentState.SUCCEEDED, AgentState.GAVE_UP)


TRANSITIONS: dict[AgentState | None, frozenset[AgentState]] = {
    None: frozenset({AgentState.STARTING}),
    AgentState.STARTING: frozenset({AgentState.RUNNING, AgentState.DRAINING, AgentState.GAVE_UP,
                                    AgentState.SUCCEEDED}),  # a host of a group the coordinator no longer needs
    AgentState.RUNNING: frozenset({AgentState.SUCCEEDED, AgentState.FAILED, AgentState.DRAINING}),
    AgentState.FAILED: frozenset({AgentState.RESTARTING, AgentState.GAVE_UP, AgentState.DRAINING}),
    AgentState.RESTARTING: frozenset({AgentState.STARTING, AgentState.DRAINING}),
    AgentState.DRAINING: frozenset({AgentState.SUCCEEDED, AgentState.GAVE_UP}),
    AgentState.SUCCEEDED: frozenset(),
    AgentState.GAVE_UP: frozenset(),
}
"""Every allowed transition; ``Supervisor`` refuses any other (a bug)."""


__all__ = ["TRANSITIONS", "AgentState"]
