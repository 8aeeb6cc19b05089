"""A replica group of two "hosts" (two agents with --nnodes 2 on this
machine) meets through the coordinator's rendezvous: node ranks, the store
and the round come from it; one failure ends the round on both hosts; a
lost host's place goes to a spare. Real coordinator, agents and FSDP2 ranks
(tests/hsdp_worker.py); the network-namespace version with hosts that lose
their links is tests/test_group_hosts_netns.py."""

from __future__ import annotations

import os
import re
import signal
import time
import uuid

import pytest

from tests.harness.ending import end_started
from tests.harness.events import JsonLog, has
from tests.harness.processes import AgentProcess, CoordinatorProcess
from tests.harness.supervised import LOADED, SupervisedCoordinator

pytestmark = pytest.mark.slow

STEPS, HIDDEN = 1500, "32"


def host(tmp_path, address: str, host_id: str, *, spare: bool = False) -> AgentProcess:
    # --end-with 2: r0 may reach STEPS alone while r1 is out; both go on until they commit a step together.
    a = AgentProcess(tmp_path, address, "r1", 1, 2, "--hidden", HIDDEN, "--wait-for", "2", "--steps", str(STEPS),
                     "--end-with", "2",
                     agent_args=("--nproc", "1", "--nnodes", "2", "--host-id", host_id, "--max-restarts", "5"),
                     worker="tests.hsdp_worker")
    if spare:
        at = a.argv.index("--replica-id")
        del a.argv[at:at + 6]  # --replica-id r1 --replica-rank 1 --num-replicas 2
        a.argv[a.argv.index("--nproc"):a.argv.index("--nproc")] = ["--spare", "--num-replicas", "2"]
    a.log_path = tmp_path / f"agent-{host_id}.log"
    return a


def test_a_group_of_two_hosts_restarts_as_one_and_a_spare_takes_a_lost_hosts_place(tmp_path):
    c = CoordinatorProcess(tmp_path, "--min-replicas", "1", "--heartbeat-timeout", "2s", "--heartbeat-interval",
                           "200ms", "--spare-wait", "1s", "--log-format", "json").start()
    log = JsonLog(c.log_path)
    r0 = AgentProcess(tmp_path, c.address, "r0", 0, 2, "--hidden", HIDDEN, "--wait-for", "2", "--steps", str(STEPS),
                      "--end-with", "2", agent_args=("--nproc", "2"), worker="tests.hsdp_worker")  # as many ranks as r1
    hosts = {h: host(tmp_path, c.address, h) for h in ("h-a", "h-b")}
    spare = host(tmp_path, c.address, "h-spare", spare=True)
    procs = [r0.start(), *(a.start() for a in hosts.values())]
    try:
        first = log.wait_event("rendezvous", 90, group="r1", action="complete", round=1)["hosts"]
        assert sorted(first) == ["h-a", "h-b"], first  # hosts by node rank
        node1 = hosts[first[1]]
        r0.read_until(lambda line: line.get("step", 0) >= 20, 120)

        # 1. The rank on node rank 1 dies: the round ends on both hosts, round 2 forms with the same ranks.
        victim = node1.read_until(lambda line: line.get("rank") == 1, 60)
        os.kill(victim["pid"], signal.SIGKILL)
        second = log.wait_event("rendezvous", 90, group="r1", action="complete", round=2)
        # Whichever host saw it first (the killed rank's, or the other, whose rank's collective broke) ended it.
        # (An end's round is the one that gathers next; the host that ended it is in its reason alone.)
        assert log.find_event("rendezvous", group="r1", action="end", round=2,
                              reason=lambda r: re.match(r"round 1 ended: node rank \d \(h-[ab]\): it reported a "
                                                        r"failure", r or "")), log.events_named("rendezvous")
        assert second["hosts"] == first, "each host keeps its node rank"

        # 2. The host of node rank 1 is lost (its agent and rank killed): a spare takes its place.
        spare.start()
        procs.append(spare)
        log.wait_event("host_connected", 60, host="h-spare", group="")  # a spare: in no group yet
        os.kill(node1.proc.pid, signal.SIGKILL)
        third = log.wait_event("rendezvous", 120, group="r1", action="complete", round=3)
        assert log.find_event("rendezvous", group="r1", action="adopt-spares", round=3, adopted=["h-spare"],
                              reason=has(f"takes the place of lost {first[1]}")), log.events_named("rendezvous")
        assert third["hosts"] == [first[0], "h-spare"]

        # 3. The lost host comes back (rescheduled): its place is taken, it is released and exits 0.
        back = host(tmp_path, c.address, first[1])
        back.log_path = tmp_path / f"agent-{first[1]}-again.log"
        procs.append(back.start())
        assert back.proc.wait(timeout=60) == 0, back.log_tail()
        assert "spare h-spare took this host's place" in back.log_path.read_text()

        # 4. SIGTERM to the host of node rank 0 (a node drained): it leaves the group as a failed host, exit 1;
        #    rescheduled, it rejoins and the group trains again.
        survivor = hosts[first[0]]
        survivor.proc.send_signal(signal.SIGTERM)
        assert survivor.proc.wait(timeout=60) == 1, survivor.log_tail()
        log.wait_event("host_failed", 30, host=first[0], group="r1", round=3)  # it reported leaving
        again = host(tmp_path, c.address, first[0])
        again.log_path = tmp_path / f"agent-{first[0]}-again.log"
        procs.append(again.start())
        fourth = log.wait_event("rendezvous", 120, group="r1", action="complete", round=4)
        assert fourth["hosts"] == [first[0], "h-spare"]
        r0.finish(timeout=300)
        for a in (again, spare):
            assert a.proc.wait(timeout=120) == 0, a.log_tail()
    finally:
        end_started()  # everything it started, killed at once (tests/harness/ending.py)
    last = max(r0.steps)
    assert last >= STEPS and sorted(r0.steps) == list(range(1, last + 1)), "r0 lost or repeated a step"
    assert r0.steps[last]["contributors"] == 2, "the job ended on a step r0 and r1 committed together"
    # The surviving host ran rounds 1-3 (restart counts 0-2), and r1 trained again after round 4.
    assert "round 3: node rank 0 of 2" in hosts[first[0]].log_path.read_text()
    assert "round 4: node rank 0 of 2" in again.log_path.read_text()
    assert max(line["contributors"] for line in r0.step_lines if line["step"] > last - 20) == 2, \
        "r1 trained again at the end"


