"""No loss of accuracy: the example trained to the same number of samples
with and without failures reaches the same validation loss.

    python benchmarks/accuracy.py [--samples 6000] [--global-batch 24] [--seed 0] [--spread-seed 1]
        [--eval-every 25] [--constant-lr] [--two-replica-control] [--png benchmarks/accuracy.png] [--logs DIR]

Every run is a real job on this machine: a coordinator and 3 ``fthsdp agent``
processes, each training fthsdp.examples.gpt.train (3.2M parameters, AdamW at
1e-3 decayed to 1e-4 over the samples, or constant with --constant-lr) with
``--samples N --global-batch 24 --seed S --decay-lr``: every step trains on
the same 24 samples whatever the quorum, split equally among the replicas
training it (8 each of 3, 12 each of 2 while a replica is out).
``--global-batch 0`` is the old mode: --batch-size (8) per replica, so a
step averages 16 samples instead of 24 while a replica is out.

1. no failure;
2. three kills: the training rank of r2, r1 and r0 is SIGKILLed at 1/4, 1/2
   and 3/4 of the failure-free run's steps; each agent restarts its rank at
   once, which catches up from a peer and rejoins;
3. one replica out for a third of the run: r1's rank is SIGKILLed at 1/4, its
   agent gives up (--max-restarts 0), and a new agent for r1 is started once
   the others have committed another third of the failure-free run's steps;
   it catches up and rejoins;
4. (the yardstick, unless --spread-seed -1) no failure with another seed:
   other initial weights and another data order, for the seed-to-seed spread;
5. (with --two-replica-control) no failure with 2 replicas: the same
   batches of 24 split in 2 (with --global-batch 0, steps of 16: what a
   failure run does while a replica is out).

Same number of samples: every run trains until the samples the job trained on
(each committed step adds the replicas whose gradient it averaged x their
share) reach --samples. With a global batch that is 24 a step, except in a
step where a replica fails (its share is lost: 16), so a failure run takes a
step more per failure; per replica, 16 a step while a replica is out. The
ranks count it themselves (the count travels with the state to a replica
that catches up); it is checked here against the committed steps' logged
contributors and shares, which every replica must agree on. The validation loss
is the mean over the same held-out batches (the corpus' last 10%, never
trained on) in every run, evaluated by every replica (their states are equal,
so are their losses: checked).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.accuracy_job import JobFailed, JobResult, JobSpec, Outage, run_job  # noqa: E402

DEFAULT_PNG = ROOT / "benchmarks" / "accuracy.png"
TARGET = 0.01
"""A failure run's final validation loss within 1% of the failure-free run's."""
STEPS_AFTER_LAST_KILL = 20
"""A killed replica needs some steps to restart and catch up before the others finish."""


@dataclasses.dataclass(frozen=True)
class AccuracyConfig:
    """What the benchmark runs."""

    samples: int = 6000
    """Samples every run trains on (the job's total over all replicas)."""

    seed: int = 0
    """The example's --seed (initial weights, data order) of the compared runs."""

    spread_seed: int = 1
    """The seed of a second failure-free run, the seed-to-seed yardstick; -1: none."""

    eval_every: int = 25
    """Validation loss every this many steps (and at the end)."""

    replicas: int = 3
    """Replica groups of one rank each."""

    batch_size: int = 8
    """Samples per validation batch, and per replica per step when ``global_batch`` is 0."""

    global_batch: int = 24
    """Samples per step, split equally among the replicas training it; 0: ``batch_size`` per replica."""

    decay_lr: bool = True
    """Decay the learning rate over the samples (the example's --decay-lr); False: constant."""

    two_replica_control: bool = False
    """Add a failure-free run of 2 replicas (the same global batch in 2 shares; per replica, smaller steps)."""

    timeout: float = 900.0
    """Seconds one run may take before the benchmark gives up on it."""

    def __post_init__(self) -> None:
        if self.replicas != 3:
            raise ValueError(f"--replicas: the failure schedules are written for 3 replicas, got {self.replicas}")
        if self.batch_size < 1:
            raise ValueError(f"--batch-size must be at least 1, got {self.batch_size}")
        whole = math.lcm(*range(1, self.replicas + 1))
        if self.global_batch < 0 or self.global_batch % whole:
            raise ValueError(f"--global-batch must be 0 or a multiple of {whole}, so that it splits evenly among any "
                             f"number of the {self.replicas} replicas, got {self.global_batch}")
        need = 4 * STEPS_AFTER_LAST_KILL * self.step_samples
        if self.samples < need:
            raise ValueError(f"--samples {self.samples} is too few: the last kill (at 3/4 of the run) needs "
                             f"{STEPS_AFTER_LAST_KILL} steps after it to recover; give --samples {need} or more")
        if self.eval_every < 1:
            raise ValueError(f"--eval-every must be at least 1, got {self.eval_every}")
        if self.seed < 0 or self.spread_seed < -1 or self.spread_seed == self.seed:
            raise ValueError(f"--seed must be >= 0 and --spread-seed another seed or -1, got {self.seed} and "
                             f"{self.spread_seed}")
        if self.timeout <= 0:
            raise ValueError(f"--timeout must be positive, got {self.timeout}")

    @property
    def step_samples(self) -> int:
        """Samples per step of the failure-free run."""
        return self.global_batch or self.replicas * self.batch_size

    @property
    def reference_steps(self) -> int:
        """Steps of the failure-free run: every replica contributes every step."""
        return math.ceil(self.samples / self.step_samples)

    def jobs(self) -> list[JobSpec]:
        s = self.reference_steps
        common = dict(samples=self.samples, replicas=self.replicas, batch_size=self.batch_size,
                      global_batch=self.global_batch, eval_every=self.eval_every, decay_lr=self.decay_lr)
        jobs = [
            JobSpec("no failure", self.seed, **common),
            JobSpec("3 kills (r2, r1, r0)", self.seed, outages=(
                Outage(2, s // 4), Outage(1, s // 2), Outage(0, 3 * s // 4)), **common),
            JobSpec(f"r1 out for {s // 3} steps", self.seed, outages=(Outage(1, s // 4, s // 3),), **common),
        ]
        if self.spread_seed >= 0:
            jobs.append(JobSpec(f"no failure, seed {self.spread_seed}", self.spread_seed, **common))
        if self.two_replica_control:
            jobs.append(JobSpec("no failure, 2 replicas", self.seed, **{**common, "replicas": 2}))
        return jobs


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")  # one line, not the usage block


def parse_args(argv: list[str] | None) -> tuple[AccuracyConfig, argparse.Namespace]:
    d = AccuracyConfig()
    p = _Parser(prog="accuracy.py", description=__doc__.split("\n")[0])
    p.add_argument("--samples", type=int, default=d.samples, help=f"samples per run (default {d.samples})")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the compared runs (default 0)")
    p.add_argument("--spread-seed", type=int, default=d.spread_seed,
                   help="seed of a second failure-free run, the yardstick; -1: none (default 1)")
    p.add_argument("--eval-every", type=int, default=d.eval_every, help="steps between validation losses")
    p.add_argument("--global-batch", type=int, default=d.global_batch,
                   help=f"samples per step, split among the replicas training it (default {d.global_batch}); "
                        "0: --batch-size per replica")
    p.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="samples per validation batch, and per replica per step with --global-batch 0 (default 8)")
    p.add_argument("--constant-lr", action="store_true",
                   help="train at a constant learning rate (default: cosine decay over the samples)")
    p.add_argument("--two-replica-control", action="store_true",
                   help="add a failure-free run of 2 replicas: the same samples in smaller steps")
    p.add_argument("--timeout", type=float, default=d.timeout, help="seconds one run may take (default 900)")
    p.add_argument("--png", default=str(DEFAULT_PNG), help="where to write the plot ('' for none)")
    p.add_argument("--logs", default="", help="folder for the processes' logs (default: a new temporary one)")
    a = p.parse_args(argv)
    try:
        config = AccuracyConfig(samples=a.samples, seed=a.seed, spread_seed=a.spread_seed, eval_every=a.eval_every,
                                batch_size=a.batch_size, global_batch=a.global_batch, decay_lr=not a.constant_lr,
                                two_replica_control=a.two_replica_control, timeout=a.timeout)
    except ValueError as e:
        p.error(str(e))
    if a.logs and Path(a.logs).exists() and not Path(a.logs).is_dir():
        p.error(f"--logs {a.logs}: exists and is not a folder")
    return config, a


def table(results: list[JobResult], reference_steps: int) -> str:
    """The final validation losses (same samples) and, for comparison, those
    at the failure-free run's last step (same steps, fewer samples)."""
    base = results[0]
    full = max(base.step_samples)
    rows = ["| run | steps | samples | failures | replica-steps out | steps short of the batch "
            f"| final validation loss | ratio to no failure | validation loss at step {reference_steps} | ratio |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        at = r.val_by_step.get(reference_steps)
        same_steps = (f"{at:.4f} | {at / base.val_by_step[reference_steps]:.4f}"
                      if at is not None and reference_steps in base.val_by_step else "- | -")
        short = sum(n < full for n in r.step_samples)
        rows.append(f"| {r.name} | {r.steps} | {r.samples:,} | {r.failures} | {r.replica_steps_out} | {short} | "
                    f"{r.final_val:.4f} | {r.final_val / base.final_val:.4f} | {same_steps} |")
    return "\n".join(rows)


def verdict(results: list[JobResult]) -> list[str]:
    base = results[0]
    lines = []
    for r in results[1:]:
        off = r.final_val / base.final_val - 1
        kind = ("a yardstick without failures" if r.failures == 0 else
                f"{'met' if abs(off) <= TARGET else 'MISSED'}; target within {TARGET:.0%}")
        lines.append(f"{r.name}: {off:+.2%} against the failure-free run ({kind})")
    return lines


def checks(results: list[JobResult]) -> list[str]:
    """What the runs must agree on whatever the losses; an empty list when they do."""
    problems = []
    for r in results:
        if r.samples != r.samples_from_steps:
            problems.append(f"{r.name}: the ranks counted {r.samples} samples, the committed steps' contributors "
                            f"add up to {r.samples_from_steps}")
        if r.val_disagreements:
            problems.append(f"{r.name}: the replicas' validation losses differed at {r.val_disagreements} evaluations")
    return problems


def main(argv: list[str] | None = None) -> int:
    config, a = parse_args(argv)
    logs = Path(a.logs) if a.logs else Path(tempfile.mkdtemp(prefix="fthsdp-accuracy-"))
    jobs = config.jobs()
    batch = (f"a global batch of {config.global_batch}" if config.global_batch else
             f"batch {config.batch_size} per replica")
    print(f"# No loss of accuracy: fthsdp.examples.gpt, {config.replicas} replicas, {batch}, "
          f"{config.samples:,} samples per run ({config.reference_steps} steps without failures), seed {config.seed}, "
          f"{'constant learning rate' if not config.decay_lr else 'learning rate decayed over the samples'}; "
          f"logs in {logs}/\n", flush=True)
    results = []
    try:
        for i, job in enumerate(jobs, 1):
            result = run_job(job, logs / f"run{i}", config.timeout)
            results.append(result)
            print(f"run {i}/{len(jobs)} ({job.name}): {result.steps} steps, {result.samples:,} samples, "
                  f"validation loss {result.final_val:.4f}, {result.wall_s:.0f} s", flush=True)
    except JobFailed as e:
        print(f"accuracy.py: run {len(results) + 1} ({jobs[len(results)].name}) failed: {e}\n"
              f"(logs in {logs}/run{len(results) + 1})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("accuracy.py: interrupted; every process it started is stopped", file=sys.stderr)
        return 130
    print("\n" + table(results, config.reference_steps) + "\n")
    for line in verdict(results) + checks(results):
        print(line)
    if a.png:
        from benchmarks.accuracy_plot import plot

        lr = "decayed" if config.decay_lr else "constant"
        plot(results, a.png, f"fthsdp.examples.gpt, {config.replicas} replicas, {batch}, "
                             f"{config.samples:,} samples per run, seed {config.seed}, {lr} learning rate")
        print(f"plot: {a.png}")
    return 1 if checks(results) else 0


if __name__ == "__main__":
    sys.exit(main())
