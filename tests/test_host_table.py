"""The coordinator's table of hosts and rounds (fthsdp/coordinator/hosts/table.py),
in-process on a fake clock: what each host is pushed as hosts join, fail,
vanish, leave and come back, and what status shows of it."""

from __future__ import annotations

import re

import pytest

from fthsdp.coordinator.decisions.status_view import status_dict, status_table
from fthsdp.coordinator.hosts.rendezvous import JoinRefused
from fthsdp.coordinator.hosts.status import group_statuses
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.hosts import TIMEOUT, Hosts, running


def test_the_round_completes_when_every_host_joined_with_host_zeros_store():
    h = Hosts()
    h.hello("b")
    h.hello("a")
    assert h.last("a") == ("welcome", pb.HostWelcome(host_id="a", round=1))
    h.join("b", 1)
    assert h.last("b") == ("joined", 1) and h.last("b", "complete") is None, "one of two: it gathers"
    h.join("a", 1)
    a, b = h.last("a", "complete")[1], h.last("b", "complete")[1]
    assert (a.node_rank, b.node_rank) == (0, 1), "no round before: host-id order"
    assert a.store == b.store == "a:7001" and list(a.hosts) == ["a", "b"] and a.round == 1


def test_one_failure_ends_the_round_on_every_host_and_the_next_keeps_the_ranks():
    h = Hosts()
    running(h)
    h.take()
    h.table.failure("b", 1, "local rank 0 exited with signal SIGKILL", 1.0)
    for host in ("a", "b"):
        kind, ended = h.last(host)
        assert kind == "ended" and ended.round == 1
        assert "node rank 1 (b): it reported a failure (local rank 0 exited with signal SIGKILL)" in ended.reason
    h.table.failure("a", 1, "a late report of the same round", 1.1)
    assert len(h.pushed["a"]) == 1, "a report about a round already over changes nothing"
    h.join("b", 2, 2.0)
    h.join("a", 2, 2.0)
    assert h.last("a", "complete")[1].node_rank == 0 and h.last("b", "complete")[1].node_rank == 1
    assert h.last("a", "complete")[1].round == 2


def test_a_lost_host_ends_the_round_and_a_spare_takes_its_rank_after_the_spare_wait():
    h = Hosts(spare_wait=10.0)
    running(h)
    h.hello("s", group="")
    assert h.table.spares() == ["s"]
    h.take()
    h.table.closed("a", h.connection["a"], 1.0)  # node rank 0, the store's host, loses power
    assert h.last("b")[0] == "ended"
    h.join("b", 2, 1.5)
    h.table.tick(5.0, TIMEOUT)
    assert h.last("s") is None, "the lost host may come back within the spare wait"
    status = status_table(pb.StatusResponse(job="job", groups=group_statuses(h.table, 5.0), spares=h.table.spares()))
    assert "r1: round 2 gathering: node rank 0 a (lost 4s ago), node rank 1 b (joined)" in status
    assert "waiting for node rank 0: host a lost 4s ago, a spare takes its place in 6s" in status
    h.table.tick(11.0, TIMEOUT)
    kind, adopted = h.last("s")
    assert kind == "adopted" and (adopted.replica_id, adopted.replica_rank, adopted.round) == ("r1", 1, 2)
    assert h.table.spares() == []
    h.join("s", 2, 11.5)
    complete = h.last("s", "complete")[1]
    assert (complete.node_rank, complete.store, list(complete.hosts)) == (0, "s:7002", ["s", "b"])


def test_with_no_spare_status_says_why_and_the_agents_give_up_after_the_rendezvous_timeout():
    h = Hosts(spare_wait=1.0, rendezvous_timeout=30.0)
    running(h)
    h.table.beat("a", 4.0)
    h.table.tick(4.0, 5.0)
    h.table.tick(7.5, 5.0)  # b's last heartbeat at 0: lost (timeout 5), a's at 4 not yet
    assert h.last("b") == ("closed", None), "b's stream is ended: if its agent lives, it says hello again"
    h.join("a", 2, 8.5)
    h.table.tick(48.0, TIMEOUT)
    d = status_dict(pb.StatusResponse(groups=group_statuses(h.table, 48.0)))
    assert d["groups"] == [] and h.last("a") == ("gave_up", h.last("a")[1])
    assert "round 2 did not complete in 30s: waiting for node rank 1: host b lost 40s ago, no spare" in h.last("a")[1]
    # The hosts come back (a requeued job): the group's rounds go on from where they were.
    h.hello("a", now=60.0)
    assert h.last("a") == ("welcome", pb.HostWelcome(host_id="a", round=3))


def test_status_while_waiting_names_the_lost_host_and_no_spare():
    h = Hosts(spare_wait=1.0)
    running(h)
    h.table.closed("b", h.connection["b"], 0.0)
    h.join("a", 2, 0.5)
    h.table.tick(40.0, TIMEOUT)
    text = status_table(pb.StatusResponse(job="job", groups=group_statuses(h.table, 40.0), spares=h.table.spares()))
    assert "round 2: 1 of 2 hosts joined; waiting for node rank 1: host b lost 40s ago, no spare" in text
    assert "spares waiting: none" in text


