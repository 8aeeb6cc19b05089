"""Catch-up of a returning replica, with real processes: a real coordinator,
replicas training over gloo, the catch-up servers and clients over HTTP.

The replicas train "forever" (a large --steps) and are drained at the end, so
no test depends on how fast this machine trains. The transfer is slowed down
with the sources' rate limit where a test must act in the middle of it.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from fthsdp.agent.training.transport import reconfigure
from fthsdp.client import CoordinatorClient
from fthsdp.coordinator.decisions.status_view import STATE_NAMES
from tests.harness.ending import end_started
from tests.harness.fixtures import FOREVER
from tests.harness.processes import CROSS_REPLICA_GROUPS, AgentProcess
from tests.harness.replicas import SLOW, assert_same_state_after_rejoin, members, status_of, wait_transfer_started
from tests.harness.waiting import wait_until


def common_checksum_steps(a, b, after: int) -> list[int]:
    """Steps after ``after`` at which both replicas printed a fresh checksum."""
    return [s for s in sorted(set(a.steps) & set(b.steps)) if s > after and a.steps[s]["checksum"] and s % 10 == 0]


def test_restarted_replica_catches_up_while_the_others_keep_training(cluster):
    """The issue's acceptance path: kill a replica's rank; its agent restarts
    it; status shows it catching up from a peer, then healthy, while the
    others' steps advance; its state then equals theirs, step for step."""
    coordinator, agent, _ = cluster
    c = coordinator("--min-replicas", "2")
    # Checksums every 10 steps (the default) so that the joiner's check uses
    # the checksum its source computes on request; the rate limit makes the
    # transfer last about a second, long enough to be seen in status.
    env = {"FTHSDP_CHECKSUM_EVERY": "10", "FTHSDP_CATCH_UP_MAX_RATE": str(6 << 20)}
    a0, a1, a2 = (agent(c, i, 3, env=env) for i in range(3))
    first = a2.read_until(lambda line: "admitted" in line)
    a0.read_until(lambda line: line.get("step", 0) >= 20)
    os.kill(first["pid"], signal.SIGKILL)

    polls: list[tuple[str, int]] = []  # (r2's state, r0's step) at each status poll
    with CoordinatorClient([c.address]) as client:
        def back_in_quorum() -> bool:
            status, r2 = status_of(client, "r2")
            r0 = {r.replica_id: r for r in status.replicas}["r0"]
            state = STATE_NAMES[r2.state]
            polls.append((state, r0.step))
            return (r2.restart_count >= 1 and state == "healthy"
                    and "r2" in {m.replica_id for m in status.quorum.members})

        wait_until(back_in_quorum, 60, interval=0.01, message="r2 back in the quorum")
    states = [s for i, (s, _) in enumerate(polls) if i == 0 or polls[i - 1][0] != s]
    assert "catching-up" in states, states
    assert states.index("catching-up") < len(states) - 1 and states[-1] == "healthy", states
    r0_steps_while_catching_up = [step for s, step in polls if s == "catching-up"]
    assert max(r0_steps_while_catching_up) > min(r0_steps_while_catching_up), f"the others stalled: {polls}"

    rejoined = a2.read_until(lambda line: "admitted" in line and line["pid"] != first["pid"])
    first_new = a2.read_until(lambda line: "step" in line and line["t"] > rejoined["t"])["step"]
    # The members took the joiner in at a step boundary they agreed on: no
    # collective of theirs was abandoned for it (a failure's quorum abandons one).
    joined_in = a2.steps[first_new]["quorum"]
    for member in (a0, a1):
        line = member.read_until(lambda line: line.get("quorum", 0) >= joined_in)
        assert line["quorum"] == joined_in and line["abandoned"] == 0, line
    a2.read_until(lambda line: line.get("step", 0) >= first_new + 40)
    a0.read_until(lambda line: line.get("step", 0) >= first_new + 40)
    steps = common_checksum_steps(a0, a2, after=first_new)
    assert len(steps) >= 3, f"too few common steps after the rejoin: {steps}"
    for s in steps:
        assert a2.steps[s]["checksum"] == a0.steps[s]["checksum"], f"r2 differs from r0 at step {s}"
    logs = [member.log_path.read_text(errors="replace") for member in (a0, a1)]
    if CROSS_REPLICA_GROUPS == "per-quorum" or not reconfigure.supported():
        # A new group per quorum (torch 2.13, or chosen: make test-per-quorum).
        for text in logs:
            assert "a new group per quorum" in text and "reconfigured in place" not in text, text[-3000:]
    else:
        # torch >= 2.14: each survivor met every quorum (the start's, the
        # kill's, the join's) by reconfiguring a group it had, in place, and
        # the join in the group it trained in (the kill's quorum may meet in
        # a second one if a collective it abandoned had not failed yet:
        # transport/reconfigure.py; tests/test_reconfigure.py shows the one group).
        for text in logs:
            met = re.findall(r"quorum (\d+): the cross-replica group \(#(\d+)\) reconfigured in place", text)
            assert joined_in in {int(q) for q, _ in met} and len(met) >= 3, met
            groups = dict((int(q), n) for q, n in met)
            assert groups[joined_in] == groups[max(q for q in groups if q < joined_in)], met