def test_a_coordinator_restart_ends_no_round_the_hosts_tell_the_new_one_where_they_are(tmp_path, etcd_url):
    """The rounds are not stored: the restarted coordinator learns the running
    round from the agents' hellos (fthsdp/coordinator/hosts/table.py), and the
    group trains on through it without a restart."""
    prefix = f"/fthsdp-test/{uuid.uuid4().hex[:12]}"
    c = SupervisedCoordinator(tmp_path / "coordinator.log", "--store", etcd_url, "--store-prefix", prefix,
                              "--leader-ttl", "2s", "--heartbeat-interval", "200ms", "--heartbeat-timeout", "3s",
                              "--spare-wait", "1s", "--log-format", "json").start()
    events = JsonLog(c.log.path)
    r0 = AgentProcess(tmp_path, c.address, "r0", 0, 2, "--hidden", HIDDEN, "--wait-for", "2", "--steps", "100000",
                      agent_args=("--nproc", "2"), worker="tests.hsdp_worker")
    hosts = [host(tmp_path, c.address, h) for h in ("h-a", "h-b")]
    r0.start()
    for a in hosts:
        a.start()
    try:
        events.wait_event("rendezvous", 90, group="r1", action="complete", round=1)
        r0.read_until(lambda line: line.get("step", 0) >= 10 and line["contributors"] == 2, 120)
        mark, killed = c.log.count(), time.time()
        c.kill()  # its supervisor starts it again at once
        c.log.wait_for(LOADED, after=mark, timeout=30)
        back = time.time()
        # The new coordinator knows the running round again, from the hellos, and r1 still commits with r0: 20
        # steps committed after it took over (not lines printed during the outage and read only now).
        events.wait_event("rendezvous", 30, since=killed, group="r1", action="complete", round=1)
        r0.read_until(lambda line: line.get("time", 0) > back and line["step"] >= first_after(r0, back) + 20, 120)
        after_kill = [e for e in events.events() if e["t"] >= killed]  # before the teardown stops anything
        agent_logs = [a.log_path.read_text() for a in hosts]
    finally:
        end_started()  # everything it started, killed at once (tests/harness/ending.py)
        c.stop()  # supervised: stopped by its supervisor, which would start it again
    # No round ended (a rendezvous ``end``, a host's failure) nor another began: every round field says 1.
    assert not [e for e in after_kill if e.get("action") == "end" or e.get("round", 1) != 1
                or "round 1 ended" in e["message"] or "round 2" in e["message"]], "the restart ended no round"
    for text in agent_logs:
        assert "restarting" not in text and "round 1 ended" not in text, "a host's ranks were restarted"
    after = [line for line in r0.step_lines if line["time"] > back]
    assert len(after) >= 20 and all(line["contributors"] == 2 for line in after), \
        "r1 trained on with r0 after the restart"


