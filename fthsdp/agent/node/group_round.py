"""One host's side of its replica group's rounds, as a state machine (issue 39).

The coordinator decides the rounds (fthsdp/coordinator/hosts/rendezvous.py); each
host's agent follows them. ``step`` takes the agent's state and what just
happened (an answer or push from the coordinator, or its own ranks ending)
and returns the next state and the one action to take, in the manner of
torchelastic's rendezvous join operation: no callbacks, no retry loop with
the protocol inside it.

::

    CONNECTING --welcome--> JOINING (a spare: SPARE --adopted--> JOINING)
    JOINING --taken--> GATHERING --complete--> RUNNING --ranks failed / round ended--> STOPPING
       ^                   |                      |                                       |
       +--------------- round ended <-------------+---------- ranks stopped ---------------+
    (every state) --refused / gave up / out of rounds / finished--> ENDED

The round's number is the group's incarnation: the ranks get it as their
restart count, so that every host of the group counts restarts alike, and
``max_restarts`` counts rounds of the group, not restarts of one host.

The agent runs it in fthsdp/agent/node/group_rendezvous.py; it is tested
table-driven (tests/test_group_round.py).
"""

from __future__ import annotations

import dataclasses
import enum


class Phase(enum.Enum):
    CONNECTING = "connecting"
    """Waiting for the coordinator's welcome, which names the group's round."""
    SPARE = "spare"
    """A spare host, waiting for a group to adopt it."""
    JOINING = "joining"
    """A join for ``round`` is on its way to the coordinator."""
    GATHERING = "gathering"
    """Joined ``round``; waiting for the group's other hosts."""
    RUNNING = "running"
    """This host's ranks run in ``round``."""
    STOPPING = "stopping"
    """This host's ranks are being stopped; the next round follows."""
    ENDED = "ended"
    """The agent exits with ``exit_code``, saying ``reason``."""


class Kind(enum.Enum):
    WELCOME = "welcome"
    ADOPTED = "adopted"
    JOIN_TAKEN = "join-taken"
    JOIN_REFUSED = "join-refused"
    ROUND_COMPLETE = "round-complete"
    ROUND_ENDED = "round-ended"
    RANKS_FAILED = "ranks-failed"
    RANKS_FINISHED = "ranks-finished"
    RANKS_STOPPED = "ranks-stopped"
    GAVE_UP = "gave-up"
    RELEASED = "released"


@dataclasses.dataclass(frozen=True)
class Event:
    kind: Kind
    round: int = 0
    """The round the event is about (a push of an older round is stale)."""
    node_rank: int = -1
    store: str = ""
    reason: str = ""


class Do(enum.Enum):
    NOTHING = "nothing"
    JOIN = "join"
    """Open a fresh store on a free port and join ``state.round`` with its address."""
    REJOIN = "rejoin"
    """Send the join of ``state.round`` again, with the store already opened for it (the stream was opened again:
    the join may be lost; a fresh store would close the one the round may already use)."""
    START_RANKS = "start-ranks"
    """Start the local ranks: node rank ``state.node_rank``, store ``state.store``, restart count ``state.round``."""
    REPORT_FAILURE = "report-failure"
    """Tell the coordinator this host failed in ``state.round`` (it ends the round everywhere), and stop the ranks."""
    STOP_RANKS = "stop-ranks"
    """Stop the local ranks at once (another host failed, or the round ended)."""
    EXIT = "exit"
    """End the agent with ``state.exit_code`` and ``state.reason``."""


@dataclasses.dataclass(frozen=True)
class AgentRound:
    phase: Phase = Phase.JOINING
    round: int = 1
    first_round: int = 1
    """The round this host started in: ``max_restarts`` counts the rounds after it."""
    spare: bool = False
    node_rank: int = -1
    store: str = ""
    max_restarts: int = 3
    """Rounds after the first that the group may run."""
    exit_code: int = 0
    reason: str = ""
    ending: bool = False
    """Stopping the ranks to exit (the agent gave up), not to join the next round."""


def step(state: AgentRound, event: Event) -> tuple[AgentRound, Do]:
    """The next state and action after ``event``."""
    if state.phase is Phase.ENDED:
        return state, Do.NOTHING
    if event.kind is Kind.JOIN_REFUSED:
        return _ended(state, 2, f"the coordinator refused this host: {event.reason}"), Do.EXIT
    if event.kind is Kind.RELEASED and state.phase not in (Phase.RUNNING, Phase.STOPPING):
        return _ended(state, 0, event.reason), Do.EXIT
    if event.kind is Kind.GAVE_UP:
        why = f"gave up: {event.reason}"
        if state.phase in (Phase.RUNNING, Phase.STOPPING):  # its ranks first
            return dataclasses.replace(state, phase=Phase.STOPPING, exit_code=1, reason=why, ending=True), \
                Do.STOP_RANKS
        return _ended(state, 1, why), Do.EXIT
    if event.kind is Kind.WELCOME:
        return _welcome(state, event)
    if event.kind in (Kind.ROUND_COMPLETE, Kind.ROUND_ENDED) and event.round != state.round:
        return state, Do.NOTHING  # a push about a round this host is not in
    handler = _HANDLERS.get((state.phase, event.kind))
    return handler(state, event) if handler else (state, Do.NOTHING)


