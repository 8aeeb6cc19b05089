"""Correlated failures, and what durable checkpoints save when they strike.

The failure model of the main tables draws every failure alone, on one
replica. Two kinds of event take many replicas at once:

- a *domain event* (a rack, a switch or a power feed): ``domain_share`` of
  the calibrated failures take every replica of one domain of
  ``domain_gpus`` GPUs (or ``domain_fraction`` of the replicas) instead of
  one replica. The total count of failures stays the calibrated one: the
  published counts are of interruptions, and such an event is one;
- a *whole-job event* (a preemption of the whole allocation, a power or
  network event taking every rack of the job): every replica at once, on
  average every ``whole_job_every_days`` days, on top of the calibrated
  failures.

Where the defaults come from (keep them modest: nothing in this repository
counts correlated events directly):

- ``domain_share`` 0.08: network switches and cables caused about 8% of the
  Llama 3 405B run's unexpected interruptions (Meta 2024, see
  docs/measurements.md). Taking every one of them as a domain event that
  loses its replicas is pessimistic: a cable takes one host, and a backend
  switch leaves its hosts' processes alive (failover.py's "data link down":
  two hang limits and a probe of stall, no state lost), where a domain
  event here stops them like a power loss (the heartbeat timeout, state
  lost, replacements in 10 minutes).
- ``domain_gpus`` 1,024 (8 replicas of 128 GPUs): assumed, no source here;
  replicas are taken to be placed whole inside domains, so a domain event
  takes ``ceil(domain_gpus / replica_gpus)`` replicas (at least one).
- ``whole_job_every_days`` 30: assumed, no source here.

When an event leaves no replica holding the state (every member lost and no
caught-up joiner left), the job has lost it:

- with checkpoints every ``interval_s`` of training (``Checkpoints``): the
  replicas come back (the replacement time), every one loads the newest
  complete checkpoint (``restore_s``) and the job goes on from its step:
  it loses the training since that checkpoint and the outage. This is what
  the coordinator's ``--auto-restore`` does: every replica loads the
  checkpoint, none catches up from another meanwhile;
- without: the state is lost until an operator gives it up (``operator_s``
  from the event, at least the replacement time), and the job starts over
  from step 0: it loses *all* its progress since the run began (modelled
  as that, not as a stall; see ``kept_share``).

The steady cost of checkpoints: each save costs ``save_cost`` of one step
(the staging copy of the replica's 1/R share blocks the step that saves; the
background write competes for the host and the network), so the step time
grows by ``save_cost / K`` at a save every K steps. Assumed 0.5 until
benchmarks/checkpoint.py measures it; the staging copy alone is far less
(at 781 replicas a GPU stages 38 GB / 781 = 49 MB, 1 ms at the 55 GB/s
pinned device-to-host copy of docs/measurements.md).

The restore time is an estimate until benchmarks/checkpoint.py measures it:
every replica loads the whole state (fthsdp's restore: each rank of each
replica reads its part), so the job reads R copies of it, at the checkpoint
store's aggregate read bandwidth (``restore_read_gbs``, assumed 1,000 GB/s):
405B x 12 B = 4.86 TB x 781 replicas = 3.8 PB, 63 min at 100,000 GPUs.

Whole-job events are too rare to sample in a simulated day or two (one a
month), so the correlated-failure table simulates the independent and domain
failures and charges whole-job events at their expected cost
(``with_whole_job_events``, ``kept_share``), checked against the engine's
own handling of them in tests/test_goodput_correlated.py.
"""

from __future__ import annotations

import dataclasses
import math

DAY = 86400.0
MIN = 60.0
GB = 1e9

DOMAIN_SHARE = 0.08
DOMAIN_GPUS = 1024
WHOLE_JOB_EVERY_DAYS = 30.0
RESTORE_READ_GBS = 1000.0
SAVE_COST = 0.5
OPERATOR_MIN = 60.0
RUN_DAYS = 30.0
TABLE_CHECKPOINT_MIN = (10.0, 30.0, 60.0)


@dataclasses.dataclass(frozen=True)
class Correlated:
    """Events that take several replicas, or all of them, at once."""

    domain_share: float = DOMAIN_SHARE
    """Share of the calibrated failures that take a whole domain instead of one replica."""
    domain_gpus: int = DOMAIN_GPUS
    """GPUs in a domain (a rack, a switch's or a power feed's hosts)."""
    domain_fraction: float = 0.0
    """If > 0: a domain is this share of the job's replicas instead (``domain_gpus`` unused)."""
    whole_job_every_days: float = WHOLE_JOB_EVERY_DAYS
    """Mean days between events that take every replica (0: none)."""

    def __post_init__(self):
        if not 0 <= self.domain_share <= 1:
            raise ValueError("Correlated.domain_share must be within [0, 1]")
        if self.domain_gpus < 1:
            raise ValueError("Correlated.domain_gpus must be at least 1")
        if not 0 <= self.domain_fraction <= 1:
            raise ValueError("Correlated.domain_fraction must be within [0, 1]")
        if self.whole_job_every_days < 0:
            raise ValueError("Correlated.whole_job_every_days must not be negative")

    def domain_replicas(self, replicas: int, replica_gpus: int) -> int:
        """Replicas one domain event takes (replicas placed whole inside domains)."""
        if self.domain_fraction > 0:
            n = math.ceil(self.domain_fraction * replicas - 1e-9)
        else:
            n = math.ceil(self.domain_gpus / replica_gpus)
        return max(1, min(replicas, n))

    @property
    def whole_job_rate_per_s(self) -> float:
        return 1.0 / (self.whole_job_every_days * DAY) if self.whole_job_every_days > 0 else 0.0

    @property
    def off(self) -> bool:
        return self.domain_share == 0 and self.whole_job_rate_per_s == 0


