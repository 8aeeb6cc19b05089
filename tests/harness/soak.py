"""A randomized fault soak: replicas of the full PyTorch loop (tests/ftar_worker.py
--loop full) under ``fthsdp agent``, a real coordinator, and SIGKILLs of random
replicas' ranks at random moments (overlapping, during catch-up, during
admission), then the invariants checked and a table printed.

The invariants: every replica reaches the last step; every step's state
checksum and contributors are the same on every replica and incarnation
that committed it (every step: the workers print a checksum at each); no
committed step is missing; no incarnation started over (a restarted one's
first step is past step 1); the job never lost its state.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import statistics
import threading
import time
from pathlib import Path

from fthsdp.client import CoordinatorClient, parse_addresses
from fthsdp.demo.record import json_objects
from tests.harness.processes import AgentProcess
from tests.harness.soak_control import ControlPlane
from tests.harness.waiting import wait_until


@dataclasses.dataclass
class Kill:
    t: float
    replica: str
    step: int
    overlapping: bool


class Watched:
    """One agent, its JSON lines read on a thread: every incarnation's steps and pid."""

    def __init__(self, agent: AgentProcess) -> None:
        self.agent = agent
        self.lines: list[dict] = []
        self.pid = 0
        self.incarnations = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                raw = self.agent.lines.get(timeout=1.0)
            except Exception:  # noqa: BLE001 - queue.Empty: the process may have ended
                if self.agent.proc.poll() is not None and self.agent.lines.empty():
                    return
                continue
            for line in json_objects(raw):
                with self.lock:
                    line["incarnation"] = self.incarnations
                    if "admitted" in line:
                        self.incarnations += 1
                        line["incarnation"] = self.incarnations
                        self.pid = line["pid"]
                    self.lines.append(line)

    def steps(self) -> list[dict]:
        with self.lock:
            return [line for line in self.lines if "step" in line and "checksum" in line]

    def last_step(self) -> int:
        steps = self.steps()
        return steps[-1]["step"] if steps else 0

    def holds_state(self, head: int) -> bool:
        """Its current incarnation has committed a step near the head (a
        joiner that has not yet trained with the members does not hold the
        job's state: killing the last one that does loses it, by design)."""
        with self.lock:
            mine = [ln for ln in self.lines
                    if "step" in ln and "checksum" in ln and ln["incarnation"] == self.incarnations]
        return bool(self.pid) and bool(mine) and mine[-1]["step"] >= head - 5


def members(client: CoordinatorClient) -> set[str]:
    return {m.replica_id for m in client.status().quorum.members}


