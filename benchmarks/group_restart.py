"""How fast a replica group restarts as one, on one host and across two.

    python benchmarks/group_restart.py [--trials 3] [--cases "two hosts of 1 rank"]

Two replica groups train FSDP2 (tests/hsdp_worker.py: each group shards the
model over its 2 ranks, FTAR across the groups) under `fthsdp agent`
against a real coordinator on loopback. The victim group r1 is either

- one host, 2 ranks (`--nproc 2`): the baseline, one agent restarts both; or
- two hosts x 1 rank (`--nnodes 2`, two agents meeting through the
  coordinator's rendezvous, fthsdp/coordinator/hosts/rendezvous.py);

and after 10 steps, at a random point within a step, the rank of r1 with
RANK 1 is SIGKILLed. From the agents' JSON logs and the peer r0's commits:

- every host stopped: the kill to the last of r1's agents having stopped
  its ranks (its RESTARTING transition): the bound on "every host of the
  group stops within ... of the failure";
- trains again: the kill to r0's first commit with r1 contributing again
  (restart, rendezvous round, process start, catch-up, admission);
- peer stall: r0's longest gap between commits from the kill to then, less
  its median step before (r0 never waits for r1 beyond a step's FTAR).

The ratio column divides the two-host figure by the one-host baseline of
the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from failover import start_coordinator  # noqa: E402
from jsonproc import Proc  # noqa: E402

from fthsdp.demo.record import json_objects  # noqa: E402

CASES = {"one host of 2 ranks": 1, "two hosts of 1 rank": 2}
STEPS = 100_000
"""More than any trial reaches: each ends once r1 trains again."""


def agent(address: str, replica: int, extra: list[str], log: Path, env: dict) -> Proc:
    cmd = [sys.executable, "-m", "fthsdp", "agent", "--coordinator", address, "--replica-id", f"r{replica}",
           "--replica-rank", str(replica), "--num-replicas", "2", "--log-format", "json", "--restart-backoff", "100ms",
           *extra, "--", sys.executable, "-m", "tests.hsdp_worker", "--hidden", "32", "--wait-for", "2",
           "--steps", str(STEPS)]
    return Proc(cmd, env, stderr_path=log)


def unix(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso).timestamp()


def stopped_at(log: Path, after: float) -> float | None:
    """When the agent logging to ``log`` had stopped its ranks after ``after`` (its RESTARTING transition)."""
    for line in log.read_text(errors="replace").splitlines():
        for record in json_objects(line):  # a record may follow a rank's unended line
            if record.get("event") == "agent_state" and record.get("state") == "RESTARTING":
                t = unix(record["time"])
                if t >= after:
                    return t
    return None


def trial(nnodes: int, rng: random.Random, work: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FTHSDP_FTAR_TIMEOUT": "60"}
    tag = rng.randrange(1 << 30)
    with contextlib.ExitStack() as stack:
        argv = [sys.executable, "-m", "fthsdp", "coordinator", "--bind", "127.0.0.1:0", "--min-replicas", "1",
                "--heartbeat-interval", "200ms", "--heartbeat-timeout", "2s"]
        coordinator, address = start_coordinator(argv, env, work / f"coordinator-{tag}.log")
        stack.callback(coordinator.stop)
        peer = agent(address, 0, ["--nproc", "2"], work / f"r0-{tag}.log", env)
        stack.callback(peer.stop)
        logs = [work / f"r1-{tag}-{k}.log" for k in range(nnodes)]
        hosts = [agent(address, 1, ["--nproc", str(2 // nnodes), *(["--nnodes", "2", "--host-id", f"h{k}"]
                                                                     if nnodes > 1 else [])], log, env)
                 for k, log in enumerate(logs)]
        for h in hosts:
            stack.callback(h.stop)
        # RANK 1's pid: on the host of node rank 1 (two hosts) or the agent's second rank (one host).
        victim = next(h.until(lambda x: x.get("rank") == 1, timeout=300)["pid"] for h in hosts
                      if nnodes == 1 or _has_rank(h, 1))
        commits: dict[int, float] = {}
        while len(commits) < 10 or min(commits) > max(commits) - 9:
            x = peer.until(lambda x: "step" in x and x.get("contributors") == 2, timeout=300)
            commits[x["step"]] = x["received"]
        steps = sorted(commits)
        interval = statistics.median(commits[s] - commits[s - 1] for s in steps[1:] if s - 1 in commits)
        time.sleep(rng.uniform(0, interval))  # a random point within a step: the fault's schedule
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        back = None
        while back is None:
            x = peer.until(lambda x: "step" in x, timeout=300)
            commits[x["step"]] = x["received"]
            if x["contributors"] == 2 and x["received"] > killed + 0.5:
                back = x["received"]
        stops = [stopped_at(log, killed) for log in logs]
        after = sorted(t for t in commits.values() if t >= killed)
        gaps = [b - a for a, b in zip(after, after[1:], strict=False)]
        return {"stopped": max(s for s in stops if s is not None) - killed, "back": back - killed,
                "stall": max(gaps, default=0.0) - interval, "interval": interval}


def _has_rank(host: Proc, rank: int) -> bool:
    """Whether ``host``'s first JSON line names RANK ``rank`` (it is put back for ``until``)."""
    x = host.until(lambda x: "rank" in x, timeout=300)
    host.lines.put(x)
    return x["rank"] == rank


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    args = p.parse_args()
    cases = args.cases.split(",")
    unknown = [case for case in cases if case not in CASES]
    if unknown:
        p.error(f"--cases: unknown {', '.join(map(repr, unknown))}; the cases are {', '.join(CASES)}")
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="fthsdp-group-restart-"))
    results = {case: [trial(CASES[case], rng, work) for _ in range(args.trials)] for case in cases}
    print(f"{args.trials} trials per case, medians (each trial in brackets); a rank of r1 SIGKILLed")
    print("| victim group | every host stopped | trains again | peer stall | peer step |")
    print("|---|---:|---:|---:|---:|")
    for case, runs in results.items():
        cells = []
        for key in ("stopped", "back", "stall", "interval"):
            values = [r[key] for r in runs]
            cells.append(f"{statistics.median(values):.2f} s ({', '.join(f'{v:.2f}' for v in values)})")
        print(f"| {case} | " + " | ".join(cells) + " |")
    if len(results) < len(CASES):
        return
    base, multi = (results[case] for case in CASES)
    ratio = {k: statistics.median(r[k] for r in multi) / max(statistics.median(r[k] for r in base), 1e-9)
             for k in ("stopped", "back")}
    print(f"\ntwo hosts / one host: every host stopped {ratio['stopped']:.2f}x, trains again {ratio['back']:.2f}x")


if __name__ == "__main__":
    main()