def test_hosts_that_leave_finished_end_nothing():
    h = Hosts()
    running(h)
    h.take()
    h.table.leave("a", 1, "every local rank exited 0", 1.0)
    h.table.closed("a", h.connection["a"], 1.0)
    h.table.tick(1.0, TIMEOUT)
    assert h.pushed["b"] == [], "the other host is finishing too: its ranks are not stopped"
    h.table.leave("b", 1, "every local rank exited 0", 1.2)
    assert group_statuses(h.table, 2.0) == []


def test_a_coordinator_that_restarted_learns_the_running_round_from_its_hosts():
    h = Hosts()
    for host, rank in (("b", 1), ("a", 0)):
        h.hello(host, round=4, node_rank=rank, store="a:7004")
    assert all(kind != "ended" for box in h.pushed.values() for kind, _ in box), "nothing stops"
    g = h.table.groups["r1"]
    assert (g.current.number, g.current.ranks) == (4, ("a", "b"))
    h.table.failure("b", 4, "rank died", 1.0)
    assert h.last("a")[0] == "ended" and h.table.groups["r1"].current.number == 5


def test_a_host_of_the_running_round_back_with_nothing_running_ends_it():
    """Its agent was restarted (its ranks died with it) before its stream's end was seen."""
    h = Hosts()
    running(h)
    h.take()
    h.hello("b", now=1.0)
    assert h.last("a")[0] == "ended" and h.last("b") == ("welcome", pb.HostWelcome(host_id="b", round=2))


def test_a_host_ahead_of_the_group_ends_the_rounds_before():
    """Its failure report was lost on the way: its join of the next round ends the one that runs."""
    h = Hosts()
    running(h)
    h.take()
    h.join("b", 2, 1.0)
    assert h.last("a")[0] == "ended" and h.last("b") == ("joined", 2)


@pytest.mark.parametrize("hello, says", [
    (dict(host_id="c"), "group r1 already has its 2 hosts (a, b)"),
    (dict(host_id="c", nnodes=3), "host c: --nnodes 3, but group r1 runs with --nnodes 2 (since its round 1 "
                                  "completed)"),
    (dict(host_id="c", nproc=8), "host c: --nproc 8, but group r1 runs with --nproc 1 (since its round 1 completed)"),
])
def test_a_host_that_would_form_its_group_wrong_is_refused_and_nothing_changes(hello, says):
    h = Hosts()
    running(h)
    before = dict(h.table.hosts)
    with pytest.raises(JoinRefused, match=re.escape(says)):
        h.hello(**hello)
    assert h.table.hosts == before


def test_a_host_whose_place_a_spare_took_is_released_when_it_comes_back():
    h = Hosts(spare_wait=1.0)
    running(h)
    h.hello("s", group="")
    h.table.closed("b", h.connection["b"], 0.0)
    h.join("a", 2, 0.5)
    h.table.tick(2.0, TIMEOUT)
    h.join("s", 2, 2.5)
    h.hello("b", now=3.0)
    assert h.pushed["b"][-2:] == [("released", h.pushed["b"][-2][1]), ("closed", None)]
    assert "spare s took this host's place" in h.pushed["b"][-2][1]
    assert "b" not in h.table.hosts and h.table.groups["r1"].current.ranks == ("a", "s")


def test_spares_are_released_when_the_job_finishes_and_so_are_spares_that_come_later():
    h = Hosts()
    h.hello("s", group="")
    h.table.finish("job finished at step 300")
    assert h.last("s") == ("released", "job finished at step 300") and h.table.spares() == []
    h.hello("t", group="")
    assert h.pushed["t"] == [("released", "job finished at step 300"), ("closed", None)]


def test_the_same_join_again_after_a_reconnect_is_answered_not_taken_for_a_failure():
    """The agent's stream was opened again while it gathered: it sends its join again, as it was, and the
    round that completed meanwhile stands (a join with a fresh store would be a new incarnation)."""
    h = Hosts()
    running(h)
    h.take()
    h.join("a", 1, 1.0)  # the same round, the same store ("a:7001")
    assert h.pushed["b"] == [], "nothing ended"
    assert h.last("a")[0] == "complete" and h.last("a")[1].node_rank == 0
    h.table.join("a", 1, "a:9999", 2.0)  # a fresh store: its ranks of the round are gone
    assert h.last("b")[0] == "ended"


def test_a_host_that_joined_but_missed_the_completion_comes_back_and_the_round_stands():
    h = Hosts()
    running(h)
    h.take()
    h.hello("a", now=1.0, round=1, node_rank=-1)  # its stream opened again while it still gathered
    assert h.last("b") is None, "nothing ended"
    h.join("a", 1, 1.1)  # its join again, as it was
    assert h.last("a")[0] == "complete" and h.last("b") is None
