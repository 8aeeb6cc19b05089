"""Replica groups of several hosts, each host in its own network namespace
(tests/harness/netns.py): real coordinator, agents and FSDP2 ranks (tests/hsdp_worker.py).

Two groups, r0 (hosts p0, p1) and r1 (hosts a, b), each of two hosts of
1 rank (``--nnodes 2``: FSDP2 across the two hosts' data links), which
meet through the coordinator's rendezvous (issue 39) with nothing but
--replica-id and --nnodes; plus spare hosts. Each host has its own
namespace and addresses, a control link to the coordinator and a data link
to the others, so a host can lose its network as a real one does
(tests/test_group_hosts.py is the same on loopback). Every fault is r1's;
r0 is the group that must not notice.

The faults: a rank killed (node rank 0, then node rank 1); a rank
SIGSTOPped on the host of node rank 1 after the group restarted (the
coordinator's hang verdict carries the restart count of r1's rank 0, which
every host of the group must share); a host cut off (both links) while its
group catches up after a restart, then back; a host that loses power
(links down, then every process in it SIGKILLed), node rank 1 and then
node rank 0, the host of the group's store, each replaced by a spare after
--spare-wait.

Each asserts: r0 never stops committing for longer than the heartbeat
timeout plus a step (the step lines carry their wall-clock ``time``); every
live host of r1 stops its ranks within STOP_BOUND of the failure being known
(the coordinator's verdict, or the first agent's FAILED; a host cut off:
of its coming back); r1 forms its next round and commits steps again; every
step has one state across groups; and nothing restarted silently (each of
r1's rounds ended with its reason in the coordinator's log, once per fault,
each host restarted once per ended round, r0 never). The measured numbers
are printed (pytest -s).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from itertools import pairwise
from pathlib import Path

import pytest

from fthsdp.demo.record import json_objects
from tests.harness.events import JsonLog, has, like
from tests.harness.netjob import labs
from tests.harness.netns import NetLab
from tests.harness.netns_state import kill_inside
from tests.harness.processes import AgentProcess
from tests.harness.waiting import wait_until

pytestmark = pytest.mark.slow

FOREVER = "1000000"
R0_HOSTS = ("p0", "p1")
"""r0's two hosts (node ranks 0 and 1): the group that must keep committing through r1's faults."""
HIDDEN = "32"
STEP_SLEEP = "0.03"
"""Each rank sleeps this long after each commit: 2 cores are shared by every rank, agent and store of 4-6 hosts,
and restarts import torch; without it a restarted rank needs 10-15 s to reach the coordinator."""
REPLAY_DELAY = "0.3"
"""Each of the first 10 steps a restarted r1 replays while catching up takes this long (tests/hsdp_worker.py): a
catch-up of 2-3 s, long enough to cut a host's links during it."""
HEARTBEAT_TIMEOUT = 2.0
SPARE_WAIT = 2.0
HANG_FLOOR = 2.0
"""The hang limit's floor: no longer than the heartbeat timeout, so a stopped rank costs r0 no more than a lost host."""
STEP_ALLOWANCE = 1.0
"""'A step' in r0's longest pause: its steps take tens of milliseconds, but on 2 busy cores one can take far longer."""
STOP_BOUND = 3.0
"""Seconds from the failure being known until a host's ranks are all stopped: the coordinator's push, the agent's
monitor tick, --hang-grace (1 s here) before SIGKILL for a hang (none for a round another host ended), and a
loaded machine."""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def restart_count(pid: int) -> int:
    """FTHSDP_RESTART_COUNT in a running rank's environment."""
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(v for v in env if v.startswith(b"FTHSDP_RESTART_COUNT=")).split(b"=", 1)[1])


