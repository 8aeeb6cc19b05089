"""A coordinator restart or failover drops no healthy replica, and a replica
killed right after it is handled as soon as the others are back (quorum rule
1's reconnection grace, coordinator/runtime.py ``_grant_grace``).

Real processes: etcd, coordinators under a supervisor (tests/supervised.py:
SIGKILLed, started again on the same port, as systemd's Restart=always
would), three replicas training under ``fthsdp agent``. One second after the
new coordinator leads, one replica's training process is SIGKILLed,
preferably one that has not reconnected yet (the case the grace is for).
"""

from __future__ import annotations

import re
import signal
import time
import uuid

import pytest

from tests.processes import AgentProcess
from tests.soak import Watched
from tests.supervised import LOADED, SupervisedCoordinator, signal_process
from tests.waiting import wait_until

IDS = ("r0", "r1", "r2")
HEARTBEAT_TIMEOUT = 1.0
RECOVERY_LIMIT = 6.0
"""Seconds from the kill to every survivor's next commit without the victim
("within a few seconds"): the others reconnect (their clients back off while
the coordinator is down), then the victim is judged at once, or its restarted
incarnation registers first."""


def coordinator_args(etcd_url: str) -> tuple[str, ...]:
    return ("--store", etcd_url, "--store-prefix", f"/fthsdp-test/{uuid.uuid4().hex[:12]}", "--leader-ttl", "2s",
            "--heartbeat-interval", "200ms", "--heartbeat-timeout", f"{HEARTBEAT_TIMEOUT:g}s", "--join-settle", "0s")


LEADS = re.compile(r"leader election: this coordinator \(\S+\) leads")


def leader_loaded(coordinators, marks, pattern: re.Pattern = LOADED, timeout: float = 30.0):
    """The coordinator that logged ``pattern`` since ``marks`` (by default:
    it loaded the job from the store and leads it), the line's index and the match."""
    found = {}

    def loaded() -> bool:
        for c, mark in zip(coordinators, marks):
            for i, line in enumerate(c.log.lines()[mark:], start=mark):
                match = pattern.search(line)
                if match:
                    found["it"] = (c, i, match)
                    return True
        return False

    wait_until(loaded, timeout, interval=0.02, message="a coordinator leading the job again")
    return found["it"]


def run_case(tmp_path, etcd_url: str, followers: int, restart_sec: float) -> dict:
    args = coordinator_args(etcd_url)
    coordinators = []
    for i in range(1 + followers):
        coordinators.append(SupervisedCoordinator(tmp_path / f"coordinator-{i}.log", *args,
                                                  restart_sec=restart_sec).start())
    addresses = ",".join(c.address for c in coordinators)
    agents = [AgentProcess(tmp_path, addresses, rid, i, len(IDS), "--steps", "1000000", "--wait-for", str(len(IDS)),
                           "--hidden", "64").start() for i, rid in enumerate(IDS)]
    watched = {a.replica_id: Watched(a) for a in agents}
    try:
        wait_until(lambda: min(w.last_step() for w in watched.values()) >= 5, 120, message="three replicas training")
        leader, _, _ = leader_loaded(coordinators, [0] * len(coordinators), LEADS)
        marks = [c.log.count() for c in coordinators]
        leader.kill()  # its supervisor starts it again after restart_sec; a follower may lead first

        now_leader, loaded_at, match = leader_loaded(coordinators, marks)
        started = time.monotonic()
        assert match.group(2) == "3", match.group(0)
        time.sleep(1.0)  # the fault's schedule: the kill comes one second after the new leader started
        registered = {m.group(1) for line in now_leader.log.lines()[loaded_at:]
                      if (m := re.search(r"replica (\S+) registered", line))}
        missing = [rid for rid in IDS if rid not in registered]
        victim = missing[-1] if missing else IDS[-1]
        assert watched[victim].pid and signal_process(watched[victim].pid, signal.SIGKILL)
        killed = time.monotonic()
        survivors = [rid for rid in IDS if rid != victim]

        def first_commit_without(rid: str) -> float | None:
            after = [ln["t"] for ln in watched[rid].steps() if ln["t"] > killed and ln["contributors"] < len(IDS)]
            return min(after) if after else None

        wait_until(lambda: all(first_commit_without(s) is not None for s in survivors), 30,
                   message=f"the survivors {survivors} committing without {victim}")
        recovery = max(first_commit_without(s) for s in survivors) - killed
        log = "\n".join(now_leader.log.lines()[loaded_at:])
        result = {"victim": victim, "reconnected_before_the_kill": sorted(registered), "recovery_s": recovery,
                  "kill_after_start_s": killed - started, "grace": match.group(3)}
        print(f"\n{result}")
        assert recovery < RECOVERY_LIMIT, f"{result}\n{log}"
        # No healthy replica dropped: every quorum change names only the victim
        # as leaving, and the survivors' agents restarted nothing.
        for line in log.splitlines():
            if "members leaving:" in line:
                leaving = line.split("members leaving:", 1)[1]
                for rid in survivors:
                    assert not re.search(rf"\b{rid} \(", leaving), f"{rid} dropped: {line}"
        for rid in survivors:
            assert watched[rid].incarnations == 1, f"{rid} was restarted"
            assert "RUNNING -> FAILED" not in watched[rid].agent.log_path.read_text(errors="replace")
        return result
    finally:
        for a in agents:
            a.stop()
        for c in coordinators:
            c.stop()


@pytest.mark.timeout(180)
def test_a_supervised_coordinator_restarted_drops_no_healthy_replica(tmp_path, etcd_url):
    # Down for 3 s: the replicas' clients back off meanwhile, so some come
    # back later than one heartbeat timeout after the new coordinator starts.
    run_case(tmp_path, etcd_url, followers=0, restart_sec=3.0)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_failover_drops_no_healthy_replica(tmp_path, etcd_url):
    run_case(tmp_path, etcd_url, followers=1, restart_sec=3.0)
