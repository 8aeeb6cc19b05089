"""One host's side of its group's rounds (fthsdp/agent/node/group_round.py),
table-driven: every (state, event) the agent meets, and whole runs of them."""

from __future__ import annotations

import dataclasses

import pytest

from fthsdp.agent.node.group_round import AgentRound, Do, Event, Kind, Phase, step

JOINING = AgentRound(Phase.JOINING, 1)
GATHERING = AgentRound(Phase.GATHERING, 1)
RUNNING = AgentRound(Phase.RUNNING, 1, node_rank=1, store="h0:7000")
STOPPING = AgentRound(Phase.STOPPING, 1, node_rank=1, store="h0:7000")


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    state: AgentRound
    event: Event
    phase: Phase
    do: Do
    round: int = 1
    exit_code: int = 0
    says: str = ""


CASES = [
    Case("the join is taken: it gathers", JOINING, Event(Kind.JOIN_TAKEN, 1), Phase.GATHERING, Do.NOTHING),
    Case("the round completes: the ranks start with its rank and store",
         GATHERING, Event(Kind.ROUND_COMPLETE, 1, node_rank=1, store="h0:7000"), Phase.RUNNING, Do.START_RANKS),
    Case("the answer and the push crossed", JOINING, Event(Kind.ROUND_COMPLETE, 1, 0, "h0:7000"),
         Phase.RUNNING, Do.START_RANKS),
    Case("a completion of another round is not this host's", GATHERING, Event(Kind.ROUND_COMPLETE, 2, 0, "x:1"),
         Phase.GATHERING, Do.NOTHING),
    Case("a stale end of an earlier round is ignored", dataclasses.replace(RUNNING, round=3),
         Event(Kind.ROUND_ENDED, 2), Phase.RUNNING, Do.NOTHING, round=3),
    Case("another host failed: the ranks stop at once", RUNNING, Event(Kind.ROUND_ENDED, 1), Phase.STOPPING,
         Do.STOP_RANKS),
    Case("the round ended before it completed: join the next", GATHERING, Event(Kind.ROUND_ENDED, 1),
         Phase.JOINING, Do.JOIN, round=2),
    Case("a local rank failed: report it (the coordinator ends the round everywhere)",
         RUNNING, Event(Kind.RANKS_FAILED, reason="local rank 0 exited with -9"), Phase.STOPPING,
         Do.REPORT_FAILURE, says="local rank 0 exited with -9"),
    Case("the ranks stopped: join the next round", STOPPING, Event(Kind.RANKS_STOPPED), Phase.JOINING, Do.JOIN,
         round=2),
    Case("out of rounds: the agent ends, saying why", dataclasses.replace(STOPPING, round=4, max_restarts=3),
         Event(Kind.RANKS_STOPPED), Phase.ENDED, Do.EXIT, round=4, exit_code=1,
         says="no restarts left (--max-restarts 3: round 4 was the last)"),
    Case("every local rank exited 0: done", RUNNING, Event(Kind.RANKS_FINISHED), Phase.ENDED, Do.EXIT),
    Case("a refused join ends the agent with a usage error", JOINING,
         Event(Kind.JOIN_REFUSED, reason="--nnodes 3, but group r1's other hosts said --nnodes 2"),
         Phase.ENDED, Do.EXIT, exit_code=2, says="the coordinator refused this host: --nnodes 3"),
    Case("gave up while gathering: exit at once", GATHERING, Event(Kind.GAVE_UP, reason="no spare"),
         Phase.ENDED, Do.EXIT, exit_code=1, says="gave up: no spare"),
    Case("gave up while running: the ranks stop first", RUNNING, Event(Kind.GAVE_UP, reason="job cancelled"),
         Phase.STOPPING, Do.STOP_RANKS, exit_code=1, says="gave up: job cancelled"),
    Case("a second rank's failure while stopping changes nothing", STOPPING, Event(Kind.RANKS_FAILED),
         Phase.STOPPING, Do.NOTHING),
    Case("a spare released at the job's end exits 0, saying why", AgentRound(Phase.SPARE, 0, spare=True),
         Event(Kind.RELEASED, reason="job finished at step 300"), Phase.ENDED, Do.EXIT, round=0,
         says="job finished at step 300"),
    Case("a host whose place a spare took exits 0", AgentRound(Phase.CONNECTING, 0),
         Event(Kind.RELEASED, reason="spare s took this host's place"), Phase.ENDED, Do.EXIT, round=0,
         says="spare s took"),
    Case("the welcome names the group's round: join it", AgentRound(Phase.CONNECTING, 0),
         Event(Kind.WELCOME, 4), Phase.JOINING, Do.JOIN, round=4),
    Case("a spare's welcome: it waits", AgentRound(Phase.CONNECTING, 0, spare=True), Event(Kind.WELCOME, 0),
         Phase.SPARE, Do.NOTHING, round=0),
    Case("a spare adopted into round 3 joins it", AgentRound(Phase.SPARE, 0, spare=True), Event(Kind.ADOPTED, 3),
         Phase.JOINING, Do.JOIN, round=3),
    Case("the join counted for a later round of the group", JOINING, Event(Kind.JOIN_TAKEN, 3), Phase.GATHERING,
         Do.NOTHING, round=3),
    Case("a welcome after a reconnect names a later round: the round ended unheard", RUNNING, Event(Kind.WELCOME, 2),
         Phase.STOPPING, Do.STOP_RANKS),
    Case("a welcome after a reconnect while gathering: the same join again (it may be lost)", GATHERING,
         Event(Kind.WELCOME, 1), Phase.JOINING, Do.REJOIN),
    Case("a welcome naming a later round while gathering: join that one", GATHERING, Event(Kind.WELCOME, 3),
         Phase.JOINING, Do.JOIN, round=3),
    Case("nothing moves an ended agent", AgentRound(Phase.ENDED, 2, exit_code=1, reason="x"),
         Event(Kind.ROUND_COMPLETE, 2, 0, "h:1"), Phase.ENDED, Do.NOTHING, round=2, exit_code=1),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_step(case: Case):
    state, do = step(case.state, case.event)
    assert (state.phase, do, state.round, state.exit_code) == (case.phase, case.do, case.round, case.exit_code), state
    assert case.says in state.reason
    if do is Do.START_RANKS:
        assert (state.node_rank, state.store) == (case.event.node_rank, case.event.store)
    if do is Do.JOIN:
        assert (state.node_rank, state.store) == (-1, ""), "a new round starts with no rank and no store"


def run(events: list[Event]) -> list[tuple[Phase, Do, int]]:
    state, out = AgentRound(max_restarts=1), []
    for event in events:
        state, do = step(state, event)
        out.append((state.phase, do, state.round))
    return out


def test_a_failure_then_a_second_round_then_success():
    assert run([
        Event(Kind.JOIN_TAKEN, 1), Event(Kind.ROUND_COMPLETE, 1, 0, "h0:1"),
        Event(Kind.ROUND_ENDED, 1), Event(Kind.RANKS_STOPPED),
        Event(Kind.JOIN_TAKEN, 2), Event(Kind.ROUND_COMPLETE, 2, 0, "h0:2"), Event(Kind.RANKS_FINISHED),
    ]) == [
        (Phase.GATHERING, Do.NOTHING, 1), (Phase.RUNNING, Do.START_RANKS, 1),
        (Phase.STOPPING, Do.STOP_RANKS, 1), (Phase.JOINING, Do.JOIN, 2),
        (Phase.GATHERING, Do.NOTHING, 2), (Phase.RUNNING, Do.START_RANKS, 2), (Phase.ENDED, Do.EXIT, 2),
    ]


def test_giving_up_while_running_exits_once_the_ranks_stopped():
    state, _ = step(RUNNING, Event(Kind.GAVE_UP, reason="rendezvous timeout"))
    state, do = step(state, Event(Kind.RANKS_STOPPED))
    assert (state.phase, do, state.exit_code, state.reason) == (Phase.ENDED, Do.EXIT, 1, "gave up: rendezvous timeout")
