"""What each mode's recovery costs, and where every figure comes from.

``Measured`` holds fthsdp's own figures from benchmarks/README.md (2-core CPU
machine, gloo, small models); ``Workload`` the at-scale assumptions they are
scaled with (a 405B-parameter model, 128-GPU replicas, 400 Gb/s per GPU);
``recovery_costs`` turns them into the per-event costs the simulator charges
(``RecoveryCosts``), for the published FT-HSDP figure and for fthsdp, in a
measured and a pessimistic variant. ``input_rows`` is the printed table of
inputs, each with its source.
"""

from __future__ import annotations

import dataclasses
import math

from benchmarks.goodput import calibration as cal
from fthsdp.coordinator.decisions.hang import HangRules, job_limit
from fthsdp.coordinator.decisions.heartbeat_pace import HeartbeatPacer, Pace

GB = 1e9
MIN = 60.0


@dataclasses.dataclass(frozen=True)
class Measured:
    """fthsdp's measured figures (benchmarks/README.md, session 3)."""

    crash_stall_s: float = 0.01
    """Survivors' stall when a replica's training process is SIGKILLed (failover.py,
    'rank killed'; 'node lost' measured -0.06 s, i.e. none)."""
    hang_stall_s: float = 0.68
    """Survivors' stall when a node hangs silently, at ``hang_timeout_s`` (failover.py, 'node hung')."""
    hang_timeout_s: float = 1.0
    """The heartbeat timeout ``hang_stall_s`` was measured with."""
    fanout_few: tuple[int, float] = (62, 0.11)
    """(groups, seconds): a host lost -> every surviving host told, at 62 groups of 16 hosts of 8 ranks
    (992 hosts), each group's pings sent by its host 0 (control_plane.py --shape tree)."""
    fanout_many: tuple[int, float] = (250, 0.67)
    """The same at 250 groups (4,000 hosts), the machine shared with the simulated hosts (their loops 1.4 s
    late): the curve through the two grows faster than the coordinator's own work, so it errs high."""
    catchup_efficiency: float = 0.91
    """Catch-up transfer throughput / raw socket on the same bytes (catchup.py)."""
    steps_replayed: int = 1
    """Steps a joiner replays from the log before it joins (catchup.py)."""
    admission_step_ratio: float = 1.35
    """Longest members' admission step / steady step, worst of the rejoin runs (catchup.py)."""
    catchup_step_ratio: float = 1.31
    """Members' mean step during a 1 GB catch-up / steady, worst run (catchup.py; CPU-bound on 2 cores)."""
    catchup_steps: int = 8
    """Members' steps that such a catch-up spans (catchup.py)."""
    longest_step_ratio: float = 1.72
    """Longest members' step during any catch-up / steady (catchup.py)."""
    ddp_step_ms: float = 293.0
    """Torch DDP's throughput step (the mean over whole checksum intervals, median of 8 runs), 101 MB of
    gradients on 2 replicas (step_time.py --model comm-heavy --pairs 8 --steps 40 --flat, 2026-12-07)."""
    overlapped_step_ms: float = 314.9
    """fthsdp's in the same runs, its all-reduce overlapped with the backward pass (the defaults: the vote,
    the reports and the periodic checksum included)."""
    flat_step_ms: float = 344.0
    """fthsdp's in the same runs with one all-reduce after the backward pass (no overlap)."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if (min(value) if isinstance(value, tuple) else value) < 0:
                raise ValueError(f"Measured.{f.name} must not be negative")
        (few, few_s), (many, many_s) = self.fanout_few, self.fanout_many
        if not (0 < few < many and 0 < few_s < many_s):
            raise ValueError("Measured: the fan-out must grow from fewer groups to more")
        if not 0 < self.ddp_step_ms < self.flat_step_ms:
            raise ValueError("Measured: the step with one all-reduce after the backward pass must be DDP's or longer")

    @property
    def allreduce_exposed(self) -> float:
        """The share of the un-overlapped all-reduce's cost over DDP that the
        overlapped step still pays: (overlapped - DDP) / (no overlap - DDP),
        within [0, 1]."""
        share = (self.overlapped_step_ms - self.ddp_step_ms) / (self.flat_step_ms - self.ddp_step_ms)
        return min(1.0, max(0.0, share))

    def fanout_s(self, replicas: int) -> float:
        """Failure -> every surviving host told, on the power law through the two measured points
        (``replicas``: groups of 16 hosts)."""
        (few, few_s), (many, many_s) = self.fanout_few, self.fanout_many
        exponent = math.log(many_s / few_s) / math.log(many / few)
        return few_s * (replicas / few) ** exponent


@dataclasses.dataclass(frozen=True)
class Workload:
    """The job the measured figures are scaled to (assumptions, not measurements)."""

    params: float = 405e9
    """Model parameters (Llama 3 405B)."""
    snapshot_bytes_per_param: float = 12.0
    """Bytes a joiner fetches per parameter: fp32 weights and two AdamW moments (the
    example's 3.2M parameters make a 37 MiB snapshot, the same ratio)."""
    grad_bytes_per_param: float = 2.0
    """Bytes of one step's gradient per parameter (bf16), all-reduced across replicas."""
    replica_gpus: int = 128
    """GPUs in one replica (16 hosts of 8): each holds 1/128 of the model's state."""
    nic_gbps: float = 400.0
    """Network bandwidth per GPU, Gb/s (one 400G NIC per H100/H200)."""
    step_s: float = 6.0
    """Training step: Llama 3 405B's 16M-token step on 16,384 GPUs at ~400 TFLOP/s each."""
    heartbeat_timeout_s: float = 5.0
    """fthsdp's default heartbeat timeout: how long a silent failure takes to see."""
    hang_fraction: float = 0.5
    """Share of failures that are silent hangs; the rest crash or lose the node
    and are seen in milliseconds. Assumed."""
    live_hang_share: float = 0.0
    """Share of those hangs that hang a live training loop (process and heartbeat
    thread alive: a deadlocked data loader, a stuck collective inside the replica),
    seen by the coordinator's hang verdict (fthsdp/coordinator/decisions/hang.py); the rest stop the
    node (heartbeats stop too) and are seen by the heartbeat timeout. Assumed 0
    (every hang a stopped node): no source here splits the two (ByteRobust,
    arXiv 2509.16293, puts hangs at ~10% of incidents, without the split)."""
    hang_floor_s: float = 10.0
    """The coordinator's --hang-floor."""
    hang_multiple: float = 5.0
    """The coordinator's --hang-multiple: the hang limit is this x the median step, at least the floor."""
    heartbeat_interval_s: float = 1.0
    """The coordinator's --heartbeat-interval, before its pacing stretches it (``pace_at``): a live
    hang is seen about three intervals after the limit (the waiter's and the hung member's
    reports, and the agent's relay holding a ping for its host's batch)."""
    heartbeat_budget: float = 5000.0
    """The coordinator's --heartbeat-budget: above it the interval and the timeout stretch."""
    gpus_per_host: int = 8
    """GPUs (ranks) per host: a replica of ``replica_gpus`` spans replica_gpus / gpus_per_host hosts."""
    replacement_s: float = 10 * MIN
    """Failure -> the replica's replacement process registers (a healthy host found,
    the process started): not measured; taken as the synchronous restart's 10 min."""
    comm_rebuild_s: float = 0.0
    """Extra time to rebuild the survivors' cross-replica communicator on a shrink
    beyond what the CPU measurement includes (not measured on a GPU)."""
    serve_gbps: float | None = None
    """Bandwidth a source has for serving a snapshot, Gb/s; None: ``nic_gbps``."""
    catchup_slowdown_steps: float = 0.0
    """Extra member steps' worth of time lost while a source serves a joiner, beyond
    the transfer itself (the CPU measurement's 1.31x over 8 steps = 2.5)."""
    admission_step_ratio: float | None = None
    """Members' admission step / steady; None: the measured worst (1.35)."""
    allreduce_exposed: float | None = None
    """The share of the cross-replica all-reduce that fthsdp's step leaves
    exposed beyond a synchronous job's own (overlapped, like DDP's): its steady
    cost is this x the all-reduce's time. None: the share measured on CPU
    (``Measured.allreduce_exposed``); 1: as if not overlapped at all."""

    def __post_init__(self):
        for name in ("params", "snapshot_bytes_per_param", "grad_bytes_per_param", "nic_gbps", "step_s",
                     "heartbeat_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Workload.{name} must be positive")
        if self.replica_gpus < 1:
            raise ValueError("Workload.replica_gpus must be at least 1")
        for name in ("hang_fraction", "live_hang_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"Workload.{name} must be within [0, 1]")
        for name in ("hang_floor_s", "hang_multiple", "heartbeat_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Workload.{name} must be positive")
        for name in ("replacement_s", "comm_rebuild_s", "catchup_slowdown_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"Workload.{name} must not be negative")
        if self.serve_gbps is not None and not self.serve_gbps > 0:
            raise ValueError("Workload.serve_gbps must be positive")
        if self.allreduce_exposed is not None and not 0 <= self.allreduce_exposed <= 1:
            raise ValueError("Workload.allreduce_exposed must be within [0, 1]")

    @property
    def live_hang_detect_s(self) -> float:
        """A live loop's hang -> the coordinator's verdict, at the configured interval (``live_hang_detect_at``)."""
        return self.live_hang_detect_at(self.heartbeat_interval_s)

    def live_hang_detect_at(self, interval: float) -> float:
        """The hang limit at this step time, plus three heartbeat intervals of ``interval``."""
        limit = job_limit(self.step_s, HangRules(multiple=self.hang_multiple, floor=self.hang_floor_s))
        return limit + 3 * interval

    @property
    def hosts_per_replica(self) -> int:
        return max(1, self.replica_gpus // self.gpus_per_host)

    @property
    def snapshot_per_gpu(self) -> float:
        return self.params * self.snapshot_bytes_per_param / self.replica_gpus

    @property
    def grad_per_gpu(self) -> float:
        return self.params * self.grad_bytes_per_param / self.replica_gpus

    @property
    def nic_bytes_s(self) -> float:
        return self.nic_gbps * GB / 8


PESSIMISTIC = Workload(
    hang_fraction=1.0,
    live_hang_share=1.0,
    comm_rebuild_s=30.0,
    serve_gbps=100.0,
    catchup_slowdown_steps=(Measured().catchup_step_ratio - 1) * Measured().catchup_steps,
    admission_step_ratio=Measured().longest_step_ratio,
    allreduce_exposed=1.0,
)
"""Every unmeasured cost at a bad value: all failures hangs of a live loop (the
slowest to see: the hang limit, not the heartbeat timeout), 30 s to rebuild a
communicator, snapshots served at 100 Gb/s, members slowed during a catch-up as
on the 2-core CPU machine, admission steps as long as the longest measured, and
the cross-replica all-reduce as if not overlapped with the backward pass."""


@dataclasses.dataclass(frozen=True)
class RecoveryCosts:
    """What one failure costs a replicated job, event by event (seconds)."""

    crash_stall_s: float
    """Whole-job stall when a member crashes or loses its node (seen at once)."""
    hang_stall_s: float
    """Whole-job stall when a member hangs silently (seen at the heartbeat timeout)."""
    hang_fraction: float
    """Share of failures that hang rather than crash."""
    restart_s: float
    """Failure -> the failed replica's replacement registers with the coordinator."""
    catch_up_s: float
    """Registration -> ready to join (snapshot, replay); 0: it registers up to date."""
    serve_stall_s: float
    """Whole-job stall while a source serves a joiner."""
    admission_stall_s: float
    """Whole-job stall when joiners are admitted."""
    heartbeat_timeout_s: float
    """The coordinator's heartbeat timeout (the quorum rules')."""
    steady_factor: float = 1.0
    """Step time / a synchronous job's step without failures (1: no steady cost)."""
    live_hang_stall_s: float = 0.0
    """Whole-job stall when a member's training loop hangs in a live process (seen at the hang verdict)."""
    live_hang_share: float = 0.0
    """Share of hangs that are hangs of a live loop (the rest stop the node)."""
    live_hang_detect_s: float = 0.0
    """A live loop's hang -> the coordinator takes the member out."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"RecoveryCosts.{f.name} must not be negative")
        for name in ("hang_fraction", "live_hang_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"RecoveryCosts.{name} must be within [0, 1]")
        if self.steady_factor < 1:
            raise ValueError("RecoveryCosts.steady_factor must be at least 1")

    @property
    def mean_failure_stall_s(self) -> float:
        hang = (1 - self.live_hang_share) * self.hang_stall_s + self.live_hang_share * self.live_hang_stall_s
        return (1 - self.hang_fraction) * self.crash_stall_s + self.hang_fraction * hang


def published_costs() -> RecoveryCosts:
    """FT-HSDP as published: a 3-minute stall of the whole job per failure, and
    (our inference) the failed replica back after the synchronous restart's
    10 minutes, registering up to date."""
    stall = cal.PUBLISHED_FTHSDP_STALL_MIN * MIN
    return RecoveryCosts(
        crash_stall_s=stall,
        hang_stall_s=stall,
        hang_fraction=0.0,
        restart_s=cal.PUBLISHED_FTHSDP_OUT_MIN * MIN,
        catch_up_s=0.0,
        serve_stall_s=0.0,
        admission_stall_s=0.0,
        heartbeat_timeout_s=Workload().heartbeat_timeout_s,
    )


def pace_at(w: Workload, replicas: int) -> Pace:
    """The heartbeat interval and timeout the shipped pacer (fthsdp/coordinator/decisions/heartbeat_pace.py)
    sets for ``replicas`` groups under the agent: each group's rank 0 and its ping batches count as a
    sender each (its host 0 sends its hosts' batches and their heartbeats as one: fthsdp/agent/node/relay/tree.py)."""
    senders = 2 * replicas
    return HeartbeatPacer(w.heartbeat_interval_s, w.heartbeat_timeout_s, w.heartbeat_budget).update(senders, 0.0)


def allreduce_s(w: Workload, replicas: int) -> float:
    """One ring all-reduce of a GPU's gradient shard across the replicas."""
    return 2 * (replicas - 1) / max(replicas, 1) * w.grad_per_gpu / w.nic_bytes_s


def exposed_share(w: Workload, m: Measured) -> float:
    """The share of the cross-replica all-reduce charged as a steady cost."""
    return w.allreduce_exposed if w.allreduce_exposed is not None else m.allreduce_exposed


def transfer_s(w: Workload, m: Measured) -> float:
    """A joiner GPU fetching its snapshot shard from its source GPU."""
    serve = (w.serve_gbps or w.nic_gbps) * GB / 8
    return w.snapshot_per_gpu / (serve * m.catchup_efficiency)


def fthsdp_costs(replicas: int, w: Workload = Workload(), m: Measured = Measured()) -> RecoveryCosts:
    """fthsdp's costs at ``replicas`` replicas: the measured stalls plus what
    grows with scale (fan-out to every survivor, redoing the interrupted step's
    all-reduce among them, moving a 405B model's state at the NIC's rate)."""
    redo = allreduce_s(w, replicas)
    shrink = m.fanout_s(replicas) + redo + w.comm_rebuild_s
    pace = pace_at(w, replicas)
    # A stopped node (its agent too) is seen at the heartbeat timeout as the pacer stretches it.
    hang = m.hang_stall_s + (pace.timeout - m.hang_timeout_s)
    live_detect = w.live_hang_detect_at(pace.interval)
    transfer = transfer_s(w, m)
    log_per_step = w.grad_per_gpu / w.nic_bytes_s
    ratio = w.admission_step_ratio if w.admission_step_ratio is not None else m.admission_step_ratio
    exposed = exposed_share(w, m)
    return RecoveryCosts(
        crash_stall_s=m.crash_stall_s + shrink,
        hang_stall_s=max(0.0, hang) + shrink,
        hang_fraction=w.hang_fraction,
        # The survivors wait in the all-reduce until the verdict (failover.py, "loop hung":
        # the stall was the limit plus 0.2-0.8 s at a 0.2 s heartbeat interval).
        live_hang_stall_s=live_detect + shrink,
        live_hang_share=w.live_hang_share,
        live_hang_detect_s=live_detect,
        restart_s=w.replacement_s,
        # The snapshot, then each replayed step costs a step (waiting for the boundary).
        catch_up_s=transfer + m.steps_replayed * w.step_s,
        # Conservatively the source's all-reduce waits for the whole transfer.
        serve_stall_s=transfer + m.steps_replayed * log_per_step + w.catchup_slowdown_steps * w.step_s,
        admission_stall_s=max(0.0, ratio - 1) * w.step_s,
        heartbeat_timeout_s=pace.timeout,
        # The cross-replica all-reduce overlaps the backward pass bucket by bucket, as a
        # synchronous job's does; what fthsdp's step leaves exposed beyond that is its steady cost.
        steady_factor=1 + exposed * redo / w.step_s,
    )


def input_rows(replicas: int, w: Workload = Workload(), m: Measured = Measured()) -> list[tuple[str, str, str]]:
    """(input, value, source) for the printed table, fthsdp at ``replicas``."""
    c = fthsdp_costs(replicas, w, m)
    tb = w.params * w.snapshot_bytes_per_param / 1e12
    exposed_source = ("given (--allreduce-exposed)" if w.allreduce_exposed is not None else
                      f"step_time.py comm-heavy, (fthsdp {m.overlapped_step_ms:g} - DDP {m.ddp_step_ms:g}) "
                      f"/ (no overlap {m.flat_step_ms:g} - DDP) ms")
    return [
        ("synchronous stall per failure", f"{cal.PUBLISHED_SYNC_STALL_MIN:g} min",
         "arXiv 2602.00277 (detection, rescheduling, init, checkpoint load, lost work)"),
        ("FT-HSDP stall per failure", f"{cal.PUBLISHED_FTHSDP_STALL_MIN:g} min", "arXiv 2602.00277"),
        ("FT-HSDP replica out / replicas", f"{cal.PUBLISHED_FTHSDP_OUT_MIN:g} min / {cal.PUBLISHED_FTHSDP_REPLICAS}",
         "inferred (calibration.py): fits 80%"),
        ("crash: survivors' stall", f"{m.crash_stall_s:.2f} s", "failover.py, rank killed"),
        ("heartbeat interval / timeout at this size", f"{pace_at(w, replicas).interval:g} s / "
         f"{pace_at(w, replicas).timeout:g} s", f"the shipped pacer: {w.heartbeat_interval_s:g} s / "
         f"{w.heartbeat_timeout_s:g} s configured, budget {w.heartbeat_budget:g}/s, "
         f"{2 * replicas} senders (a group's rank 0, its host 0's batches)"),
        ("hang: survivors' stall", f"{m.hang_stall_s:.2f} s at {m.hang_timeout_s:g} s timeout -> "
         f"{c.hang_stall_s - (c.crash_stall_s - m.crash_stall_s):.2f} s at {c.heartbeat_timeout_s:g} s",
         "failover.py, node hung; + (timeout - 1 s)"),
        ("share of failures that hang", f"{w.hang_fraction:.0%}", "assumed"),
        ("share of hangs in a live loop (heartbeats go on)", f"{w.live_hang_share:.0%}",
         "assumed (no source splits stopped nodes from live loops)"),
        ("live loop hung: survivors' stall", f"{c.live_hang_stall_s - (c.crash_stall_s - m.crash_stall_s):.2f} s",
         f"hang limit max({w.hang_floor_s:g} s, {w.hang_multiple:g} x {w.step_s:g} s step) "
         f"+ 3 x {pace_at(w, replicas).interval:g} s heartbeat (failover.py, loop hung: the limit + 0.2-0.8 s at "
         "0.2 s; one more for the relay's batch)"),
        (f"failure -> all survivors told, {replicas} replicas", f"{m.fanout_s(replicas) * 1000:.0f} ms",
         f"control_plane.py --shape tree: {m.fanout_few[1] * 1000:.0f} ms @{m.fanout_few[0]} groups, "
         f"{m.fanout_many[1] * 1000:.0f} ms @{m.fanout_many[0]}; "
         "power law"),
        ("FTAR retry: redo the step's all-reduce", f"{allreduce_s(w, replicas):.2f} s",
         f"{w.grad_per_gpu / GB:.1f} GB bf16 grad shard per GPU, ring, {w.nic_gbps:g} Gb/s"),
        ("communicator rebuild on a shrink (extra)", f"{w.comm_rebuild_s:g} s", "not measured on GPU"),
        ("snapshot per joiner GPU", f"{w.snapshot_per_gpu / GB:.1f} GB",
         f"{w.params / 1e9:g}B params x {w.snapshot_bytes_per_param:g} B = {tb:.2f} TB / {w.replica_gpus} GPUs"),
        ("catch-up transfer", f"{transfer_s(w, m):.2f} s",
         f"at {(w.serve_gbps or w.nic_gbps):g} Gb/s x {m.catchup_efficiency:.2f} (catchup.py ratio to raw socket)"),
        ("steps replayed / step time", f"{m.steps_replayed} / {w.step_s:g} s", "catchup.py / assumed (Llama 3 405B)"),
        ("failure -> replacement registers", f"{w.replacement_s / MIN:g} min", "assumed (not measured)"),
        ("members' stall while serving a joiner", f"{c.serve_stall_s:.2f} s",
         "the transfer + log, as if not overlapped"),
        ("members' admission step", f"{c.admission_stall_s:.2f} s extra",
         f"catchup.py: worst admission step {m.admission_step_ratio:g}x steady"),
        ("steady cost: the all-reduce's exposed share", f"+{(c.steady_factor - 1):.1%} step time",
         f"{exposed_share(w, m):.0%} of the {allreduce_s(w, replicas):.2f} s all-reduce: {exposed_source}"),
    ]