def test_a_host_lost_while_the_coordinator_was_down_is_replaced_by_a_spare_after_the_restart(tmp_path, etcd_url):
    """The host table is not stored (issue 48): the restarted coordinator
    learns the group's hosts by node rank from the survivor's hello, counts
    the host that never comes back lost after the heartbeat timeout, and
    gives its node rank to the waiting spare after --spare-wait; the group
    trains again."""
    prefix = f"/fthsdp-test/{uuid.uuid4().hex[:12]}"
    # Down for 1s after a kill (the supervisor's RestartSec), well within r0's member lease: the host is killed
    # meanwhile, milliseconds after the coordinator.
    c = SupervisedCoordinator(tmp_path / "coordinator.log", "--store", etcd_url, "--store-prefix", prefix,
                              "--min-replicas", "1", "--leader-ttl", "2s", "--heartbeat-interval", "200ms",
                              "--heartbeat-timeout", "3s", "--spare-wait", "1s", "--log-format", "json",
                              restart_sec=1.0).start()
    events = JsonLog(c.log.path)
    r0 = AgentProcess(tmp_path, c.address, "r0", 0, 2, "--hidden", HIDDEN, "--wait-for", "2", "--steps", "100000",
                      agent_args=("--nproc", "2"), worker="tests.hsdp_worker")
    hosts = {h: host(tmp_path, c.address, h) for h in ("h-a", "h-b")}
    spare = host(tmp_path, c.address, "h-spare", spare=True)
    for p in (r0, *hosts.values(), spare):
        p.start()
    try:
        first = events.wait_event("rendezvous", 90, group="r1", action="complete", round=1)["hosts"]
        events.wait_event("host_connected", 60, host="h-spare", group="")
        r0.read_until(lambda line: line.get("step", 0) >= 10 and line["contributors"] == 2, 120)
        lost, survivor = first[1], first[0]
        mark, killed = c.log.count(), time.time()
        c.kill()
        os.kill(hosts[lost].proc.pid, signal.SIGKILL)  # its agent, and its rank with it, while nobody coordinates
        hosts[lost].proc.wait(timeout=10)
        c.log.wait_for(LOADED, after=mark, timeout=30)
        gone = events.wait_event("host_lost", 60, since=killed, host=lost, group="r1")
        adopted = events.wait_event("rendezvous", 60, since=killed, group="r1", action="adopt-spares",
                                    adopted=["h-spare"], reason=has(f"takes the place of lost {lost}"))
        complete = events.wait_event("rendezvous", 90, since=adopted["t"], group="r1", action="complete")
        after = r0.read_until(lambda line: line.get("time", 0) > complete["t"] and line["contributors"] == 2, 180)
        never_back = not events.events_named("host_connected", since=killed, host=lost)
        reasons = [e.get("reason") or "" for e in events.events_named("rendezvous", since=killed)]
        statuses = [e["message"] for e in events.events() if e["t"] >= killed]
    finally:
        end_started()  # everything it started, killed at once (tests/harness/ending.py)
        c.stop()  # supervised: stopped by its supervisor, which would start it again
    assert never_back, "the lost host died while the coordinator was down: the new one never heard from it"
    assert adopted["t"] - gone["t"] >= 1.0, "the spare took the place only after --spare-wait"
    assert complete["hosts"] == [survivor, "h-spare"], "the spare has the lost host's node rank"
    assert after["contributors"] == 2, "r1 trains again, with r0"
    assert not [m for m in statuses + reasons if "none known" in m], "the lost host was known to the new coordinator"
    assert "round" in spare.log_path.read_text() and "adopted by replica group r1" in spare.log_path.read_text()


def test_a_second_agent_with_the_same_host_id_is_refused_with_one_line_that_says_to_give_host_id(tmp_path):
    """Two hosts with one host name (containers, network namespaces) would be one host to the coordinator."""
    c = CoordinatorProcess(tmp_path, "--heartbeat-interval", "200ms", "--heartbeat-timeout", "2s",
                           "--log-format", "json").start()
    first, second = host(tmp_path, c.address, "node-1"), host(tmp_path, c.address, "node-1")
    second.log_path = tmp_path / "agent-node-1-second.log"
    try:
        first.start()
        JsonLog(c.log_path).wait_event("host_connected", 60, host="node-1", group="r1")
        second.start()
        assert second.proc.wait(timeout=60) == 2, second.log_tail()
        assert first.proc.poll() is None, "the first agent goes on"
    finally:
        for a in (first, second):
            a.stop()
        c.stop()
    said = [line for line in second.log_path.read_text().splitlines() if "is taken" in line]
    assert len(said) == 1 and "host id 'node-1' is taken: another agent with this host id is connected (from " \
        "127.0.0.1" in said[0] and "give each agent its own --host-id" in said[0], said


def first_after(worker: AgentProcess, t: float) -> int:
    """The first step ``worker`` committed after unix time ``t`` (one it has read)."""
    return min((line["step"] for line in worker.step_lines if line.get("time", 0) > t), default=10**9)


def test_a_round_that_cannot_complete_gives_up_after_the_rendezvous_timeout_saying_why(tmp_path):
    c = CoordinatorProcess(tmp_path, "--heartbeat-interval", "200ms", "--heartbeat-timeout", "2s",
                           "--log-format", "json").start()
    alone = host(tmp_path, c.address, "h-a")
    alone.argv[alone.argv.index("--max-restarts"):alone.argv.index("--max-restarts")] = ["--rendezvous-timeout", "3s"]
    alone.start()
    try:
        assert alone.proc.wait(timeout=60) == 1, alone.log_tail()
    finally:
        end_started()  # everything it started, killed at once (tests/harness/ending.py)
    text = alone.log_path.read_text()
    assert "gave up: round 1 did not complete in 3s: waiting for 1 more host (none known)" in text, text[-2000:]
    assert JsonLog(c.log_path).find_event("rendezvous", group="r1", action="give-up", round=1,
                                          reason=has("round 1 did not complete in 3s"))
