"""The host table does work only on events and due deadlines (issue 49),
in-process on a fake clock: a tick with nothing due looks at no host; an
event looks at its own group's hosts, however many other groups there are;
a spare that comes is offered to the groups that wait for one; a host whose
heartbeats stop, a spare wait and a rendezvous timeout each fall due at
the right tick with no event; the job finishing and reopening reach the
hosts once each. ``HostTable.visits`` counts the hosts looked at."""

from __future__ import annotations

import pytest

from fthsdp.coordinator.hosts import rounds as host_rounds
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.hosts import TIMEOUT, Hosts

NNODES = 4
HEARTBEAT_TIMEOUT = 5.0


def fleet(groups: int, spare_wait: float = 10.0, rendezvous_timeout: float = 600.0, now: float = 0.0) -> Hosts:
    """``groups`` groups of 4 hosts, every round 1 complete and running."""
    h = Hosts(spare_wait=spare_wait, rendezvous_timeout=rendezvous_timeout)
    for g in range(groups):
        for k in range(NNODES):
            h.hello(f"g{g}-{k}", group=f"g{g}", nnodes=NNODES, now=now)
        for k in range(NNODES):
            h.join(f"g{g}-{k}", 1, now)
        assert h.table.groups[f"g{g}"].current.complete
    h.take()
    return h


def visits(h: Hosts, action, *args) -> int:
    """The hosts looked at by ``action(*args)``."""
    before = h.table.visits
    action(*args)
    return h.table.visits - before


def decided(monkeypatch) -> list[str]:
    """The groups decided from now on, one entry per decision."""
    names: list[str] = []
    decide = host_rounds.decide

    def counting(group, nnodes, current, previous, hosts, now, rules):
        names.append(group)
        return decide(group, nnodes, current, previous, hosts, now, rules)

    monkeypatch.setattr(host_rounds, "decide", counting)
    return names


def test_a_tick_with_nothing_due_looks_at_no_host(monkeypatch):
    h = fleet(200)
    groups = decided(monkeypatch)
    for now in (0.1, 1.0, 4.9, 5.0):  # every host heard at 0; lost only once silent past (not at) the timeout
        assert visits(h, h.table.tick, now, HEARTBEAT_TIMEOUT) == 0
    for k in range(NNODES):
        assert visits(h, h.table.beat, f"g7-{k}", 3.0) == 0, "a heartbeat only notes the time"
    assert groups == [] and all(not box for box in h.pushed.values())


def act(h: Hosts, event: str) -> None:
    """One event of a host of g3."""
    if event == "failure":
        h.table.failure("g3-1", 1, "local rank 0 exited", 1.0)
    elif event == "closed":
        h.table.closed("g3-1", h.connection["g3-1"], 1.0)
    elif event == "hello again":
        h.table.closed("g3-1", h.connection["g3-1"], 1.0)
        h.hello("g3-1", group="g3", nnodes=NNODES, now=1.5)
    else:
        h.join("g3-0", 2, 1.5)


@pytest.mark.parametrize("event", ["failure", "closed", "hello again", "join"])
def test_an_event_looks_at_its_groups_hosts_whatever_the_number_of_other_groups(event):
    cost = {}
    for groups in (10, 200):
        h = fleet(groups)
        if event == "join":
            h.table.failure("g3-1", 1, "local rank 0 exited", 1.0)  # round 2 gathers
        cost[groups] = visits(h, act, h, event)
        assert visits(h, h.table.tick, 2.0, HEARTBEAT_TIMEOUT) == 0, "nothing due after it"
        assert [host for host, box in h.pushed.items() if box] and all(
            host.startswith("g3-") for host, box in h.pushed.items() if box), "only g3's hosts hear of it"
    assert cost[10] == cost[200] and 0 < cost[200] <= 6 * NNODES, cost


def test_a_spare_that_comes_is_offered_to_the_groups_waiting_for_one_only():
    cost = {}
    for groups in (10, 200):
        h = fleet(groups, spare_wait=1.0)
        assert visits(h, h.hello, "s0", "", 0.5, NNODES) == 0, "no group waits for one"
        h.table.closed("s0", h.connection["s0"], 0.6)
        h.table.closed("g5-2", h.connection["g5-2"], 1.0)
        for k in (0, 1, 3):
            h.join(f"g5-{k}", 2, 1.5)
        assert "s0" not in h.table.hosts and h.table.spares() == []
        h.table.tick(2.5, TIMEOUT)  # g5-2's spare wait is over: g5 waits for a spare
        assert "host g5-2 lost 2s ago, no spare" in h.table.groups["g5"].reason
        cost[groups] = visits(h, h.hello, "s", "", 3.0, NNODES)
        kind, adopted = h.last("s")
        assert kind == "adopted" and adopted.replica_id == "g5" and h.table.hosts["s"].group == "g5"
    assert cost[10] == cost[200] and cost[200] <= 3 * (NNODES + 1), cost


def test_a_spare_goes_to_the_group_that_came_first_as_a_sweep_over_the_groups_gave_it():
    h = fleet(3, spare_wait=1.0)
    for g in (2, 1):  # g2 loses its host first
        h.table.closed(f"g{g}-0", h.connection[f"g{g}-0"], 1.0 + (2 - g) * 0.1)
    h.hello("s", group="", nnodes=NNODES, now=1.2)
    h.table.tick(5.0, TIMEOUT)  # both waits are over at this tick
    assert h.table.hosts["s"].group == "g1"


