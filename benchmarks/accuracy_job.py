"""One training job of the accuracy benchmark (accuracy.py): a coordinator,
one ``fthsdp agent`` per replica training fthsdp.examples.gpt.train to a number
of samples, failures injected on the way, and the ranks' JSON lines read back.

A failure is the training rank's own SIGKILL at a chosen step (train.py
``--fail-at-step``, so that it lands on the same step in every run). A short
outage: its agent restarts it at once and it catches up from a peer. A long
one: its agent gives up (``--max-restarts 0``) and a new agent for the same
replica is started once the others have committed ``out_steps`` more steps;
it catches up and rejoins.

Every process runs as the demo's children do (fthsdp/demo/children.py):
in a session of its own, dying with this one, and stopped at the end.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

from fthsdp.demo.children import Children
from fthsdp.demo.record import json_objects

TRAIN_MODULE = "fthsdp.examples.gpt.train"
COORDINATOR_FLAGS = ("--heartbeat-interval", "200ms", "--heartbeat-timeout", "2s", "--join-timeout", "2s")
AGENT_FLAGS = ("--restart-backoff", "0", "--stop-timeout", "5s")
"""--restart-backoff 0: a rank killed within a minute of its start is not a crash loop here."""


class JobFailed(Exception):
    """The job did not train to the end (a process died, a deadline passed)."""


@dataclasses.dataclass(frozen=True)
class Outage:
    """One replica's failure."""

    replica: int
    """Index of the replica whose training rank is SIGKILLed."""

    step: int
    """The rank kills itself when it is about to train this step."""

    out_steps: int = 0
    """0: its agent restarts it at once. More: it stays out until the others
    have committed ``step + out_steps``, then a new agent starts it."""

    def __post_init__(self) -> None:
        if self.replica < 0 or self.step < 1 or self.out_steps < 0:
            raise ValueError(f"an outage needs a replica >= 0, a step >= 1 and out_steps >= 0: {self}")


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """What one run trains."""

    name: str
    """How the table and the plot call the run."""
    seed: int
    """The example's --seed: initial weights and the order of the training data."""
    samples: int
    """Train until the job as a whole has trained on this many samples."""
    replicas: int = 3
    """Replica groups, one ``fthsdp agent`` with one rank each."""
    batch_size: int = 8
    """Samples per replica per step without ``global_batch``, and per validation batch (the example's --batch-size)."""
    global_batch: int = 0
    """Samples per step, split among the replicas training it (the example's --global-batch); 0: ``batch_size`` each."""
    eval_every: int = 25
    """Validation loss every this many steps and at the end (the example's --eval-every)."""
    decay_lr: bool = True
    """The example's --decay-lr (cosine decay over the samples); False: a constant learning rate."""
    outages: tuple[Outage, ...] = ()
    """The failures, at most one per replica."""

    def __post_init__(self) -> None:
        if self.samples < 1 or self.replicas < 2 or self.batch_size < 1 or self.eval_every < 1:
            raise ValueError(f"a job needs samples >= 1, replicas >= 2, batch_size >= 1, eval_every >= 1: {self}")
        if self.global_batch and self.global_batch < self.replicas:
            raise ValueError(f"a global batch of {self.global_batch} leaves some of {self.replicas} replicas no sample")
        victims = [o.replica for o in self.outages]
        if len(set(victims)) != len(victims) or not all(v < self.replicas for v in victims):
            raise ValueError(f"each outage needs a replica of its own among the {self.replicas}: {victims}")


@dataclasses.dataclass
class JobResult:
    """What the ranks reported."""

    name: str
    steps: int
    """The last committed step."""
    samples: int
    """Samples trained on, as the ranks counted them (train.py's counter)."""
    samples_from_steps: int
    """The same, summed here over the committed steps' contributors x samples per replica."""
    failures: int
    replica_steps_out: int
    """Replica-steps without a gradient from that replica (its share of a global
    batch taken by the others, or its own batch skipped)."""
    contributors: list[int]
    """Replicas whose gradient each committed step averaged."""
    step_samples: list[int]
    """Samples each committed step averaged (contributors x samples per replica)."""
    train: list[tuple[int, float]]
    """(samples after the step, mean loss of the replicas' batches) per committed step."""
    val: list[tuple[int, float]]
    """(samples, validation loss) at every evaluation."""
    val_by_step: dict[int, float]
    """Validation loss by step, at every evaluation."""
    val_disagreements: int
    """Evaluations where the replicas' validation losses differed (0 expected: equal states)."""
    wall_s: float

    @property
    def final_val(self) -> float:
        return self.val[-1][1]


class _Lines:
    """The ranks' JSON lines by replica, and a condition to wait on."""

    def __init__(self) -> None:
        self.by_replica: dict[str, list[dict]] = defaultdict(list)
        self.coordinator_address = ""
        self.top_step = 0
        """The highest step any replica committed."""
        self.cond = threading.Condition()

    def rank_line(self, replica: str, text: str) -> None:
        objects = json_objects(text)  # several after a rank SIGKILLed before its newline (fthsdp/demo/record.py)
        if not objects:
            return
        with self.cond:
            for obj in objects:
                self.by_replica[replica].append(obj)
                if "loss" in obj:
                    self.top_step = max(self.top_step, obj["step"])
            self.cond.notify_all()

    def coordinator_line(self, text: str) -> None:
        if "listening on " in text:
            with self.cond:
                self.coordinator_address = text.split("listening on ")[1].split()[0]
                self.cond.notify_all()

    def wait(self, predicate, deadline: float, what: str, check) -> None:
        with self.cond:
            while not predicate():
                check()
                if time.monotonic() > deadline:
                    raise JobFailed(f"timed out waiting for {what}")
                self.cond.wait(0.2)