def run_soak(tmp: Path, coordinator_address: str, replicas: int, fault_seconds: float, steps_after: int,
             seed: int, model: str = "plain", control: ControlPlane | None = None,
             control_every: tuple[float, float] = (10.0, 20.0)) -> dict:
    """``model``: tests/ftar_worker.py's --names (``batchnorm``: running statistics in the all-reduce).
    ``control``: also fault the control plane (tests/harness/soak_control.py), once every ``control_every`` seconds."""
    rng = random.Random(seed)
    # The product's default: a survivor blocked with a member lost just before
    # an etcd stall waits out the stall (up to 30 s) and the restart after it.
    env = {"FTHSDP_CATCH_UP_MAX_RATE": str(8 << 20), "FTHSDP_FTAR_TIMEOUT": "60"}
    agents = [
        AgentProcess(tmp, coordinator_address, f"r{i}", i, replicas, "--steps", "1000000", "--wait-for", str(replicas),
                     "--hidden", "256", "--loop", "full", "--names", model, agent_args=("--max-restarts", "1000"),
                     env=env).start()
        for i in range(replicas)
    ]
    watched = [Watched(a) for a in agents]
    kills: list[Kill] = []
    try:
        with CoordinatorClient(parse_addresses(coordinator_address)) as client:
            wait_until(lambda: min(w.last_step() for w in watched) >= 5, 120, message="the soak's replicas training")
            end = time.monotonic() + fault_seconds
            next_control = time.monotonic() + rng.uniform(*control_every)
            while time.monotonic() < end:
                time.sleep(rng.uniform(0.3, 3.0))  # the faults' random schedule
                if control is not None and time.monotonic() >= next_control and (
                        not kills or time.monotonic() - kills[-1].t > 3.0):  # no member loss pending
                    if control.inject(rng) is not None:
                        next_control = time.monotonic() + rng.uniform(*control_every)
                    continue
                if control is not None and control.stalled.is_set():
                    continue
                victims = [rng.choice(watched)]
                if rng.random() < 0.3:
                    victims.append(rng.choice(watched))
                head = max(w.last_step() for w in watched)
                for w in dict.fromkeys(victims):
                    rid = w.agent.replica_id
                    # Never the last replica holding the state: losing it stops the job, by design.
                    if not any(o.holds_state(head) for o in watched if o is not w):
                        continue
                    if not w.pid:
                        continue
                    try:
                        os.kill(w.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        continue
                    t = time.monotonic()
                    overlapping = any(t - k.t < 1.0 for k in kills)
                    kills.append(Kill(t, rid, w.last_step(), overlapping))
                    w.pid = 0
            # Faults over (a stall under way ends first): everyone back in and training together.
            if control is not None:
                wait_until(lambda: not control.busy(), 60, interval=0.1, message="the last etcd stall over")
            everyone = {w.agent.replica_id for w in watched}
            wait_until(lambda: members(client) == everyone, 180,
                       message="every replica back in the quorum after the faults")
            target = max(w.last_step() for w in watched) + steps_after
            wait_until(lambda: min(w.last_step() for w in watched) >= target, 120,
                       message="every replica at the last step")
            lost = client.status().state_lost_step
    finally:
        for a in agents:
            a.stop()
    result = summarize(watched, kills, lost, target)
    result["kill_log"] = [dataclasses.asdict(k) for k in kills]
    if control is not None:
        result.update(control.summary())
    result["lines"] = {w.agent.replica_id: [[ln["step"], ln["incarnation"], ln.get("quorum"), ln.get("contributors"),
                                             ln["checksum"], round(ln["t"], 3)] for ln in w.steps()] for w in watched}
    return result


def summarize(watched: list[Watched], kills: list[Kill], lost: int, target: int) -> dict:
    # Every step line of every incarnation, killed or not: one state and one
    # count of contributors per step (fthsdp/agent/training/ftar/vote.py).
    by_step: dict[int, set[tuple[str, int]]] = {}
    for w in watched:
        for line in w.steps():
            if line["checksum"]:
                by_step.setdefault(line["step"], set()).add((line["checksum"], line.get("contributors", 0)))
    split = {s: [list(c) for c in sorted(cs)] for s, cs in by_step.items() if len(cs) > 1}
    committed = sorted(by_step)
    missing = sorted(set(range(committed[0], committed[-1] + 1)) - set(committed)) if committed else []
    started_over = []
    for w in watched:
        firsts: dict[int, int] = {}
        for line in w.steps():
            firsts.setdefault(line["incarnation"], line["step"])
        started_over += [f"{w.agent.replica_id}#{i}" for i, s in firsts.items() if i > 1 and s <= 1]
    # Kill -> the survivors' next commit (any other replica's first step line after it).
    recover = []
    for k in kills:
        nexts = [line["t"] for w in watched if w.agent.replica_id != k.replica for line in w.steps()
                 if line["t"] > k.t and line.get("contributors", 0) >= 1]
        if nexts:
            recover.append(min(nexts) - k.t)
    catch_ups = [line["catch_up"] for w in watched for line in w.lines if line.get("catch_up")]
    # Restart -> verified and close to the head (admission follows at the next step boundary).
    durations = [(c["ready"] or c["loaded"]) - c["began"]
                 for c in catch_ups if c.get("began") and (c.get("ready") or c.get("loaded"))]
    lost_steps = _replica_steps_lost(watched, committed)
    return {
        "kills": len(kills),
        "overlapping_kills": sum(k.overlapping for k in kills),
        "recover_median_s": statistics.median(recover) if recover else None,
        "recover_max_s": max(recover) if recover else None,
        "catch_ups": len(catch_ups),
        "catch_up_median_s": statistics.median(durations) if durations else None,
        "catch_up_max_s": max(durations) if durations else None,
        "replica_steps_lost": lost_steps,
        "steps": committed[-1] if committed else 0,
        "target": target,
        "split_steps": split,
        "missing_steps": missing,
        "started_over": started_over,
        "state_lost_step": lost,
    }


def _replica_steps_lost(watched: list[Watched], committed: list[int]) -> int:
    """Per committed step, the replicas that did not commit it."""
    have: dict[int, set[str]] = {}
    for w in watched:
        for line in w.steps():
            have.setdefault(line["step"], set()).add(w.agent.replica_id)
    return sum(len(watched) - len(have.get(s, ())) for s in committed)


def table(result: dict) -> str:
    def f(x):
        return "-" if x is None else f"{x:.2f}"

    return (
        "| kills | overlapping | kill -> survivors' next commit, median / max (s) | catch-ups "
        "| catch-up median / max (s) | replica-steps lost | steps |\n|---:|---:|---:|---:|---:|---:|---:|\n"
        f"| {result['kills']} | {result['overlapping_kills']} "
        f"| {f(result['recover_median_s'])} / {f(result['recover_max_s'])} "
        f"| {result['catch_ups']} | {f(result['catch_up_median_s'])} / {f(result['catch_up_max_s'])} "
        f"| {result['replica_steps_lost']} | {result['steps']} |"
    )


def control_table(result: dict) -> str:
    """The control-plane faults of a run, with what the replicas saw."""
    c = result["control_faults"]
    return (
        "| replica kills | coordinator kills | etcd stalls (total / longest) | etcd restarts | coordinator starts "
        "| members dropped as not back after a restart | steps |\n|---:|---:|---:|---:|---:|---:|---:|\n"
        f"| {result['kills']} | {c['coordinator_kill']} | {c['etcd_stall']} ({result['etcd_stall_s']:g} / "
        f"{result['etcd_stall_max_s']:g} s) | {c['etcd_restart']} | {result['coordinator_starts']} "
        f"| {result['dropped_not_back']} | {result['steps']} |"
    )


def dump(result: dict, path: Path) -> None:
    path.write_text(json.dumps(result, indent=2, default=str))
