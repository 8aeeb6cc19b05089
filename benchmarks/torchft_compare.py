"""fthsdp and torchft 0.2.0 side by side: same model, machine and timeouts.

    python benchmarks/torchft_compare.py [--steps 40] [--kill-at 12]

torchft runs in the benchmark's own environment (benchmarks/.torchft-venv,
created on first use with torch 2.13.0 and torchft 0.2.0; never a dependency
of fthsdp), as its docs prescribe: a `torchft_lighthouse` and each replica
under `torchrun`. Both systems train fthsdp.examples.gpt with 2 replicas of 1 rank,
a 1 s heartbeat timeout, gloo. Reported per system: the steady step time
(median after 5 warm-up steps, no failure) and, in a second run, what the
surviving replica sees when the other's training process is SIGKILLed at
step --kill-at, at a random point of the following step: the time from the
kill to its next commit, and the steps it discarded (did not commit).
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import signal
import statistics
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "benchmarks" / ".torchft-venv"
sys.path.insert(0, str(ROOT))

from jsonproc import Proc  # noqa: E402

from fthsdp.testing.local_etcd import free_port  # noqa: E402


def torchft_python() -> Path:
    python = VENV / "bin" / "python"
    if not (VENV / "bin" / "torchft_lighthouse").exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        # torch first and pinned, so torchft does not pull a CUDA build.
        subprocess.run([str(python), "-m", "pip", "install", "-q", "torch==2.13.0", "numpy"], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "torchft==0.2.0"], check=True)
    return python


def run_torchft(steps: int, kill_at: int | None) -> list[dict]:
    python = torchft_python()
    port = free_port()
    env = {**os.environ, "PYTHONPATH": ""}
    lighthouse = Proc([str(VENV / "bin" / "torchft_lighthouse"), "--min_replicas", "1", "--bind",
                       f"127.0.0.1:{port}", "--join_timeout_ms", "1000", "--heartbeat_timeout_ms", "1000"], env)
    replicas = []
    for i in range(2):
        renv = {**env, "REPLICA_GROUP_ID": str(i), "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{port}"}
        replicas.append(Proc([str(python), "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=1",
                              "--master_addr=127.0.0.1", f"--master_port={free_port()}",
                              "benchmarks/torchft_train.py", "--steps", str(steps)], renv))
    return _observe(replicas, [lighthouse], steps, kill_at)


def run_fthsdp(steps: int, kill_at: int | None) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "fthsdp", "coordinator", "--bind", "127.0.0.1:0", "--min-replicas", "1",
         "--heartbeat-interval", "200ms", "--heartbeat-timeout", "1s"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT, start_new_session=True,
    )
    address = coordinator.stdout.readline().split("listening on ")[1].split()[0]
    replicas = [
        Proc([sys.executable, "-m", "fthsdp", "agent", "--coordinator", address, "--replica-id", f"r{i}",
              "--num-replicas", "2", "--max-restarts", "0", "--", sys.executable, "-m", "fthsdp.examples.gpt.train",
              "--steps", str(steps), "--log-every", "1"], env)
        for i in range(2)
    ]
    try:
        return _observe(replicas, [], steps, kill_at, fthsdp=True)
    finally:
        coordinator.kill()
        coordinator.wait()


def _observe(replicas, others, steps, kill_at, fthsdp: bool = False) -> list[dict]:
    try:
        victim = replicas[1].until(lambda x: "pid" in x)["pid"]
        lines = []
        killed = False
        while True:
            x = replicas[0].until(lambda x: "step" in x or "done" in x)
            if "done" in x:
                break
            x.setdefault("committed", True)  # fthsdp never discards a step
            lines.append(x)
            if kill_at is not None and x["step"] == kill_at and not killed:
                # At a random point of the next step (forward, backward or all-reduce).
                time.sleep(_rng.uniform(0, steady(lines) if len(lines) > 7 else 0.2))
                killed = True
                x["kill"] = time.monotonic()
                os.kill(victim, signal.SIGKILL)
            if x["step"] >= steps and x["committed"]:
                break
        return lines
    finally:
        for r in replicas + others:
            r.stop()


_rng = random.Random(0)


def steady(lines: list[dict]) -> float:
    t = [x["t"] for x in lines if x["committed"]]
    return statistics.median(b - a for a, b in pairwise(t[5:]))


def failure(lines: list[dict]) -> tuple[float, int]:
    k = next(i for i, x in enumerate(lines) if "kill" in x)
    after = next(x for x in lines[k + 1:] if x["committed"])
    discarded = sum(1 for x in lines[k + 1:] if not x["committed"])
    return after["t"] - lines[k]["kill"], discarded


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--kill-at", type=int, default=12)
    p.add_argument("--trials", type=int, default=3)
    args = p.parse_args()
    systems = (("fthsdp", run_fthsdp), ("torchft 0.2.0", run_torchft))
    results = {name: {"step": [], "gap": [], "discarded": 0, "stuck": 0} for name, _ in systems}
    for _ in range(args.trials):  # interleaved, so machine noise hits both
        for name, run in systems:
            try:
                step = steady(run(args.steps, None))
                gap, discarded = failure(run(args.steps, args.kill_at))
            except queue.Empty:  # a run that printed nothing for 3 minutes
                results[name]["stuck"] += 1
                continue
            results[name]["step"].append(step)
            results[name]["gap"].append(gap)
            results[name]["discarded"] += discarded
    print(f"2 replicas of fthsdp.examples.gpt, heartbeat timeout 1 s, {args.trials} trials each "
          "(medians; all trials in brackets)")
    print("| system | steady step | SIGKILL of the other replica -> survivor's next commit |"
          " steps discarded (all trials) | trials stuck |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        if not r["gap"]:
            print(f"| {name} | - | - | - | {r['stuck']} |")
            continue
        gaps = ", ".join(f"{g:.2f}" for g in r["gap"])
        print(f"| {name} | {statistics.median(r['step']) * 1e3:.0f} ms | "
              f"{statistics.median(r['gap']):.2f} s [{gaps}] | {r['discarded']} | {r['stuck']} |")


if __name__ == "__main__":
    main()