def _ended(state: AgentRound, code: int, reason: str) -> AgentRound:
    return dataclasses.replace(state, phase=Phase.ENDED, exit_code=code, reason=reason)


def _welcome(state: AgentRound, event: Event) -> tuple[AgentRound, Do]:
    """The coordinator (again, after a reconnect) names the group's round."""
    if state.phase is Phase.CONNECTING:
        if state.spare:
            return dataclasses.replace(state, phase=Phase.SPARE), Do.NOTHING
        first = max(event.round, 1)
        return dataclasses.replace(state, phase=Phase.JOINING, round=first, first_round=first), Do.JOIN
    if state.phase in (Phase.JOINING, Phase.GATHERING) and event.round == state.round:
        # The join may be lost with the stream (a coordinator that restarted): send it again, as it was.
        return dataclasses.replace(state, phase=Phase.JOINING), Do.REJOIN
    if state.phase in (Phase.JOINING, Phase.GATHERING) and event.round > state.round:
        return dataclasses.replace(state, phase=Phase.JOINING, round=event.round), Do.JOIN
    if state.phase is Phase.RUNNING and event.round > state.round:
        # The round ended while this host could not hear it.
        return dataclasses.replace(state, phase=Phase.STOPPING), Do.STOP_RANKS
    return state, Do.NOTHING


def _adopted(state: AgentRound, event: Event) -> tuple[AgentRound, Do]:
    first = max(event.round, 1)
    return dataclasses.replace(state, phase=Phase.JOINING, round=first, first_round=first, spare=False), Do.JOIN


def _taken(state: AgentRound, event: Event) -> tuple[AgentRound, Do]:
    # The coordinator counts the join for the group's round, which may be later than the one asked for.
    return dataclasses.replace(state, phase=Phase.GATHERING, round=max(event.round, state.round)), Do.NOTHING


def _complete(state: AgentRound, event: Event) -> tuple[AgentRound, Do]:
    running = dataclasses.replace(state, phase=Phase.RUNNING, node_rank=event.node_rank, store=event.store)
    return running, Do.START_RANKS


def _ended_while_gathering(state: AgentRound, event: Event) -> tuple[AgentRound, Do]:
    # The round ended before it completed (a host of it failed meanwhile): join the next.
    return _next_round(state)


def _ended_while_running(state: AgentRound, event: Event) -> tuple[AgentRound, Do]:
    return dataclasses.replace(state, phase=Phase.STOPPING), Do.STOP_RANKS


def _failed(state: AgentRound, event: Event) -> tuple[AgentRound, Do]:
    return dataclasses.replace(state, phase=Phase.STOPPING, reason=event.reason), Do.REPORT_FAILURE


def _finished(state: AgentRound, event: Event) -> tuple[AgentRound, Do]:
    return _ended(state, 0, event.reason or "every local rank exited 0"), Do.EXIT


def _stopped(state: AgentRound, event: Event) -> tuple[AgentRound, Do]:
    if state.ending:
        return _ended(state, state.exit_code, state.reason), Do.EXIT
    return _next_round(state)


def _next_round(state: AgentRound) -> tuple[AgentRound, Do]:
    following = state.round + 1
    if following - state.first_round > state.max_restarts:
        why = f"no restarts left (--max-restarts {state.max_restarts}: round {state.round} was the last)"
        return _ended(state, 1, f"{state.reason}; {why}" if state.reason else why), Do.EXIT
    return AgentRound(Phase.JOINING, following, first_round=state.first_round, max_restarts=state.max_restarts,
                      reason=state.reason), Do.JOIN


_HANDLERS = {
    (Phase.SPARE, Kind.ADOPTED): _adopted,
    (Phase.JOINING, Kind.JOIN_TAKEN): _taken,
    (Phase.JOINING, Kind.ROUND_COMPLETE): _complete,  # the answer and the push crossed
    (Phase.JOINING, Kind.ROUND_ENDED): _ended_while_gathering,
    (Phase.GATHERING, Kind.ROUND_COMPLETE): _complete,
    (Phase.GATHERING, Kind.ROUND_ENDED): _ended_while_gathering,
    (Phase.RUNNING, Kind.ROUND_ENDED): _ended_while_running,
    (Phase.RUNNING, Kind.RANKS_FAILED): _failed,
    (Phase.RUNNING, Kind.RANKS_FINISHED): _finished,
    (Phase.STOPPING, Kind.RANKS_STOPPED): _stopped,
    (Phase.STOPPING, Kind.RANKS_FAILED): lambda state, event: (state, Do.NOTHING),  # the rest of the stop
}