class Job:
    """A coordinator on the control bridge; r0's hosts (R0_HOSTS), r1's and
    the spares, each in the namespace named after it."""

    def __init__(self, lab: NetLab, tmp: Path, group: tuple[str, ...], spares: tuple[str, ...] = ()) -> None:
        self.lab, self.tmp = lab, tmp
        self.coordinator = lab.coordinator(
            tmp, "--min-replicas", "1", "--heartbeat-timeout", f"{HEARTBEAT_TIMEOUT:g}s", "--heartbeat-interval",
            "200ms", "--spare-wait", f"{SPARE_WAIT:g}s", "--hang-floor", f"{HANG_FLOOR:g}s", "--hang-ceiling", "30s",
            "--log-format", "json").start()
        self.log = JsonLog(self.coordinator.log_path)
        worker = ("--hidden", HIDDEN, "--wait-for", "2", "--steps", FOREVER, "--step-sleep", STEP_SLEEP,
                  "--replay-delay", REPLAY_DELAY)
        self.r0_hosts = {h: self._host(h, worker, "r0", 0) for h in R0_HOSTS}
        self.r0 = self.r0_hosts[R0_HOSTS[0]]
        """r0's node rank 0 (the host ids' order; checked in ``started``): its rank 0 prints r0's steps."""
        self.hosts = {h: self._host(h, worker, "r1", 1, spare=h in spares) for h in (*group, *spares)}
        self.logs = {h: JsonLog(a.log_path) for h, a in (*self.r0_hosts.items(), *self.hosts.items())}
        self.faults: list[dict] = []
        """One entry per fault: its name, the round it ended, and what was measured."""
        for a in self.agents():
            a.start()

    def _host(self, host_id: str, worker: tuple[str, ...], replica: str, rank: int, spare: bool = False,
              ) -> AgentProcess:
        a = AgentProcess(self.tmp, self.coordinator.address, replica, rank, 2, *worker, worker="tests.hsdp_worker",
                         agent_args=("--nproc", "1", "--nnodes", "2", "--host-id", host_id, "--max-restarts", "10",
                                     "--hang-grace", "1s", "--log-format", "json"))
        if spare:
            at = a.argv.index("--replica-id")
            del a.argv[at:at + 6]  # --replica-id r1 --replica-rank 1 --num-replicas 2
            a.argv[a.argv.index("--nproc"):a.argv.index("--nproc")] = ["--spare", "--num-replicas", "2"]
        a.log_path = self.tmp / f"agent-{host_id}.log"
        return self.lab.inside(host_id, a)

    def agents(self) -> list[AgentProcess]:
        return [*self.r0_hosts.values(), *self.hosts.values()]

    def started(self, group: tuple[str, str]) -> None:
        """Both groups formed their first round with the node ranks in host-id order, and train together."""
        self.log.wait_event("rendezvous", 120, group="r0", action="complete", round=1, hosts=list(R0_HOSTS))
        assert self.round_complete(1)[1] == group, "node ranks in host-id order"
        self.training_again(1)
        self.r0.read_until(lambda line: line.get("step", 0) >= 20, 60)

    def stop(self) -> None:
        for a in self.agents():
            a.signal(signal.SIGTERM)  # all at once
        for a in self.agents():
            a.stop()
        self.coordinator.stop()

    # ----- the rounds ----------------------------------------------------------------------

    def round_complete(self, n: int, timeout: float = 120) -> tuple[float, tuple[str, str]]:
        """When r1's round ``n`` completed, and its hosts by node rank."""
        event = self.log.wait_event("rendezvous", timeout, group="r1", action="complete", round=n)
        first, second = event["hosts"]
        return event["t"], (first, second)

    def training_again(self, n: int, timeout: float = 120) -> float:
        """Wait until r1 commits a step in round ``n`` with r0 (contributors 2); returns its time."""
        since, ranks = self.round_complete(n, timeout)
        line = self.hosts[ranks[0]].read_until(
            lambda line: "step" in line and line["time"] > since and line["contributors"] == 2, timeout)
        self.r0.read_until(lambda line: "step" in line and line["time"] > since and line["contributors"] == 2,
                           timeout)
        return line["time"]

    def rank_pid(self, host: str, rank: int, timeout: float = 60) -> int:
        """The pid of the running incarnation of ``rank`` on ``host`` (printed once admitted)."""
        agent = self.hosts[host]
        for line in reversed(agent.history):  # read already, waiting for something else
            for obj in json_objects(line):
                if obj.get("rank") == rank and alive(obj["pid"]):
                    return obj["pid"]
        return agent.read_until(lambda line: line.get("rank") == rank and alive(line["pid"]), timeout)["pid"]

    def power_off(self, host: str) -> None:
        """The host loses power: its links go down first (no FIN, no RST reaches anyone), then every
        process in its namespace is SIGKILLed (agent, store host, ranks)."""
        self.lab.cut_control(host)
        self.lab.cut_data(host)
        kill_inside(self.lab.replica(host).ns)
        self.hosts[host].proc.wait(timeout=10)

    # ----- what is measured -----------------------------------------------------------------

    def measure(self, name: str, n: int, fault_at: float, back: float | None,
                reconnected: dict[str, float] | None = None) -> dict:
        """Round ``n`` of r1 ended by a fault injected at ``fault_at``; r1 trained again at ``back`` (None: the
        next fault came first). Records when the failure was known, each live host's stop latency (a host in
        ``reconnected``: from when it came back) and r0's longest pause."""
        started, ranks = self.round_complete(n)
        # An end's round is the one that gathers next; who ended it, and why, is in its reason alone.
        ended = self.log.wait_event("rendezvous", 60, group="r1", action="end", round=n + 1,
                                    reason=like(rf"^round {n} ended: node rank \d \(\S+\): .+"))
        m = re.match(r"round \d+ ended: node rank (\d) \((\S+)\): (.+)", ended["reason"])
        assert m is not None
        known_at = [ended["t"]]
        for event in self.log.events():
            if event["t"] >= fault_at and (
                    (event.get("event") in ("host_failed", "host_lost") and event.get("group") == "r1")
                    or (event.get("event") in ("hang", "silent") and event.get("replica") == "r1")):
                known_at.append(event["t"])
        for host in ranks:
            failed = [e for e in self.logs[host].events() if e.get("event") == "agent_state"
                      and e["state"] == "FAILED" and e["t"] >= fault_at]
            if failed and not (reconnected and host in reconnected):
                known_at.append(failed[0]["t"])
        known = min(known_at)
        stops = {}
        for host in ranks:
            stopped = self.stopped(host, n)
            if stopped is None:
                assert host not in self.hosts or self.hosts[host].proc.poll() is not None, \
                    f"{host}, alive, never stopped its ranks of round {n}"
                continue
            base = reconnected.get(host, known) if reconnected else known
            stops[host] = stopped - max(base, known)
        record = {"fault": name, "round": n, "hosts": ranks, "ended": f"node rank {m[1]} ({m[2]}): {m[3]}",
                  "known_after": known - fault_at, "stop_latency": stops,
                  "r0_longest_pause": self.r0_pause(fault_at, back or time.time()),
                  "trained_again_after": back - fault_at if back else None}
        self.faults.append(record)
        print(f"\n{name}: {json.dumps(record, default=lambda x: round(x, 3))}")
        return record

    def stopped(self, host: str, n: int) -> float | None:
        """When ``host`` had stopped its ranks of round ``n`` (its RESTARTING or GAVE_UP after it began to stop)."""
        events = self.logs[host].events()
        began = next((e["t"] for e in events if e.get("event") == "group_round" and e["round"] == n
                      and e["phase"] == "stopping"), None)
        if began is None:
            return None
        return next((e["t"] for e in events if e["t"] >= began and e.get("event") == "agent_state"
                     and e["state"] in ("RESTARTING", "GAVE_UP")), None)

    def r0_pause(self, start: float, end: float) -> float:
        """r0's longest time between two consecutive committed steps, of those committed in [start, end]."""
        self.r0.drain()
        times = sorted(line["time"] for line in self.r0.steps.values())
        gaps = [b - a for a, b in pairwise(times) if b >= start and a <= end]
        return max(gaps, default=0.0)

    # ----- what every test asserts at the end ---------------------------------------------

    def check(self, rounds: int) -> None:
        """After ``rounds`` rounds of r1 (``rounds`` - 1 faults, each measured)."""
        for a in self.agents():
            a.drain()
        assert len(self.faults) == rounds - 1
        for f in self.faults:
            for host, latency in f["stop_latency"].items():
                assert latency <= STOP_BOUND, f"{f['fault']}: {host} stopped its ranks {latency:.2f}s after"
            assert f["r0_longest_pause"] <= HEARTBEAT_TIMEOUT + STEP_ALLOWANCE, \
                f"{f['fault']}: r0 committed nothing for {f['r0_longest_pause']:.2f}s"
        # r0 trained throughout: every step once, never a pause past the bound once r1 first joined.
        steps = [line["step"] for line in self.r0.step_lines]
        assert steps == list(range(1, steps[-1] + 1)), "r0 lost or repeated a step"
        first_together = min(s for s, line in self.r0.steps.items() if line["contributors"] == 2)
        pause = self.r0_pause(self.r0.steps[first_together]["time"], float("inf"))
        print(f"\nr0's longest pause once r1 had joined: {pause:.3f}s; steps {steps[-1]}")
        assert pause <= HEARTBEAT_TIMEOUT + STEP_ALLOWANCE, f"r0 committed nothing for {pause:.2f}s"
        # One state per step, across groups and every incarnation of r1.
        states: dict[int, set] = {}
        for a in self.agents():
            for line in a.step_lines:
                states.setdefault(line["step"], set()).add((line["checksum"], line["contributors"]))
        split = {s: c for s, c in states.items() if len(c) > 1}
        assert not split, f"states differ at steps {sorted(split)[:5]}"
        # Nothing restarted silently: r1's rounds ended once per fault, each saying why; each host restarted
        # once per round it was in that ended; r0 never restarted and was never taken out.
        ends = [e for e in self.log.events() if e.get("event") == "rendezvous" and e.get("group") == "r1"
                and e.get("action") == "end"]
        assert len(ends) == rounds - 1, [e["message"] for e in ends]
        for e in ends:
            assert re.search(rf"round {e['round'] - 1} ended: node rank \d \(\S+\): .+; round {e['round']} gathers",
                             e["reason"]), e
        completes = [e for e in self.log.events() if e.get("event") == "rendezvous" and e.get("group") == "r1"
                     and e.get("action") == "complete"]
        assert [e["round"] for e in completes] == list(range(1, rounds + 1)), [e["message"] for e in completes]
        for host in self.hosts:
            stopped_in = [f["round"] for f in self.faults if host in f["stop_latency"]]
            restarts = [e for e in self.logs[host].events() if e.get("event") == "agent_state"
                        and e["state"] == "RESTARTING"]
            assert len(restarts) == len(stopped_in), \
                f"{host} restarted {len(restarts)} times, for the ends of rounds {stopped_in}"
        for host in R0_HOSTS:
            assert not [e for e in self.logs[host].events() if e.get("event") == "agent_state"
                        and e["state"] in ("FAILED", "RESTARTING")], f"r0's host {host} restarted"
        assert not self.log.events_named("rendezvous", group="r0", action="end"), "r0 restarted"
        assert not self.log.taken_out("r0") and not self.log.events_named("silent", replica="r0"), \
            "r0 was taken out"


