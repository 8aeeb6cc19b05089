"""A new cross-replica group per quorum against one group reconfigured in place, side by side.

    python benchmarks/groups.py [--trials 3]

Needs torch >= 2.14 (``dist._reconfigure``). Three replicas of
fthsdp.examples.gpt train under `fthsdp agent` against a real coordinator on
loopback, once with ``--cross-replica-groups per-quorum`` and once with
``reconfigure`` per trial, the order alternating from trial to trial. After
10 steps, at a random point within a step, replica r2's rank is SIGKILLed;
its agent starts it again and it rejoins (a quorum that drops a member, then
one that adds it). The replicas train until 15 steps after the rejoin, then
are stopped. For each mode, medians over the trials:

- the steady step of the three before the kill, and after the rejoin;
- the survivors' stall at the kill: the gap between r0's commits around it
  less the steady step, and the time from the kill to r0's next commit;
- the joiner's first step: from its start line (``Manager.start`` returned:
  admitted and caught up) to its first commit, which includes meeting the
  quorum's group;
- the survivors' stall at the join: the gap between r0's commits around the
  joiner's first step less the steady step.

The last column is reconfigure / per-quorum for each figure, measured in the same run.
"""

from __future__ import annotations

import argparse
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

MODES = ("per-quorum", "reconfigure")
KILL_AFTER = 10
FIGURES = {
    "steady": "steady step, before the kill (ms)",
    "stall_kill": "survivors' stall at the kill (ms)",
    "kill_to_commit": "kill to r0's next commit (ms)",
    "joiner_first": "joiner: start to its first commit (ms)",
    "stall_join": "survivors' stall at the join (ms)",
    "steady_after": "steady step, after the rejoin (ms)",
}


def trial(mode: str, rng: random.Random, work: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FTHSDP_FTAR_TIMEOUT": "60"}
    log = work / f"coordinator-{mode}-{rng.randrange(1 << 30)}.log"
    argv = [sys.executable, "-m", "fthsdp", "coordinator", "--bind", "127.0.0.1:0", "--min-replicas", "2",
            "--heartbeat-interval", "200ms", "--heartbeat-timeout", "1s"]
    coordinator, address = start_coordinator(argv, env, log)
    agents: list[Proc] = []
    try:
        for i in range(3):
            cmd = [sys.executable, "-m", "fthsdp", "agent", "--coordinator", address, "--replica-id", f"r{i}",
                   "--num-replicas", "3", "--max-restarts", "1", "--cross-replica-groups", mode,
                   "--", sys.executable, str(ROOT / "benchmarks" / "logged.py"), "fthsdp.examples.gpt.train",
                   "--steps", "1000000", "--log-every", "1"]
            agents.append(Proc(cmd, env, stderr_path=work / f"agent-r{i}-{mode}.log"))
        return measure(agents, rng)
    finally:
        for a in agents:
            a.stop()
        coordinator.stop()


def measure(agents: list[Proc], rng: random.Random) -> dict[str, float]:
    victim = agents[2].until(lambda x: "pid" in x)["pid"]
    commits: dict[int, float] = {}
    while len(commits) < KILL_AFTER:
        x = agents[0].until(lambda x: "step" in x and "t" in x)
        commits[x["step"]] = x["t"]
    steady = statistics.median(commits[s] - commits[s - 1] for s in range(6, KILL_AFTER + 1) if s - 1 in commits)
    time.sleep(rng.uniform(0, steady))
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    started = agents[2].until(lambda x: "pid" in x and x["pid"] != victim, timeout=300)
    first = agents[2].until(lambda x: "step" in x and "t" in x, timeout=300)
    while len([t for t in commits.values() if t > first["t"]]) < 15:
        x = agents[0].until(lambda x: "step" in x and "t" in x, timeout=300)
        commits[x["step"]] = x["t"]
    before_kill = max(s for s, t in commits.items() if t < killed_at)
    before_join = max(s for s, t in commits.items() if t < first["t"])
    after = sorted(s for s, t in commits.items() if t > first["t"])[5:15]
    steady_after = statistics.median(commits[s] - commits[s - 1] for s in after if s - 1 in commits)
    return {
        "steady": steady,
        "stall_kill": commits[before_kill + 1] - commits[before_kill] - steady,
        "kill_to_commit": commits[before_kill + 1] - killed_at,
        "joiner_first": first["t"] - started["t"],
        "stall_join": commits[before_join + 1] - commits[before_join] - steady_after,
        "steady_after": steady_after,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    import torch

    from fthsdp.agent.training.transport import reconfigure
    if not reconfigure.supported():
        p.error(f"torch {torch.__version__} cannot reconfigure a group (torch >= 2.14 can)")
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="fthsdp-groups-"))
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for t in range(args.trials):
        for mode in (MODES if t % 2 == 0 else MODES[::-1]):
            runs[mode].append(trial(mode, rng, work))
    print(f"torch {torch.__version__}, gloo on loopback, 3 replicas of fthsdp.examples.gpt, r2's rank SIGKILLed "
          f"after {KILL_AFTER} steps and restarted; medians of {args.trials} trials per mode (logs: {work})")
    print("| | per-quorum | reconfigure | reconfigure / per-quorum |")
    print("|---|---:|---:|---:|")
    for key, name in FIGURES.items():
        a, b = (1e3 * statistics.median(r[key] for r in runs[m]) for m in MODES)
        ratio = f"{b / a:.2f}" if a > 0 and b > 0 else "-"
        print(f"| {name} | {a:.1f} | {b:.1f} | {ratio} |")


if __name__ == "__main__":
    main()