def run_job(spec: JobSpec, logdir: Path, timeout: float) -> JobResult:
    """Train ``spec`` with real processes; logs under ``logdir``."""
    logdir.mkdir(parents=True, exist_ok=True)
    children = Children(logdir)
    lines = _Lines()
    began = time.monotonic()
    deadline = began + timeout
    ids = [f"r{i}" for i in range(spec.replicas)]
    outages = {f"r{o.replica}": o for o in spec.outages}
    agents = {}

    def start_agent(replica: str, name: str, fail_at: int | None, max_restarts: int) -> None:
        train = [sys.executable, "-m", TRAIN_MODULE, "--steps", "1000000000", "--samples", str(spec.samples),
                 "--batch-size", str(spec.batch_size), "--global-batch", str(spec.global_batch), "--seed",
                 str(spec.seed), "--log-every", "1", "--eval-every", str(spec.eval_every)]
        train += ["--decay-lr"] if spec.decay_lr else []
        if fail_at is not None:
            train += ["--fail-at-step", str(fail_at)]
        agents[name] = children.start(name, Children.python(
            "fthsdp", "agent", "--coordinator", lines.coordinator_address, "--replica-id", replica,
            "--num-replicas", str(spec.replicas), "--max-restarts", str(max_restarts), *AGENT_FLAGS, "--", *train,
        ), on_line=lambda text, t, r=replica: lines.rank_line(r, text), stops_first=True)

    def check() -> None:
        if coordinator.proc.poll() is not None:
            raise JobFailed(f"the coordinator exited ({coordinator.proc.returncode}):\n{coordinator.log_tail()}")
        for name, agent in agents.items():
            code = agent.proc.poll()
            gave_up = name in outages and outages[name].out_steps and code == 1  # as meant: --max-restarts 0
            if code not in (None, 0) and not gave_up:
                raise JobFailed(f"the agent {name} exited with {code}:\n{agent.log_tail()}")

    try:
        coordinator = children.start("coordinator", Children.python(
            "fthsdp", "coordinator", "--bind", "127.0.0.1:0", "--min-replicas", "1",
            *COORDINATOR_FLAGS), on_line=lambda text, t: lines.coordinator_line(text))
        lines.wait(lambda: lines.coordinator_address, deadline, "the coordinator's start", lambda: None)
        for replica in ids:
            o = outages.get(replica)
            start_agent(replica, replica, o.step if o else None, 0 if o and o.out_steps else 3)
        for replica, o in sorted(outages.items(), key=lambda x: x[1].step):
            if not o.out_steps:
                continue
            agent = agents[replica]
            lines.wait(lambda agent=agent: agent.proc.poll() is not None, deadline, f"{replica}'s agent giving up",
                       check)
            lines.wait(lambda o=o: lines.top_step >= o.step + o.out_steps, deadline,
                       f"the others reaching step {o.step + o.out_steps}", check)
            start_agent(replica, f"{replica}-back", None, 3)
        lines.wait(lambda: all(a.proc.poll() is not None for a in agents.values()), deadline,
                   "every replica training to the end", check)
        check()
    finally:
        children.stop_all()
    return _result(spec, lines.by_replica, ids, time.monotonic() - began)


def _result(spec: JobSpec, by_replica: dict[str, list[dict]], ids: list[str], wall_s: float) -> JobResult:
    done = {r: [o for o in by_replica[r] if "done" in o] for r in ids}
    finals = {r: d[-1]["samples"] for r, d in done.items() if d}
    if len(finals) != len(ids) or len(set(finals.values())) != 1:
        raise JobFailed(f"the replicas ended with different sample counts: {finals}")
    steps: dict[int, list[dict]] = defaultdict(list)
    evals: dict[int, list[dict]] = defaultdict(list)
    for r in ids:
        joined = False
        for o in by_replica[r]:
            if "start_step" in o:
                joined = o.get("catch_up") is not None
            elif "loss" in o:
                o = {**o, "stale": True} if joined else o  # a joiner's first step: a forward pass on a stale state
                joined = False
                steps[o["step"]].append(o)
            elif "val_loss" in o:
                evals[o["step"]].append(o)
    last = max(steps)
    missing = sorted(set(range(1, last + 1)) - set(steps))
    if missing:
        raise JobFailed(f"no replica reported committed steps {missing[:10]}")
    train, counted, out, per_step, step_samples = [], 0, 0, [], []
    for s in range(1, last + 1):
        contributors = {o["replicas"] for o in steps[s]}
        # Every member computes its share of a global batch alone: they must agree.
        shares = {o.get("batch", spec.batch_size) for o in steps[s]}
        if len(contributors) != 1 or len(shares) != 1:
            raise JobFailed(f"the replicas disagree on step {s}'s contributors {contributors} or shares {shares}")
        n = contributors.pop()
        per_step.append(n)
        step_samples.append(n * shares.pop())
        counted += step_samples[-1]
        out += spec.replicas - n
        losses = [o["loss"] for o in steps[s] if "stale" not in o] or [o["loss"] for o in steps[s]]
        train.append((counted, sum(losses) / len(losses)))
    val = [(evals[s][0]["samples"], evals[s][0]["val_loss"]) for s in sorted(evals)]
    val_by_step = {s: evals[s][0]["val_loss"] for s in sorted(evals)}
    disagreements = sum(len({o["val_loss"] for o in evals[s]}) > 1 for s in evals)
    failures = sum(1 for r in ids for o in by_replica[r] if "failing" in o)
    return JobResult(spec.name, last, finals[ids[0]], counted, failures, out, per_step, step_samples, train, val,
                     val_by_step, disagreements, wall_s)
