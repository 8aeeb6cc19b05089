"""What a simulated job did (``RunResult``, both engines), and the
synchronous engine: every failure restarts the whole job. The replicated
engine, where replicas fail alone, is engine.py."""

from __future__ import annotations

import dataclasses
import random

SECONDS_PER_HOUR = 3600.0
DAY = 86400.0


@dataclasses.dataclass(frozen=True)
class QuorumChange:
    """One quorum that ``decide`` formed during a run."""

    time_s: float
    quorum_id: int
    members: int
    reason: str


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What one simulated job did."""

    horizon_s: float
    failures: int
    effective: float
    """Share of replica-time spent training (the published 'effective training time')."""
    stall_per_failure_s: float
    """Whole-job stall charged per failure (restarts, survivors' stalls, joins)."""
    replica_out_s: float | None = None
    """Mean time from a replica's failure to its admission back; None: synchronous."""
    quorum_changes: tuple[QuorumChange, ...] = ()
    decisions: int = 0
    """Calls to ``decide``."""
    catch_up_assignments: int = 0
    """Registrations that ``decide`` gave a catch-up source."""
    domain_events: int = 0
    """Failures that took a whole domain (counted in ``failures`` too)."""
    whole_job_events: int = 0
    """Events that took every replica (not counted in ``failures``)."""
    state_losses: int = 0
    """Times no replica was left holding the state."""
    lost_progress_s: float = 0.0
    """Training thrown away by those losses (job-seconds at the full batch)."""
    outage_s: float = 0.0
    """Time after those losses before the replicas could train (replacement, restore)."""

    @property
    def failures_per_day(self) -> float:
        return self.failures * DAY / self.horizon_s


def simulate_synchronous(
    gpus: int,
    rate_per_gpu_hour: float,
    horizon_s: float,
    rng: random.Random,
    restart_s: float,
    checkpoint_interval_s: float = 0.0,
    extra_rate_per_s: float = 0.0,
) -> RunResult:
    """Every failure stalls the whole job for ``restart_s`` plus the training
    done since the last checkpoint (every ``checkpoint_interval_s`` of training;
    0: the restart figure already includes it). A failure during a restart is
    found when the job resumes and costs a restart of its own.
    ``extra_rate_per_s``: more events that restart the job (whole-job events;
    a domain event is one failure to it, like any other)."""
    if restart_s < 0 or checkpoint_interval_s < 0 or horizon_s <= 0 or extra_rate_per_s < 0:
        raise ValueError("restart, checkpoint interval, extra rate and horizon must not be negative")
    rate = rate_per_gpu_hour * gpus / SECONDS_PER_HOUR + extra_rate_per_s
    t = busy_until = progress = charged = 0.0
    failures = 0
    while True:
        t += rng.expovariate(rate)
        if t >= horizon_s:
            break
        failures += 1
        lost = 0.0
        if t > busy_until:
            progress += t - busy_until
            if checkpoint_interval_s > 0:
                lost = progress % checkpoint_interval_s
                progress -= lost
            busy_until = t
        busy_until += restart_s
        charged += restart_s + lost
    progress += max(0.0, horizon_s - busy_until)
    return RunResult(horizon_s, failures, progress / horizon_s, charged / failures if failures else 0.0)