@pytest.fixture
def job_in_lab(tmp_path):
    """``make(names, group, spares=())``: a Job of those hosts in a NetLab of
    its own (tests/harness/netjob.py ``labs``)."""
    with labs(lambda lab, group, spares=(): Job(lab, tmp_path, group, spares)) as make:
        yield make


@pytest.mark.timeout(360)
def test_a_killed_rank_a_stopped_rank_and_a_host_cut_off_in_catch_up_each_restart_the_group_as_one(job_in_lab):
    """Hosts a and b form r1 (node ranks 0 and 1). (2) r1's rank on a is
    SIGKILLed: round 1 ends on both hosts, round 2 trains. (3) In round 2
    (restart count 1 on both hosts) the rank on b, node rank 1, is
    SIGSTOPped: the coordinator's verdict names restart count 1, which b's
    agent runs too, so it ends the stopped rank; round 3 trains. (2 again)
    The rank on b is SIGKILLed: round 3 ends. (4) As round 4's rank 0
    registers (r1 catching up from r0), host a is cut off (both links): the
    coordinator loses it after the heartbeat timeout and ends round 4 on b;
    a, back, learns of round 5 at its hello, stops its stale rank and joins;
    round 5 keeps the node ranks and trains."""
    job = job_in_lab([*R0_HOSTS, "a", "b"], group=("a", "b"))
    lab = job.lab
    job.started(("a", "b"))

    # 2. One rank killed: the rank of node rank 0.
    pid = job.rank_pid("a", 0)
    at = time.time()
    os.kill(pid, signal.SIGKILL)
    back = job.training_again(2)
    job.measure("a rank killed (node rank 0)", 1, at, back)
    assert job.round_complete(2)[1] == ("a", "b"), "each host keeps its node rank"

    # 3. The rank of node rank 1 stopped, after the group restarted: restart count 1 on both hosts.
    pid = job.rank_pid("b", 1)
    counts = {host: restart_count(job.rank_pid(host, rank)) for host, rank in (("a", 0), ("b", 1))}
    assert counts == {"a": 1, "b": 1}, f"round 2 runs as restart count 1 on every host: {counts}"
    at = time.time()
    os.kill(pid, signal.SIGSTOP)
    back = job.training_again(3)
    job.measure("a rank SIGSTOPped (node rank 1, restart count 1)", 2, at, back)
    assert not alive(pid), "the stopped rank is still there"
    failed = {host: next(e["detail"] for e in job.logs[host].events() if e.get("event") == "agent_state"
                         and e["state"] == "FAILED" and e["t"] >= at) for host in ("a", "b")}
    # The coordinator's verdict names the restart count of r1's rank 0 (1); an agent acted on it (which one first
    # is a race: the other is told by the round's end, or acts on the verdict too).
    assert any(d.startswith("taken out by the coordinator") for d in failed.values()), failed
    assert all(d.startswith(("taken out by the coordinator", "round 2 ended")) for d in failed.values()), failed

    # 2 again, on node rank 1; then 4: host a (node rank 0, the store) cut off while round 4 catches up from r0
    # (each step it replays takes REPLAY_DELAY), before r1 committed a step in round 4.
    pid = job.rank_pid("b", 1)
    at = time.time()
    os.kill(pid, signal.SIGKILL)
    started, ranks = job.round_complete(4)
    assert ranks == ("a", "b")
    registered, _ = job.log.wait(r"replica r1 registered \(step 0,", 120, since=started)
    cut = time.time()
    lab.cut_control("a")
    lab.cut_data("a")
    job.measure("a rank killed (node rank 1)", 3, at, None)
    admitted = job.log.find_event("quorum_change", started, reason=like(r"^admitting .*r1"))
    landed = (f"{cut - registered['t']:.2f}s after r1 registered, "
              + ("before its admission" if admitted is None or admitted["t"] > cut else "after its admission"))
    job.hosts["a"].drain()
    assert not [line for line in job.hosts["a"].step_lines if line["time"] > started], \
        "r1 committed a step in round 4 before the cut: the cut missed the catch-up"
    job.log.wait_event("host_lost", 30, since=cut, host="a", group="r1")
    wait_until(lambda: job.stopped("b", 4) is not None, 30, message="b stopped its ranks of round 4")
    gathering = job.logs["b"].wait_event("group_round", 30, since=cut, host="b", round=5, phase="gathering")
    # Each change of round or phase is one event: the one before says where it came from (joining round 5).
    rounds = job.logs["b"].events_named("group_round", host="b")
    before = rounds[rounds.index(gathering) - 1]
    assert (before["round"], before["phase"]) == (5, "joining"), before
    assert job.hosts["a"].proc.poll() is None
    lab.heal_control("a")
    lab.heal_data("a")
    healed = time.time()
    event = job.log.wait_event("host_connected", 60, since=healed, host="a")
    back = job.training_again(5)
    record = job.measure(f"host a (node rank 0) cut off in catch-up ({landed}), healed after {healed - cut:.1f}s",
                         4, cut, back, reconnected={"a": event["t"]})
    assert job.round_complete(5)[1] == ("a", "b"), "a, back, keeps node rank 0"
    assert "a" in record["stop_latency"], "a never stopped its stale ranks of round 4"
    job.check(rounds=5)


