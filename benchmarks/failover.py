"""How long the surviving replicas stall when one replica fails.

    python benchmarks/failover.py [--trials 3] [--heartbeat-timeout 1s]

Three replicas of examples/gpt run under `fthsdp agent` against a real
coordinator on loopback. After 10 steps, at a random point within a step, one
replica fails in one of three ways:

- rank killed: SIGKILL of its training process (its agent sees the exit);
- node lost: SIGKILL of its agent and training process together;
- node hung: SIGSTOP of both (only the heartbeat timeout can tell).

For the first surviving replica the table gives the gap between its last
commit before the failure and its first commit after it, the normal step
interval before the failure, their difference (the stall), and the steps it
discarded (committed step numbers must stay contiguous: 0 expected).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jsonproc import Proc  # noqa: E402
CASES = ("rank killed", "node lost", "node hung")


def trial(case: str, heartbeat_timeout: str, rng: random.Random) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FTHSDP_FTAR_TIMEOUT": "60"}
    coordinator = Proc([sys.executable, "-m", "coordinator", "--bind", "127.0.0.1:0", "--min-replicas", "2",
                        "--heartbeat-interval", "200ms", "--heartbeat-timeout", heartbeat_timeout], env, pump=False)
    address = None
    while address is None:
        line = coordinator.p.stdout.readline()
        if "listening on" in line:
            address = line.split("listening on ")[1].split()[0]
    agents = [
        Proc([sys.executable, "-m", "coordinator.cli", "agent", "--coordinator", address, "--replica-id", f"r{i}",
              "--num-replicas", "3", "--max-restarts", "0", "--", sys.executable, "examples/gpt/train.py",
              "--steps", "40", "--log-every", "1"], env)
        for i in range(3)
    ]
    try:
        victim_pid = agents[2].until(lambda x: "pid" in x)["pid"]
        commits = {}
        while len(commits) < 10:
            x = agents[0].until(lambda x: "step" in x)
            commits[x["step"]] = x["t"]
        intervals = [commits[s] - commits[s - 1] for s in range(6, 11)]
        time.sleep(rng.uniform(0, statistics.median(intervals)))
        failed_at = time.monotonic()
        if case == "rank killed":
            os.kill(victim_pid, signal.SIGKILL)
        else:
            # The agent and its rank (the rank runs in a session of its own).
            sig = signal.SIGKILL if case == "node lost" else signal.SIGSTOP
            os.killpg(agents[2].p.pid, sig)
            os.kill(victim_pid, sig)
        while True:
            x = agents[0].until(lambda x: "step" in x or "done" in x)
            if "done" in x:
                break
            commits[x["step"]] = x["t"]
        before = max(s for s, t in commits.items() if t < failed_at)
        gap = commits[before + 1] - commits[before]
        steps = sorted(commits)
        discarded = (steps[-1] - steps[0] + 1) - len(steps)
        return {"gap": gap, "interval": statistics.median(intervals), "discarded": discarded,
                "detect": commits[before + 1] - failed_at}
    finally:
        for a in agents:
            a.stop()
        coordinator.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--heartbeat-timeout", default="1s")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cases", default=",".join(CASES))
    args = p.parse_args()
    rng = random.Random(args.seed)
    print(f"heartbeat timeout {args.heartbeat_timeout}, 3 replicas of examples/gpt, {args.trials} trials per case (medians)")
    print("| failure | gap between commits | normal step interval | stall (gap - interval) | failure to next commit | steps discarded |")
    print("|---|---:|---:|---:|---:|---:|")
    for case in args.cases.split(","):
        runs = [trial(case, args.heartbeat_timeout, rng) for _ in range(args.trials)]
        med = {k: statistics.median(r[k] for r in runs) for k in ("gap", "interval", "detect")}
        print(f"| {case} | {med['gap']:.2f} s | {med['interval']:.2f} s | {med['gap'] - med['interval']:.2f} s | "
              f"{med['detect']:.2f} s | {sum(r['discarded'] for r in runs)} |", flush=True)


if __name__ == "__main__":
    main()
