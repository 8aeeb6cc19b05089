"""The host table after a coordinator restart and against hellos that claim
too much (issue 48), in-process on a fake clock: a host lost while the
coordinator was down is replaced by a spare, an adoption survives a
reconnect, a replaced host never pushes out its replacement, a group's
shape is its first complete round's, two agents cannot share a host id, and
a forged identity or a round number that jumps changes nothing."""

from __future__ import annotations

import logging
import re

import pytest

from fthsdp.coordinator.decisions.status_view import status_table
from fthsdp.coordinator.hosts import rounds as host_rounds
from fthsdp.coordinator.hosts.rendezvous import JoinRefused
from fthsdp.coordinator.hosts.status import group_statuses
from fthsdp.core.auth import PermissionDenied
from fthsdp.core.errors import OutOfRange
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.hosts import TIMEOUT, Hosts, running

HEARTBEAT_TIMEOUT = 5.0


def beat(h: Hosts, now: float, *hosts: str) -> None:
    for host in hosts:
        h.table.beat(host, now)
    h.table.tick(now, HEARTBEAT_TIMEOUT)


def kinds(h: Hosts, host: str) -> list[str]:
    return [kind for kind, _ in h.pushed[host]]


def adopt_spare_for_b(h: Hosts) -> None:
    """Round 1 runs on a and b; b is lost; spare s takes its node rank in round 2, which completes."""
    running(h)
    h.hello("s", group="")
    h.table.closed("b", h.connection["b"], 0.0)
    h.join("a", 2, 0.5)
    h.table.tick(2.0, TIMEOUT)
    h.join("s", 2, 2.5)
    assert h.table.groups["r1"].current.ranks == ("a", "s")


# ----- 1. a host lost while the coordinator was down ----------------------------------------------------------


def test_after_a_restart_a_host_lost_meanwhile_is_known_from_the_others_and_a_spare_takes_its_place():
    h = Hosts(spare_wait=10.0)  # a coordinator that just started: nothing known
    h.hello("a", now=0.0, round=3, node_rank=0, store="a:7003", hosts=["a", "b"], hosts_round=3)
    h.hello("s", group="", now=0.2)
    group = h.table.groups["r1"]
    assert (group.current.number, group.current.ranks) == (3, ("a", "b")), "the running round goes on as it was"
    assert "ended" not in kinds(h, "a")
    text = status_table(pb.StatusResponse(job="job", groups=group_statuses(h.table, 1.0), spares=h.table.spares()))
    assert "node rank 1 b (reconnecting)" in text, text

    beat(h, 4.0, "a", "s")
    assert "ended" not in kinds(h, "a"), "b may be on its way back within the heartbeat timeout"
    beat(h, 5.5, "a", "s")  # b never came back: lost, like any host whose heartbeats stopped
    kind, ended = h.last("a")
    assert kind == "ended" and ended.round == 3 and "node rank 1 (b): host lost" in ended.reason
    h.join("a", 4, 6.0)
    assert "none known" not in group.reason and "waiting for node rank 1: host b lost" in group.reason
    beat(h, 15.0, "a", "s")
    assert h.last("s", "adopted") is None, "the lost host may come back within the spare wait"
    beat(h, 15.6, "a", "s")
    adopted = h.last("s", "adopted")[1]
    assert (adopted.replica_id, adopted.round, list(adopted.hosts)) == ("r1", 4, ["a", "s"])
    assert list(h.last("a", "roster")[1].hosts) == ["a", "s"], "the group's other hosts are told the new ranks"
    h.join("s", 4, 16.0)
    complete = h.last("s", "complete")[1]
    assert (complete.round, complete.node_rank, list(complete.hosts)) == (4, 1, ["a", "s"])


