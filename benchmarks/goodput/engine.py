"""The discrete-event simulation: failures in time, stalls, and the quorum.

Two engines. ``simulate_synchronous`` (synchronous.py): every failure
restarts the whole job (one stall, plus the work since the last checkpoint
if checkpoints are modelled apart). ``ReplicatedSim``, here: replicas fail alone; every membership
change is decided by the shipped ``fthsdp.coordinator.decisions.quorum.decide`` from what the
coordinator would see (a crash reported by the agent, a Watch stream closed,
heartbeats that stop), and the share of replicas training is the size of the
quorum it returns.

Correlated failures (correlated.py), off unless asked for: a domain event
stops every replica of one domain at once (silent, like a power loss: the
heartbeat timeout sees them, the split-brain guard of ``decide`` may wait
first); a whole-job event takes every replica. When no replica is left
holding the state, the job rolls back to its newest checkpoint after the
replicas are replaced and have loaded it, or, without checkpoints, starts
over from step 0 after an operator's give-up.

Accounting, the same in both (see calibration.py for why): failures form a
Poisson process in wall-clock time at ``rate x GPUs``, also while the job is
stalled or a replica is out; each costs its own stall, added to the end of a
stall in progress. Effective training time = replica-seconds spent training
in the quorum, outside stalls / (replicas x wall-clock time).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
from collections.abc import Sequence

from benchmarks.goodput.correlated import Checkpoints, Correlated, roll_back
from benchmarks.goodput.inputs import RecoveryCosts
from benchmarks.goodput.synchronous import SECONDS_PER_HOUR, QuorumChange, RunResult
from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.coordinator.decisions.quorum import decide
from fthsdp.coordinator.decisions.quorum_types import Quorum, ReplicaView, Rules
from fthsdp.coordinator.job.replica_entry import Incarnation, ReplicaEntry


@dataclasses.dataclass
class _Replica(ReplicaEntry):
    """The coordinator's record of a replica (its ``view()`` is what ``decide``
    sees), plus what only the simulator knows."""

    member: bool = False
    token: int = 0
    """Bumped whenever the replica's pending events become stale."""
    hung_since: float | None = None
    """A silent failure: heartbeats stopped then."""
    down_since: float | None = None
    """When the failure that took it out happened (for the time out)."""