@dataclasses.dataclass(frozen=True)
class Checkpoints:
    """Durable checkpoints: how often, what a restore costs, and without them."""

    interval_s: float = 0.0
    """A checkpoint every this many seconds of training (K steps x the step); 0: none."""
    restore_s: float = 0.0
    """Every replica loading the newest checkpoint, once they are back."""
    save_cost: float = SAVE_COST
    """What one save costs, as a share of one step's time."""
    operator_s: float = OPERATOR_MIN * MIN
    """Without checkpoints: the state loss -> an operator's give-up-state (the job then starts over)."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"Checkpoints.{f.name} must not be negative")

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0

    def steady_factor(self, step_s: float) -> float:
        """Step time with saves / without: ``save_cost`` of a step every ``interval_s / step_s`` steps."""
        return 1.0 + self.save_cost * step_s / self.interval_s if self.enabled else 1.0

    def outage_s(self, replacement_s: float) -> float:
        """A state loss -> the job trains again (its replicas replaced, then the
        checkpoint loaded; or the operator's give-up, the replicas back too)."""
        if self.enabled:
            return replacement_s + self.restore_s
        return max(replacement_s, self.operator_s)


def restore_estimate_s(state_bytes: float, loaders: int, read_gbs: float = RESTORE_READ_GBS) -> float:
    """``loaders`` replicas each reading the whole ``state_bytes`` from a store
    that serves ``read_gbs`` GB/s in all (an estimate until measured)."""
    if state_bytes < 0 or loaders < 1 or not read_gbs > 0:
        raise ValueError("state bytes not negative, at least one loader, a positive bandwidth")
    return loaders * state_bytes / (read_gbs * GB)


@dataclasses.dataclass(frozen=True)
class Rollback:
    """Where a state loss leaves the job: its progress and its step clock."""

    progress_s: float
    """Progress kept (job-seconds at the full batch)."""
    trained_s: float
    """Training time the step counter stands at (the checkpoint's step x the step time)."""
    lost_s: float
    """Progress thrown away."""


def roll_back(progress_s: float, trained_s: float, checkpoint_progress_s: float, checkpoint_trained_s: float,
              checkpoints: Checkpoints) -> Rollback:
    """A state loss: back to the newest checkpoint, or to step 0 without one."""
    if checkpoints.enabled:
        return Rollback(checkpoint_progress_s, checkpoint_trained_s, progress_s - checkpoint_progress_s)
    return Rollback(0.0, 0.0, progress_s)


def kept_share(rate_per_s: float, run_s: float, outage_s: float) -> float:
    """Expected share of a run of ``run_s`` whose training survives to its end
    when whole-job events (Poisson, ``rate_per_s``) each throw away all the
    progress so far and stop training for ``outage_s``: what is kept is the
    training after the last event's outage. Exact: with the last event at
    ``run_s - u`` (density rate x exp(-rate u)), the run keeps ``u - outage``."""
    if rate_per_s < 0 or not run_s > 0 or outage_s < 0:
        raise ValueError("rate and outage not negative, a positive run")
    x = rate_per_s * run_s
    if x == 0:
        return 1.0
    w = max(0.0, run_s - outage_s) * rate_per_s
    after_last = math.exp(-rate_per_s * outage_s) * (1 - math.exp(-w) * (1 + w)) / x
    return math.exp(-x) + after_last


def with_whole_job_events(effective: float, rate_per_s: float, cost_s: float) -> float:
    """The effective training time of a job that also loses ``cost_s`` (an
    outage plus the training since the newest checkpoint) to each whole-job
    event, at ``rate_per_s``: to first order in ``rate x cost``, as in the
    additive accounting (calibration.py), the job losing that share of the
    time it would have trained."""
    if rate_per_s < 0 or cost_s < 0:
        raise ValueError("rate and cost must not be negative")
    return max(0.0, effective * (1 - rate_per_s * cost_s))


def checkpoint_event_cost_s(checkpoints: Checkpoints, replacement_s: float) -> float:
    """A whole-job event's expected cost with checkpoints: the outage plus half
    an interval of training lost (the events fall anywhere between saves)."""
    if not checkpoints.enabled:
        raise ValueError("without checkpoints an event costs the whole run so far: use kept_share")
    return checkpoints.outage_s(replacement_s) + checkpoints.interval_s / 2