def test_after_a_takeover_no_host_is_lost_for_its_silence_before_the_grace_ends():
    """A new leader holds every host's silence for the replicas' reconnect grace (HostTable.hold): the hosts
    of thousands of agents come back over many seconds. A host back and silent, and one named only by the
    others' hellos, are lost once the grace ends, not a heartbeat timeout after; a stream that closes is a
    loss at once, whatever the grace."""
    h = Hosts(spare_wait=10.0)
    h.table.hold(20.0)
    h.hello("a", now=0.0, round=3, node_rank=0, store="a:7003", hosts=["a", "b"], hosts_round=3)
    h.hello("c", group="r2", now=0.5, round=2, node_rank=0, store="c:7002", hosts=["c", "d"], hosts_round=2)
    h.hello("d", group="r2", now=0.6, round=2, node_rank=1, store="d:7002", hosts=["c", "d"], hosts_round=2)
    beat(h, 12.0, "c")  # a and d silent, b not back: all past the heartbeat timeout
    assert all("ended" not in kinds(h, host) for host in ("a", "c", "d")), "held: the grace runs"
    assert not h.table.hosts["d"].lost_since and h.table.groups["r1"].current.complete
    beat(h, 20.0, "a", "c")  # the grace is over: b never came back, d stopped
    assert h.table.hosts["d"].lost_since == 20.0
    kind, ended = h.last("a")
    assert kind == "ended" and "node rank 1 (b): host lost" in ended.reason
    assert h.last("c")[0] == "ended"
    h2 = Hosts()
    h2.table.hold(20.0)
    running(h2, 0.0)
    h2.table.closed("b", h2.connection["b"], 1.0)
    assert h2.table.hosts["b"].lost_since == 1.0, "a closed stream is no silence: lost at once"


def test_after_a_restart_a_gathering_round_waits_for_the_hosts_named_and_a_spare_takes_a_lost_ones_place():
    h = Hosts(spare_wait=10.0)
    h.hello("a", now=0.0, round=4, hosts=["a", "b"], hosts_round=3)  # it gathers round 4; round 3 ran on a, b
    h.join("a", 4, 0.1)  # its join again, as it was
    h.hello("s", group="", now=0.2)
    assert "waiting for node rank 1: host b not joined yet" in h.table.groups["r1"].reason
    beat(h, 5.5, "a", "s")
    beat(h, 15.6, "a", "s")
    assert h.last("s", "adopted")[1].round == 4
    h.join("s", 4, 16.0)
    assert list(h.last("a", "complete")[1].hosts) == ["a", "s"]


# ----- 2. an adoption survives a reconnect --------------------------------------------------------------------


def test_a_spare_that_did_not_hear_its_adoption_says_hello_as_a_spare_and_is_adopted_again():
    h = Hosts(spare_wait=1.0)
    running(h)
    h.hello("s", group="")
    h.table.closed("b", h.connection["b"], 0.0)
    h.join("a", 2, 0.5)
    h.table.tick(2.0, TIMEOUT)
    assert h.last("s", "adopted") is not None
    h.table.closed("s", h.connection["s"], 2.1)  # the push was lost with its stream
    h.take()
    h.hello("s", group="", now=2.2)  # it is still a spare as far as it knows
    assert kinds(h, "s") == ["welcome", "adopted"]
    adopted = h.last("s", "adopted")[1]
    assert (adopted.replica_id, adopted.replica_rank, adopted.round, list(adopted.hosts)) == ("r1", 1, 2, ["a", "s"])
    assert h.table.spares() == [] and h.table.hosts["s"].group == "r1"
    h.join("s", 2, 2.5)
    assert h.last("s", "complete")[1].node_rank == 1 and h.last("a", "complete")[1].node_rank == 0


# ----- 3. a replaced host never pushes out its replacement ---------------------------------------------------


