"""The simulated modes and one cell of the table (a mode at a job size).

- ``synchronous``: every failure stalls the whole job for the published 10
  minutes (detection, rescheduling, communicator initialisation, checkpoint
  load and the work lost since the last checkpoint, together).
- ``ft-hsdp``: the published FT-HSDP figure, a 3-minute stall of the whole
  job per failure, in 8 replicas; the failed replica is back after 10 min.
- ``fthsdp``: this project, at the measured costs scaled to a 405B model in
  128-GPU replicas (inputs.py), quorum changes by ``fthsdp.coordinator.decisions.quorum.decide``.
- ``fthsdp-pessimistic``: the same with every unmeasured cost at a bad value.
"""

from __future__ import annotations

import dataclasses
import random

from benchmarks.goodput import calibration as cal
from benchmarks.goodput import inputs
from benchmarks.goodput.correlated import Checkpoints, Correlated
from benchmarks.goodput.engine import ReplicatedSim
from benchmarks.goodput.synchronous import RunResult, simulate_synchronous

GPU_COUNTS = (1024, 2048, 4096, 8192, 16_384, 32_768, 65_536, 100_000, 131_072, 200_000)
DEFAULT_WORKLOAD = inputs.Workload()
"""The workload a cell simulates unless told another (immutable: one instance serves every call)."""


@dataclasses.dataclass(frozen=True)
class Mode:
    key: str
    label: str
    budget: float
    """Failures simulated per cell, as a multiple of ``--failures``: a synchronous
    failure costs microseconds to simulate, an fthsdp one three decisions over
    up to 1,562 replicas (tens of milliseconds)."""


MODES = {
    m.key: m
    for m in (
        Mode("synchronous", "synchronous (10 min stall)", 100),
        Mode("ft-hsdp", "FT-HSDP published (3 min stall)", 25),
        Mode("fthsdp", "fthsdp (measured costs)", 1),
        Mode("fthsdp-pessimistic", "fthsdp (unmeasured costs at worst)", 1),
    )
}


@dataclasses.dataclass(frozen=True)
class Cell:
    """One mode at one job size, simulated."""

    mode: str
    gpus: int
    """GPUs in the simulated job (the requested count rounded to whole replicas)."""
    replicas: int
    calibration: cal.Calibration
    result: RunResult
    steady_factor: float = 1.0
    requested: int = 0
    """The size asked for (``gpus`` may differ by rounding to whole replicas)."""

    @property
    def goodput(self) -> float:
        """Effective training time discounted by the mode's steady cost per step."""
        return self.result.effective / self.steady_factor


def cell_rng(seed: int, mode: str, calibration: str, gpus: int) -> random.Random:
    # A string seed is hashed with SHA-512: the same on every run and platform.
    return random.Random(f"{seed}/{mode}/{calibration}/{gpus}")


def horizon_s(failures: float, rate_per_gpu_hour: float, gpus: int) -> float:
    """The wall-clock time in which ``failures`` failures are expected."""
    return failures / (rate_per_gpu_hour * gpus) * 3600.0


def run_cell(
    mode: str,
    gpus: int,
    calibration: cal.Calibration,
    seed: int,
    failures: float,
    workload: inputs.Workload = DEFAULT_WORKLOAD,
    days: float | None = None,
    checkpoint_s: float = 0.0,
    correlated: Correlated | None = None,
    checkpoints: Checkpoints | None = None,
) -> Cell:
    """Simulate ``mode`` on ``gpus`` GPUs for ``days``, or else for the time in
    which ``failures`` x the mode's budget failures are expected.
    ``checkpoint_s``: synchronous only, model the work lost since the last
    checkpoint apart from the 10-minute stall (0: the stall includes it).
    ``correlated``: domain and whole-job events (correlated.py; None: every
    failure alone, as in the main tables); to the synchronous job a domain
    event is one failure like any other and a whole-job event one more
    restart. ``checkpoints``: replicated modes, what losing the state costs
    (None: no checkpoints), and the steady cost of saving."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
    if gpus < 16 or failures <= 0 or (days is not None and days <= 0):
        raise ValueError("need at least 16 GPUs, a positive failure budget and positive days")
    rng = cell_rng(seed, mode, calibration.key, gpus)
    extra = correlated.whole_job_rate_per_s if correlated is not None else 0.0
    rate = calibration.rate_per_gpu_hour
    budget = failures * MODES[mode].budget

    def horizon(job_gpus: int) -> float:
        return days * 86400.0 if days is not None else horizon_s(budget, rate, job_gpus)

    if mode == "synchronous":
        stall = cal.PUBLISHED_SYNC_STALL_MIN * inputs.MIN
        result = simulate_synchronous(gpus, rate, horizon(gpus), rng, stall, checkpoint_s, extra)
        return Cell(mode, gpus, 1, calibration, result, requested=gpus)
    if mode == "ft-hsdp":
        replicas = cal.PUBLISHED_FTHSDP_REPLICAS
        replica_gpus = max(1, round(gpus / replicas))
        costs = inputs.published_costs()
    else:
        w = workload if mode == "fthsdp" else dataclasses.replace(
            inputs.PESSIMISTIC, **{f: getattr(workload, f) for f in _SHAPE})
        replica_gpus = w.replica_gpus
        replicas = max(2, round(gpus / replica_gpus))
        costs = inputs.fthsdp_costs(replicas, w)
    job_gpus = replicas * replica_gpus
    # Its own stream, named without the checkpoints: runs that differ only in
    # them see the same correlated events.
    correlated_rng = random.Random(f"{seed}/{mode}/{calibration.key}/{gpus}/correlated")
    sim = ReplicatedSim(replicas, replica_gpus, rate, costs, rng, step_s=workload.step_s, correlated=correlated,
                        checkpoints=checkpoints, correlated_rng=correlated_rng)
    result = sim.run(horizon(job_gpus))
    steady = costs.steady_factor * (checkpoints.steady_factor(workload.step_s) if checkpoints else 1.0)
    return Cell(mode, job_gpus, replicas, calibration, result, steady, requested=gpus)


# The job's shape and the coordinator's hang settings, shared by both fthsdp
# variants (the pessimistic one changes only costs).
_SHAPE = ("params", "snapshot_bytes_per_param", "grad_bytes_per_param", "replica_gpus", "nic_gbps", "step_s",
          "hang_floor_s", "hang_multiple", "heartbeat_interval_s")