class ReplicatedSim:
    """One job of ``replicas`` replicas of ``replica_gpus`` GPUs each."""

    def __init__(
        self,
        replicas: int,
        replica_gpus: int,
        rate_per_gpu_hour: float,
        costs: RecoveryCosts,
        rng: random.Random,
        step_s: float = 6.0,
        correlated: Correlated | None = None,
        checkpoints: Checkpoints | None = None,
        correlated_rng: random.Random | None = None,
        scripted: Sequence[tuple[float, str]] = (),
    ):
        """``correlated``: domain and whole-job events, drawn from
        ``correlated_rng`` (its own stream, so that runs that differ only in
        their checkpoints see the same events). ``checkpoints``: what a state
        loss costs (None: no checkpoints). ``scripted``: events at set times,
        ``(t, "whole-job")`` or ``(t, "domain:I")`` for the I-th domain."""
        if replicas < 2:
            raise ValueError("a replicated job needs at least 2 replicas")
        self.costs = costs
        self.rng = rng
        self.step_s = step_s
        self.replica_gpus = replica_gpus
        # A default coordinator's rules, at the heartbeat timeout the costs assume.
        self.rules: Rules = dataclasses.replace(CoordinatorConfig().rules, heartbeat_timeout=costs.heartbeat_timeout_s)
        total_rate = rate_per_gpu_hour * replicas * replica_gpus / SECONDS_PER_HOUR
        share = correlated.domain_share if correlated is not None else 0.0
        # Without domain events the rate is left as it was, bit for bit.
        self.rate = total_rate * (1 - share) if share else total_rate
        self.domain_rate = total_rate * share
        self.whole_job_rate = correlated.whole_job_rate_per_s if correlated is not None else 0.0
        self.domain_size = correlated.domain_replicas(replicas, replica_gpus) if correlated is not None else 1
        self.correlated_rng = correlated_rng or random.Random(f"correlated/{replicas}")
        self.scripted = tuple(scripted)
        for _, kind in self.scripted:
            if kind != "whole-job" and not (kind.startswith("domain:") and kind[7:].isdigit()):
                raise ValueError(f"scripted events are 'whole-job' or 'domain:I', not {kind!r}")
        self.checkpoints = checkpoints or Checkpoints()
        # Whether to watch for the state being lost: only with the new options,
        # so that the default runs stay as they were, event for event.
        self.track_state = correlated is not None or checkpoints is not None or bool(self.scripted)
        width = len(str(replicas - 1))
        self.replicas = [_Replica(f"r{i:0{width}d}", Incarnation(world_size=replica_gpus)) for i in range(replicas)]
        self.by_id = {r.replica_id: r for r in self.replicas}
        self.quorum: Quorum | None = None
        self.catch_up: dict[str, str] = {}
        self.changes: list[QuorumChange] = []
        self.events: list[tuple[float, int, str, str, int]] = []
        self.seq = 0
        self.t = self.productive = self.charged = 0.0
        self.stall_start = self.stall_end = 0.0
        self.failures = self.decisions = self.assignments = 0
        self.out_times: list[float] = []
        self.quorum_serial = 0
        # Durable state: the step clock (training time) and the newest checkpoint.
        self.trained = self.checkpoint_trained = self.checkpoint_progress = 0.0
        self.restoring_until = -math.inf
        self.restore_token = 0
        self.awaiting_restore: set[str] = set()
        self.guard_until = -math.inf
        self.domain_events = self.whole_job_events = self.state_losses = 0
        self.lost_progress = self.outage = 0.0

    # ----- the coordinator's view and decision -----------------------------------

    def _view(self, r: _Replica, now: float, head: int) -> ReplicaView:
        """What the coordinator would know at ``now``: live replicas heartbeat
        every second, members report the head step (they train in lockstep)."""
        inc = r.incarnation
        if r.member or (inc.ready_since is not None and not inc.catching_up):
            inc.step = head
        inc.last_heartbeat = r.hung_since if r.hung_since is not None else now
        inc.beating = True  # the agent heartbeats as soon as it has registered
        return r.view()

    def _decide(self, now: float):
        head = int(now / self.step_s)
        views = {r.replica_id: self._view(r, now, head) for r in self.replicas}
        d = decide(self.quorum, views, now, self.rules, self.catch_up)
        self.decisions += 1
        if (self.track_state and d.members is None and d.reason.startswith("split-brain guard")
                and now >= self.guard_until):
            # Most members went silent at once (a domain event): the coordinator
            # waits join_timeout before shrinking, the survivors wait with it.
            self.guard_until = now + self.rules.join_timeout
            self._stall(now, self.rules.join_timeout)
            self._push(self.guard_until + 1e-6, "tick")
        if d.changes_quorum:
            before = set(self.quorum.member_ids) if self.quorum else set()
            self.quorum_serial += 1
            self.quorum = Quorum(self.quorum_serial, d.members, step=head, reason=d.reason)
            after = set(self.quorum.member_ids)
            self.changes.append(QuorumChange(now, self.quorum.id, len(after), d.reason))
            for rid in before - after:
                self.by_id[rid].member = False
            for rid in after - before:
                r = self.by_id[rid]
                r.member = True
                r.incarnation.restarted, r.incarnation.ready_since, r.incarnation.catching_up = False, None, False
                if r.down_since is not None:
                    self.out_times.append(now - r.down_since)
                    r.down_since = None
            if before and after - before:
                self._stall(now, self.costs.admission_stall_s)
        sources = {rid: s.replica_id for rid, s in d.catch_up.items()}
        moved = [rid for rid, s in sources.items() if rid in self.catch_up and self.catch_up[rid] != s]
        self.catch_up = sources
        for rid in moved:  # its source left: the transfer starts over from the new one
            r = self.by_id[rid]
            if r.incarnation.catching_up:
                r.token += 1
                self._stall(now, self.costs.serve_stall_s)
                self._push(now + self.costs.catch_up_s, "ready", rid, r.token)
        return d

    # ----- time, stalls and events ---------------------------------------------------

    def _push(self, when: float, kind: str, rid: str = "", token: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (when, self.seq, kind, rid, token))

    def _stall(self, now: float, seconds: float) -> None:
        if seconds <= 0:
            return
        self.charged += seconds
        if now >= self.stall_end:
            self.stall_start, self.stall_end = now, now + seconds
        else:
            self.stall_end += seconds

    def _advance(self, t: float) -> None:
        if t <= self.t:
            return
        stalled = max(0.0, min(t, self.stall_end) - max(self.t, self.stall_start))
        members = len(self.quorum.members) if self.quorum else 0
        before = self.productive
        self.productive += (t - self.t - stalled) * members / len(self.replicas)
        if members and self.checkpoints.enabled:
            self._save_through(t - self.t - stalled, before, members)
        self.t = t

    def _save_through(self, trained: float, progress_before: float, members: int) -> None:
        """The step clock runs while the job trains; a checkpoint every
        ``interval_s`` of it records the progress at that step."""
        k = self.checkpoints.interval_s
        start = self.trained
        self.trained += trained
        at = math.floor(self.trained / k) * k
        if at > start:
            self.checkpoint_trained = at
            self.checkpoint_progress = progress_before + (at - start) * members / len(self.replicas)

    @staticmethod
    def _healthy_member(r: _Replica) -> bool:
        return (r.member and r.hung_since is None and r.incarnation.failed_at is None
                and r.incarnation.disconnected_at is None and r.down_since is None)

    def _on_failure(self, now: float) -> None:
        self.failures += 1
        r = self.rng.choice(self.replicas)
        if self._healthy_member(r):
            r.down_since = now
            r.token += 1
            live = self.costs.live_hang_share  # no draw at 0 or 1: the default runs stay as they were
            if self.rng.random() >= self.costs.hang_fraction:
                hang = None
            else:
                hang = "live" if live >= 1 or (live > 0 and self.rng.random() < live) else "stopped"
            if hang == "live":
                # A live loop hung: it heartbeats on; the survivors wait in the
                # all-reduce until the coordinator's hang verdict takes it out.
                self._stall(now, self.costs.live_hang_stall_s)
                self._push(now + self.costs.live_hang_detect_s, "verdict", r.replica_id, r.token)
            elif hang == "stopped":
                # Silent: the survivors block in the all-reduce until the heartbeat timeout.
                self._stall(now, self.costs.hang_stall_s)
                r.hung_since = now
                self._push(now + self.costs.heartbeat_timeout_s, "detect", r.replica_id, r.token)
            else:
                self._stall(now, self.costs.crash_stall_s)
                # A crashed rank is reported by its agent; a lost node closes its stream.
                if self.rng.random() < 0.5:
                    r.incarnation.failed_at = now
                else:
                    r.incarnation.disconnected_at = now
                self._decide(now)
        elif not r.member:
            self._fail_recovering(now, r)
        else:
            return  # already failed, not yet seen: nothing more is lost
        self._push(now + self.costs.restart_s, "register", r.replica_id, r.token)
        if self.track_state:
            self._check_state(now)

    def _fail_recovering(self, now: float, r: _Replica) -> None:
        """A failure during its recovery (or the job's restore): it starts over."""
        r.token += 1
        r.incarnation.failed_at, r.incarnation.catching_up, r.incarnation.ready_since = now, False, None
        self.awaiting_restore.discard(r.replica_id)

    # ----- correlated failures and the state ------------------------------------------

    def _on_domain(self, now: float, index: int | None = None) -> None:
        """Every replica of one domain stops at once, silently (a power loss):
        the survivors block in the all-reduce until the heartbeat timeout."""
        self.failures += 1
        self.domain_events += 1
        k = self.domain_size
        domains = math.ceil(len(self.replicas) / k)
        d = self.correlated_rng.randrange(domains) if index is None else index % domains
        stalled = False
        for r in self.replicas[d * k:(d + 1) * k]:
            if self._healthy_member(r):
                r.down_since = r.hung_since = now
                r.token += 1
                if not stalled:
                    self._stall(now, self.costs.hang_stall_s)
                    stalled = True
                self._push(now + self.costs.heartbeat_timeout_s, "detect", r.replica_id, r.token)
            elif not r.member:
                self._fail_recovering(now, r)
            else:
                continue
            self._push(now + self.costs.restart_s, "register", r.replica_id, r.token)
        self._check_state(now)

    @staticmethod
    def _holds_state(r: _Replica) -> bool:
        """A live member, or a joiner caught up and waiting to be admitted."""
        if r.member:
            return r.down_since is None
        inc = r.incarnation
        return inc.ready_since is not None and not inc.catching_up and inc.failed_at is None

    def _check_state(self, now: float) -> None:
        if self.restoring_until > now or any(self._holds_state(r) for r in self.replicas):
            return
        self._lose_state(now)

    def _lose_state(self, now: float) -> None:
        """No replica holds the state (or a whole-job event took them all): every
        replica is out until the restore (or the operator's give-up); the job
        rolls back to its newest checkpoint, or to step 0."""
        self.state_losses += 1
        back = roll_back(self.productive, self.trained, self.checkpoint_progress, self.checkpoint_trained,
                         self.checkpoints)
        self.productive, self.trained = back.progress_s, back.trained_s
        if not self.checkpoints.enabled:
            self.checkpoint_progress = self.checkpoint_trained = 0.0
        self.lost_progress += back.lost_s
        outage = self.checkpoints.outage_s(self.costs.restart_s)
        # A loss during the restore of an earlier one starts the outage over.
        self.outage += outage - max(0.0, self.restoring_until - now)
        self.quorum, self.catch_up = None, {}
        self.stall_start = self.stall_end = now
        for r in self.replicas:
            r.token += 1
            inc = r.incarnation
            r.member = inc.catching_up = inc.restarted = False
            inc.failed_at = inc.disconnected_at = r.hung_since = inc.hung_at = r.down_since = inc.ready_since = None
            inc.hung_reason = ""
        self.awaiting_restore = {r.replica_id for r in self.replicas}
        self.restoring_until = now + outage
        self.restore_token += 1
        self._push(self.restoring_until, "restore", "", self.restore_token)

    def _on_restore(self, now: float) -> None:
        """The replicas back (and done loading the checkpoint) form a first quorum."""
        self.restoring_until = now
        head = int(now / self.step_s)
        for rid in sorted(self.awaiting_restore):
            r = self.by_id[rid]
            inc = r.incarnation
            inc.ready_since, inc.catching_up, inc.registered_at, inc.step = now, False, now, head
        self.awaiting_restore = set()
        self._decide_and_wait(now)

    def _on_register(self, now: float, r: _Replica) -> None:
        # A fresh incarnation, as the coordinator's register makes; a member
        # that registers anew lost its state.
        r.incarnation = Incarnation(world_size=r.incarnation.world_size, registered_at=now,
                                    step=int(now / self.step_s), restarted=r.member)
        r.hung_since = None
        if self.restoring_until > now:  # the job is restoring: it loads the checkpoint with the others
            r.incarnation.ready_since, r.incarnation.catching_up = None, False
            self.awaiting_restore.add(r.replica_id)
            return
        if self.costs.catch_up_s <= 0:  # it registers up to date
            self._on_ready(now, r)
            return
        r.incarnation.ready_since, r.incarnation.catching_up = None, True
        d = self._decide(now)
        if r.replica_id in d.catch_up:
            self.assignments += 1
        self._stall(now, self.costs.serve_stall_s)
        self._push(now + self.costs.catch_up_s, "ready", r.replica_id, r.token)

    def _on_ready(self, now: float, r: _Replica) -> None:
        r.incarnation.ready_since, r.incarnation.catching_up = now, False
        self._decide_and_wait(now)

    def _decide_and_wait(self, now: float) -> None:
        """Decide; if ready joiners are left waiting (for arrivals to settle, or
        for others still catching up), decide again when the wait can end."""
        self._decide(now)
        waiting = [r.incarnation.ready_since for r in self.replicas
                   if not r.member and r.incarnation.ready_since is not None and r.incarnation.failed_at is None]
        if not waiting:
            return
        settle = self.rules.join_settle
        wakes = [t for t in (max(waiting) + settle, min(waiting) + self.rules.join_timeout) if t > now]
        if wakes:
            self._push(min(wakes) + 1e-6, "tick")

    def run(self, horizon_s: float) -> RunResult:
        for r in self.replicas:  # the first quorum: every replica up to date at step 0
            r.incarnation.ready_since = 0.0
        self._decide_and_wait(0.0)
        if self.rate > 0:
            self._push(self.rng.expovariate(self.rate), "fail")
        if self.domain_rate > 0:
            self._push(self.correlated_rng.expovariate(self.domain_rate), "domain")
        if self.whole_job_rate > 0:
            self._push(self.correlated_rng.expovariate(self.whole_job_rate), "whole-job")
        for when, kind in self.scripted:
            name, _, index = kind.partition(":")
            self._push(when, name, index or "scripted")
        while self.events and self.events[0][0] < horizon_s:
            when, _, kind, rid, token = heapq.heappop(self.events)
            self._advance(when)
            if kind == "fail":
                self._on_failure(when)
                self._push(when + self.rng.expovariate(self.rate), "fail")
                continue
            if kind == "domain":
                self._on_domain(when, int(rid) if rid else None)
                if not rid:
                    self._push(when + self.correlated_rng.expovariate(self.domain_rate), "domain")
                continue
            if kind == "whole-job":
                self.whole_job_events += 1
                self._lose_state(when)
                if not rid:
                    self._push(when + self.correlated_rng.expovariate(self.whole_job_rate), "whole-job")
                continue
            if kind == "restore":
                if token == self.restore_token:
                    self._on_restore(when)
                continue
            if kind == "tick":
                if self.restoring_until <= when:  # nothing to decide while the job restores
                    self._decide_and_wait(when)
                continue
            r = self.by_id[rid]
            if token != r.token:
                continue  # stale: the replica failed again or its transfer restarted
            if kind == "detect":
                self._decide(when)
            elif kind == "verdict":
                r.incarnation.hung_at, r.incarnation.hung_reason = when, "hung: no progress while the others waited"
                self._decide(when)
            elif kind == "register":
                self._on_register(when, r)
            elif kind == "ready":
                self._on_ready(when, r)
        self._advance(horizon_s)
        return RunResult(
            horizon_s,
            self.failures,
            self.productive / horizon_s,
            self.charged / self.failures if self.failures else 0.0,
            sum(self.out_times) / len(self.out_times) if self.out_times else 0.0,
            tuple(self.changes),
            self.decisions,
            self.assignments,
            self.domain_events,
            self.whole_job_events,
            self.state_losses,
            self.lost_progress,
            self.outage,
        )