def test_a_replaced_host_back_before_the_live_ones_is_released_and_they_go_on():
    h = Hosts(spare_wait=1.0)
    adopt_spare_for_b(h)
    h.table.closed("a", h.connection["a"], 3.0)  # every stream drops at once (the coordinator's network blinked)
    h.table.closed("s", h.connection["s"], 3.0)
    h.hello("b", now=3.1)  # the replaced host is first back, while a and s count as lost
    assert h.pushed["b"][-2:] == [("released", h.pushed["b"][-2][1]), ("closed", None)]
    assert "spare s took this host's place" in h.pushed["b"][-2][1]
    h.hello("a", now=3.2)
    h.hello("s", now=3.2)
    h.join("a", 3, 3.3)
    h.join("s", 3, 3.3)
    assert h.table.groups["r1"].current.ranks == ("a", "s") and "b" not in h.table.hosts


def test_after_a_restart_a_replaced_host_first_back_is_released_once_a_newer_host_names_its_replacement():
    """Before the restart spare s took b's node rank 1 in round 2, which completed. The new coordinator hears b
    first (it was cut off in round 1), then a and s."""
    h = Hosts()
    h.hello("b", now=0.0, round=1, node_rank=1, store="a:7001", hosts=["a", "b"], hosts_round=1)
    assert h.last("b")[0] in ("welcome", "complete"), "nothing newer known yet: b is believed"
    h.hello("a", now=0.2, round=2, node_rank=0, store="a:7002", hosts=["a", "s"], hosts_round=2)
    assert h.pushed["b"][-2:] == [("released", h.pushed["b"][-2][1]), ("closed", None)]
    assert "host s took this host's node rank 1 of group r1" in h.pushed["b"][-2][1]
    h.hello("s", now=0.3, round=2, node_rank=1, store="a:7002", hosts=["a", "s"], hosts_round=2)
    group = h.table.groups["r1"]
    assert (group.current.number, group.current.ranks) == (2, ("a", "s")) and "b" not in h.table.hosts
    assert "ended" not in kinds(h, "s") and not [p for p in h.pushed["a"] if p[0] == "ended" and p[1].round == 2]
    h.take()
    h.hello("b", now=1.0, round=1, node_rank=1, store="a:7001", hosts=["a", "b"], hosts_round=1)  # back again
    assert kinds(h, "b") == ["released", "closed"] and kinds(h, "a") == [] and kinds(h, "s") == []


# ----- 4. a group's shape is its first complete round's -------------------------------------------------------


def test_a_groups_shape_is_its_first_complete_rounds_and_a_host_that_disagrees_is_told_both_values(caplog):
    h = Hosts()
    h.hello("h1", nnodes=3)  # a typo on the first host
    h.hello("h2")
    h.hello("h3")  # the others say --nnodes 2: none is refused for the first host's flags
    for host, at in (("h1", 0.1), ("h2", 0.2)):
        h.join(host, 1, at)
    assert h.last("h2", "complete") is None
    with caplog.at_level(logging.WARNING, logger="fthsdp.coordinator"):
        h.join("h3", 1, 0.3)
    complete = h.last("h3", "complete")[1]
    assert list(complete.hosts) == ["h2", "h3"] and h.table.groups["r1"].nnodes == 2
    says = ("host h1: --nnodes 3, but group r1 runs with --nnodes 2 (since its round 1 completed): give every host "
            "of a group the same --nnodes and --nproc")
    assert h.pushed["h1"][-2:] == [("refused", says), ("closed", None)] and "h1" not in h.table.hosts
    assert [r.getMessage() for r in caplog.records if "h1" in r.getMessage()] == [f"job job: host h1 refused: {says}"]
    with pytest.raises(JoinRefused, match=re.escape("host h4: --nproc 8, but group r1 runs with --nproc 1")):
        h.hello("h4", nproc=8)


# ----- 5. and 6. one host id, one live agent; rounds that jump -----------------------------------------------