@pytest.mark.timeout(360)
def test_hosts_that_lose_power_are_replaced_by_spares_node_rank_1_then_the_store_host(job_in_lab):
    """Hosts a and b form r1, s1 and s2 are spares. (1, 5) b, node rank 1,
    loses power (links down, then every process killed): the coordinator
    loses it after the heartbeat timeout and ends round 1 on a; after
    --spare-wait s1 takes node rank 1 and round 2 trains. Then a, node rank
    0 and the host of the group's store, loses power: round 2 ends on s1,
    s2 takes node rank 0 (its own store), s1 keeps node rank 1, round 3
    trains."""
    job = job_in_lab([*R0_HOSTS, "a", "b", "s1", "s2"], group=("a", "b"), spares=("s1", "s2"))
    job.started(("a", "b"))
    job.log.wait_event("host_connected", 60, host="s2")

    at = time.time()
    job.power_off("b")
    back = job.training_again(2)
    job.measure("node rank 1 (b) lost power", 1, at, back)
    lost = job.log.wait_event("host_lost", 1, host="b", group="r1")
    adopted = job.log.wait_event("rendezvous", 1, group="r1", action="adopt-spares", round=2, adopted=["s1"],
                                 reason=has("spare s1 takes the place of lost b"))
    assert adopted["t"] - lost["t"] >= SPARE_WAIT - 0.1
    assert job.round_complete(2)[1] == ("a", "s1")

    at = time.time()
    job.power_off("a")
    back = job.training_again(3)
    job.measure("node rank 0 (a, the store) lost power", 2, at, back)
    job.log.wait_event("rendezvous", 1, group="r1", action="adopt-spares", round=3, adopted=["s2"],
                       reason=has("spare s2 takes the place of lost a"))
    started, ranks = job.round_complete(3)
    assert ranks == ("s2", "s1"), "s1 keeps node rank 1; s2 takes node rank 0 and hosts the store"
    store = job.log.wait_event("rendezvous", 1, group="r1", action="complete", round=3)["store"]
    assert store.startswith(job.lab.replica("s2").data_ip + ":"), f"round 3's store {store} is not on s2"
    job.check(rounds=3)