def start_and_lose_one(coordinator, worker, n: int, min_replicas: int, lose: tuple[int, ...] = (2,)):
    c = coordinator("--min-replicas", str(min_replicas))
    workers = [worker(c, i, n, env=SLOW) for i in range(n)]
    workers[0].read_until(lambda line: line.get("step", 0) >= 10)
    for i in lose:
        workers[i].kill()
    with CoordinatorClient([c.address]) as client:
        wait_until(lambda: members(client) == {f"r{i}" for i in range(n) if i not in lose}, 20,
                   message="the lost replicas taken out")
    return c, workers




@pytest.mark.parametrize("transport", ["http", "distributed"])
def test_source_killed_mid_transfer_the_joiner_finishes_from_another(cluster, transport):
    """Over HTTP, or over a two-rank gloo group (fthsdp/agent/training/catchup/group.py),
    which breaks off when the source dies; the joiner then tries HTTP on the
    same dead source, gives it up, and copies the other one."""
    coordinator, _, worker = cluster
    c, (r0, r1, _) = start_and_lose_one(coordinator, worker, 3, min_replicas=1)
    joiner = worker(c, 2, 1, env={**SLOW, "FTHSDP_CATCH_UP_TRANSPORT": transport}, name="r2-joiner")
    with CoordinatorClient([c.address]) as client:
        source = wait_transfer_started(client, "r2")
        victim, other = (r0, r1) if source == "r0" else (r1, r0)
        victim.kill()
        sources = set()

        def rejoined() -> bool:
            _, r = status_of(client, "r2")
            sources.add(r.catch_up_source)
            return STATE_NAMES[r.state] == "healthy" and members(client) == {other.replica_id, "r2"}

        wait_until(rejoined, 60, interval=0.01, message="r2 caught up from the other source and rejoined")
    assert other.replica_id in sources, sources
    admitted = joiner.read_until(lambda line: "admitted" in line)
    assert admitted["catch_up"]["transport"] == {"http": "http", "distributed": "distributed (gloo)"}[transport]
    assert_same_state_after_rejoin(joiner, other)


def test_joiner_killed_mid_transfer_nobody_notices(cluster):
    coordinator, _, worker = cluster
    c, (r0, r1, _) = start_and_lose_one(coordinator, worker, 3, min_replicas=2)
    with CoordinatorClient([c.address]) as client:
        quorum_id = client.status().quorum.id
        joiner = worker(c, 2, 1, env=SLOW, name="r2-first")
        wait_transfer_started(client, "r2")
        joiner.kill()
        killed_at = time.monotonic()  # the lines' "t" is on the same (system-wide) clock
        # The members go on committing steps in the same quorum.
        for r in (r0, r1):
            first = r.read_until(lambda line: line.get("t", 0) > killed_at)["step"]
            r.read_until(lambda line, first=first: line.get("step", 0) >= first + 50)
            assert {r.steps[s]["quorum"] for s in range(first, first + 50)} == {quorum_id}
        assert client.status().quorum.id == quorum_id
        # The source is not stuck with the dead joiner: the next one catches up.
        again = worker(c, 2, 1, name="r2-second")
        wait_until(lambda: members(client) == {"r0", "r1", "r2"}, 60, message="the second joiner rejoined")
    assert_same_state_after_rejoin(again, r0)


def test_two_replicas_join_at_once_from_different_sources(cluster):
    coordinator, _, worker = cluster
    c, (r0, r1, _, _) = start_and_lose_one(coordinator, worker, 4, min_replicas=2, lose=(2, 3))
    joiners = [worker(c, i, 1, env=SLOW, name=f"r{i}-joiner") for i in (2, 3)]
    with CoordinatorClient([c.address]) as client:
        sources = {rid: wait_transfer_started(client, rid) for rid in ("r2", "r3")}
        wait_until(lambda: members(client) == {"r0", "r1", "r2", "r3"}, 60, message="both joiners admitted")
    assert set(sources.values()) == {"r0", "r1"}, f"the coordinator did not spread the sources: {sources}"
    for j in joiners:
        assert_same_state_after_rejoin(j, r0)