def test_a_second_live_agent_with_the_same_host_id_is_refused_naming_the_first_and_host_id():
    h = Hosts()
    h.hello("a", incarnation="i1", address="10.0.0.1")
    h.hello("b", incarnation="i2", address="10.0.0.2")
    hosts, pushed = dict(h.table.hosts), list(h.pushed["a"])
    with pytest.raises(PermissionDenied, match=r"host id 'a' is taken: another agent with this host id is connected "
                                               r"\(from 10\.0\.0\.1, for 1s\); give each agent its own --host-id"):
        h.hello("a", now=1.0, incarnation="i9", address="10.0.0.9")
    assert h.table.hosts == hosts and h.pushed["a"] == pushed, "nothing changed"
    h.hello("a", now=2.0, incarnation="i1", address="10.0.0.1")  # the first, its stream dropped unseen: taken
    assert h.last("a") == ("welcome", pb.HostWelcome(host_id="a", round=1))
    h.table.closed("a", h.connection["a"], 3.0)
    h.hello("a", now=4.0, incarnation="i3", address="10.0.0.1")  # its stream closed: a restarted agent is taken
    assert h.last("a")[0] == "welcome"


def test_a_forged_hello_or_a_round_that_jumps_is_refused_and_changes_nothing():
    h = Hosts()
    for host in ("a", "b"):
        h.hello(host, incarnation=f"agent-{host}")
    h.join("a", 1)
    h.join("b", 1)
    h.take()
    hosts, current = dict(h.table.hosts), h.table.groups["r1"].current
    with pytest.raises(PermissionDenied):  # the job token alone: b's host id, not b's incarnation
        h.hello("b", now=1.0, incarnation="forged", round=1, node_rank=1, store="evil:1")
    with pytest.raises(OutOfRange, match="host a says it is in round 2147483647 of group r1, which is in round 1"):
        h.hello("a", now=1.0, incarnation="agent-a", round=2**31 - 1)  # int32: the largest round a hello can say
    with pytest.raises(OutOfRange, match="host x says it is in round 2 of group r1"):
        h.hello("x", now=1.0, incarnation="x", round=2)  # not of the running round: not even the next
    for number in (2**31 - 1, 3):
        with pytest.raises(OutOfRange, match=f"host a says it is in round {number} of group r1"):
            h.table.join("a", number, "a:7009", 1.0)
    assert h.table.hosts == hosts and h.table.groups["r1"].current == current, "no round ended, none began"
    assert all(not box for box in h.pushed.values()), "nothing pushed to anyone"
    h.table.failure("b", 1, "local rank 0 exited with signal SIGKILL", 2.0)  # the real b still holds its stream
    assert h.last("b")[0] == "ended" and h.last("a")[0] == "ended"


# ----- 7. the tick -------------------------------------------------------------------------------------------


def test_a_group_is_decided_over_its_own_hosts_and_the_spares_only_when_it_waits_for_one(monkeypatch):
    """Decisions come with a group's events and deadlines, never as a sweep over every group on a tick
    (issue 49: tests/test_host_table_events.py counts the hosts looked at)."""
    h = Hosts(spare_wait=10.0)
    for g in range(50):
        for host in ("a", "b"):
            h.hello(f"g{g}-{host}", group=f"g{g}")
    h.hello("s", group="")
    sizes = []
    decide = host_rounds.decide

    def counting(group, nnodes, current, previous, hosts, now, rules):
        sizes.append((group, len(hosts)))
        return decide(group, nnodes, current, previous, hosts, now, rules)

    monkeypatch.setattr(host_rounds, "decide", counting)
    h.table.tick(1.0, TIMEOUT)
    assert sizes == [], "nothing due: no group decided"
    h.table.closed("g7-b", h.connection["g7-b"], 1.0)
    assert sizes == [("g7", 2)], "one decision, over its 2 hosts: b may come back within the spare wait"
    h.table.tick(11.0, TIMEOUT)
    assert sizes[1:] == [("g7", 3), ("g7", 2)], "b's wait is over: over its 2 hosts and the spare, which it adopts"
    assert h.last("s", "adopted") is not None