def test_a_host_whose_heartbeats_stop_is_lost_at_the_first_tick_past_the_timeout_and_only_its_group_decided(
        monkeypatch):
    h = fleet(50)
    groups = decided(monkeypatch)
    ended_at = None
    for step in range(1, 17):
        now = step * 0.5
        if now <= 2.0 or now == int(now):
            for host in h.table.hosts:
                if host != "g9-3" or now <= 2.0:
                    h.table.beat(host, now)
        h.table.tick(now, HEARTBEAT_TIMEOUT)
        if ended_at is None and h.last("g9-0", "ended") is not None:
            ended_at = now
    assert ended_at == 7.5, "last heard at 2.0: silent past 5s first at the tick of 7.5 (7.0 is exactly 5s)"
    assert "node rank 3 (g9-3): host lost" in h.last("g9-0", "ended")[1].reason
    assert set(groups) == {"g9"} and h.last("g9-3") == ("closed", None)
    assert all(not box for host, box in h.pushed.items() if not host.startswith("g9-"))


def test_a_heartbeat_timeout_that_changes_between_ticks_is_the_one_each_tick_checks():
    h = fleet(1)
    for k in (0, 1, 2):
        h.table.beat(f"g0-{k}", 3.0)
    h.table.tick(3.1, 10.0)  # g0-3 silent 3.1s: not past a 10s timeout
    assert h.last("g0-0") is None
    h.table.tick(3.2, 3.0)  # the timeout is shorter now (less lag): past it
    assert h.last("g0-3") == ("closed", None) and h.last("g0-0", "ended") is not None
    assert h.table.hosts["g0-0"].lost_since is None, "heard at 3.0: not silent past 3s at 3.2"


def test_the_spare_wait_falls_due_with_no_event():
    h = fleet(100, spare_wait=10.0)
    h.hello("s", group="", nnodes=NNODES, now=0.5)
    h.table.closed("g4-1", h.connection["g4-1"], 1.0)
    for k in (0, 2, 3):
        h.join(f"g4-{k}", 2, 1.5)
    for now in (2.0, 6.0, 10.9):
        assert visits(h, h.table.tick, now, TIMEOUT) == 0
    assert h.last("s") == ("welcome", h.last("s")[1])
    cost = visits(h, h.table.tick, 11.0, TIMEOUT)  # lost at 1.0: its place is a spare's from 11.0
    kind, adopted = h.last("s")
    assert kind == "adopted" and (adopted.replica_id, adopted.round) == ("g4", 2)
    assert list(adopted.hosts) == ["g4-0", "s", "g4-2", "g4-3"] and "g4-1" not in h.table.hosts
    assert 0 < cost <= 4 * (NNODES + 1), cost


def test_the_rendezvous_timeout_falls_due_with_no_event():
    h = fleet(100, rendezvous_timeout=30.0)
    h.hello("x-0", group="x", nnodes=2, now=10.0)  # round 1 of x opens at 10.0
    h.hello("x-1", group="x", nnodes=2, now=10.0)
    h.join("x-0", 1, 10.5)
    for now in (11.0, 25.0, 39.9):
        assert visits(h, h.table.tick, now, TIMEOUT) == 0
    assert h.last("x-0") == ("joined", 1)
    h.table.tick(40.0, TIMEOUT)
    for host in ("x-0", "x-1"):
        kind, why = h.last(host)
        assert kind == "gave_up" and why.startswith("round 1 did not complete in 30s: waiting for host x-1 not joined")
    assert h.table.group_hosts("x") == [] and all(not box for host, box in h.pushed.items() if host.startswith("g"))


def test_a_group_learned_after_a_restart_is_decided_alone_a_heartbeat_timeout_after_its_first_hello():
    h = Hosts()
    h.hello("a", now=0.0, round=3, node_rank=0, store="a:7003", hosts=["a", "b"], hosts_round=3)
    group = h.table.groups["r1"]
    h.table.beat("a", 4.0)
    h.table.tick(5.0, HEARTBEAT_TIMEOUT)
    assert group.learning_since == 0.0 and h.last("a", "ended") is None, "b may be on its way back"
    h.table.tick(5.1, HEARTBEAT_TIMEOUT)
    assert group.learning_since is None and "node rank 1 (b): host lost" in h.last("a", "ended")[1].reason


def test_the_job_finishing_and_reopening_each_reach_the_hosts_once():
    h = fleet(2)
    h.hello("s", group="", nnodes=NNODES)
    h.table.finish("job finished at step 300")
    h.table.finish("job finished at step 300")
    assert [kind for kind, _ in h.pushed["s"]] == ["welcome", "released"] and h.table.spares() == []
    assert all(not box for host, box in h.pushed.items() if host != "s"), "the groups' hosts finish on their own"
    h.table.reopen()
    h.hello("t", group="", nnodes=NNODES, now=1.0)
    assert h.last("t") == ("welcome", pb.HostWelcome(host_id="t", round=0)) and h.table.spares() == ["t"]