def test_joiner_whose_replay_differs_fails_naming_the_part(cluster):
    """A replay that does not reproduce the members' state is deterministic
    (the same loop replays the same way from any source): the joiner fails at
    once with an error naming the part that differs, never three refusals,
    and the members train on."""
    coordinator, _, worker = cluster
    c, (r0, _, _) = start_and_lose_one(coordinator, worker, 3, min_replicas=2)
    joiner = worker(c, 2, 1, "--corrupt-first-replay", name="r2-corrupt")
    wait_until(lambda: joiner.proc.poll() is not None, 60, message="the joiner whose replay differs exits")
    assert joiner.proc.returncode != 0
    text = joiner.log_path.read_text()
    assert "CatchUpFailed" in text and "differs from the source's in model" in text, text[-2000:]
    assert "refused" not in text
    step = r0.read_until(lambda line: "step" in line)["step"]
    r0.read_until(lambda line: line.get("step", 0) >= step + 3, timeout=30)  # the members go on


def test_fsdp2_replica_group_catches_up_shard_by_shard(cluster, tmp_path):
    """Two replica groups of 2 FSDP2 ranks; a rank of one dies, its agent
    restarts the group, and each rank pulls its own shard and log."""
    coordinator, _, _ = cluster
    c = coordinator("--min-replicas", "1")
    groups = []
    for k in range(2):
        a = AgentProcess(tmp_path, c.address, f"r{k}", k, 2, "--steps", FOREVER, "--hidden", "256", "--wait-for", "2",
                         agent_args=("--nproc", "2"), worker="tests.hsdp_worker",
                         env={"FTHSDP_CATCH_UP_MAX_RATE": str(1 << 20)}).start()
        groups.append(a)
    a0, a1 = groups
    pids = {}
    a1.read_until(lambda line: "rank" in line and pids.update({line["rank"]: line["pid"]}) is None and len(pids) == 2)
    rank1 = {"pid": pids[1]}
    a0.read_until(lambda line: line.get("step", 0) >= 10)
    os.kill(rank1["pid"], signal.SIGKILL)
    try:
        with CoordinatorClient([c.address]) as client:
            states = []

            def rejoined() -> bool:
                status, r1 = status_of(client, "r1")
                states.append(STATE_NAMES[r1.state])
                return r1.restart_count >= 1 and states[-1] == "healthy" and members(client) == {"r0", "r1"}

            wait_until(rejoined, 90, interval=0.01, message="r1's group restarted, caught up and rejoined")
        assert "catching-up" in states
        # Past the old incarnation's lines: the restarted rank 0 announces itself.
        a1.read_until(lambda line: line.get("rank") == 0 and line["pid"] != pids[0], timeout=30)
        assert_same_state_after_rejoin(a1, a0)
    finally:
        end_started()  # everything it started, killed at once (tests/harness/ending.py)


def test_warm_standby_takes_over_and_catches_up(cluster):
    """With --standby the agent keeps the next incarnation waiting inside
    Manager.from_env; a failure activates it (no cold start) and the next
    standby is started; draining the agent retires the standby."""
    coordinator, agent, _ = cluster
    c = coordinator("--min-replicas", "2")
    a0, _, a2 = (agent(c, i, 3, agent_args=("--standby", "--standby-delay", "1s") if i == 2 else ()) for i in range(3))

    def standby_pids() -> list[int]:
        return [int(line.rsplit("pids ", 1)[1]) for line in a2.log_path.read_text().splitlines()
                if "warm standby ready to start: pids" in line]

    first = a2.read_until(lambda line: "admitted" in line)
    wait_until(lambda: len(standby_pids()) == 1, 30, message="the first standby started")
    waiting = standby_pids()[0]
    a0.read_until(lambda line: line.get("step", 0) >= 20)
    os.kill(first["pid"], signal.SIGKILL)
    rejoined = a2.read_until(lambda line: "admitted" in line and line["pid"] != first["pid"])
    assert rejoined["pid"] == waiting, "the restart did not use the warm standby"
    wait_until(lambda: len(standby_pids()) == 2, 30, message="the next standby started")
    assert_same_state_after_rejoin(a2, a0)
    a2.signal(signal.SIGTERM)
    assert a2.proc.wait(timeout=30) == 0
    next_standby = standby_pids()[1]
    wait_until(lambda: not os.path.exists(f"/proc/{next_standby}") or
               open(f"/proc/{next_standby}/stat").read().split()[2] == "Z", 10, message="the standby retired")

