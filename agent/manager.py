"""The training-script API: the fault-tolerant step of one replica.

A nanoGPT-style loop stays readable::

    with Manager.from_env(model, optimizer) as ft:
        while ft.step < max_steps and not ft.stopped:
            x, y = get_batch(ft.step, ft.replica_rank)   # data position = (step, replica rank)
            loss = model(x, y)
            loss.backward()
            ft.allreduce_gradients()   # FTAR across the quorum; redone among survivors on a failure
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            ft.commit()                # the step boundary: membership changes, checksum, drain

The manager registers the replica with the coordinator, learns every
membership change from its push (no coordinator call on a step where nothing
changed) and hosts the rendezvous store its quorum groups use when it is the
first member. A SIGTERM, or ``fthsdp drain``, makes the replica leave at the
next step boundary; ``stopped`` then turns true and the script should exit 0.

Data: either each replica trains on batch ``(step, replica_rank)`` (the global
batch shrinks while a replica is out), or the script keeps the global batch
constant and splits each step's batch by ``participation()`` (the survivors
take a missing replica's share; agent/participation.py).

Catch-up: a replica that starts behind the quorum (restarted by its agent, or
new) gets its state from a healthy peer inside ``start()`` (agent/joiner.py),
so the loop above needs nothing for it; every replica serves its state to
joiners in turn (agent/catchup_server.py). Set a learning-rate schedule
*before* ``allreduce_gradients()``: a joiner replays the members' recorded
hyperparameters for the steps it missed.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import signal
import threading
import time
import zlib
from collections.abc import Mapping

import torch
import torch.distributed as dist

from agent import catchup_tls
from agent.catchup_client import CatchUpError, SourceClient
from agent.catchup_server import CatchUpServer
from agent.catchup_source import CatchUpSource
from agent.checksum import StridedHistory, state_checksum, structure_hash
from agent.ftar import CONTROL_SLOTS, FTAR, Evicted, FtarError, QuorumTracker, StepResult
from agent.grad_log import GradientLog
from agent.joiner import CatchUpReport, Joiner
from agent.manager_config import ManagerConfig
from agent.membership import Membership
from agent.eviction import exit_when_evicted
from agent.participation import Participation, QuorumRecord
from agent.replica_group import ReplicaGroup
from agent.snapshot import capture_state, load_state
from agent.standby import wait_for_activation
from agent.state_codec import local as _local
from coordinator.credentials import TlsFiles
from coordinator.errors import ConfigError, FthsdpError
from protos.fthsdp.v1 import catchup_pb2 as cpb

__all__ = ["ApiMisuse", "Manager", "ManagerConfig", "Participation"]

log = logging.getLogger("fthsdp.agent.manager")


class ApiMisuse(FthsdpError):
    """The training script called the API out of order."""


class Manager:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: ManagerConfig) -> None:
        self.model = model
        self.optimizer = optimizer
        self.config = config
        self.step = 0
        self.stopped = False
        self.last: StepResult | None = None
        self._params = [p for p in model.parameters() if p.requires_grad]
        self.structure = structure_hash(model)
        self._reduced = False
        self._history = StridedHistory(config.checksum_every)
        self._drain = threading.Event()
        self.group: ReplicaGroup | None = None
        self.log = GradientLog(config.catch_up_log_steps, config.catch_up_log_bytes)
        self.source = CatchUpSource(config.replica_id, config.shard_rank, self.structure, self.log)
        self.source.hyperparams = self._hyperparams
        self._server: CatchUpServer | None = None
        self._joiner: Joiner | None = None
        self._checksum_wanted = False
        self._following = False
        self._admission_timeout = 120.0
        self.catch_up: CatchUpReport | None = None
        """How this replica caught up in ``start()``; None if it started up to date."""
        timeout = datetime.timedelta(seconds=config.timeout)
        self.leader = config.shard_rank == 0
        """Rank 0 of the replica group holds its session with the coordinator."""
        if self.leader:
            # The rendezvous store of every quorum whose first member we are.
            self._store = dist.TCPStore(config.host, 0, is_master=True, timeout=timeout, wait_for_workers=False)
            self.address = f"{config.host}:{self._store.port}"
        else:
            self.address = ""
        self.tracker = QuorumTracker(config.replica_id)
        self._source_tls = None  # the catch-up client's TLS context, made on first use
        self._catch_up_tls = config.tls if config.catch_up_tls else TlsFiles()
        self.membership = Membership(
            config.coordinator, config.job, config.replica_id, self.address or "unused:0", config.shard_count, 0,
            token=config.token, tls=config.tls,
        )
        self.membership.add_listener(self.tracker.update)
        self._quorums = QuorumRecord(config.replica_id)
        self.membership.add_listener(self._quorums.record)
        self.ftar = FTAR(self.tracker, config.job, shard_rank=config.shard_rank, timeout=config.timeout)
        self.ftar.on_behind = self._close_gap
        self.ftar.on_join = self._join_members
        self.ftar.while_joining = self._follow_log
        self._proposal = 0
        """The growth quorum this replica group proposes to switch to (agreed by its ranks at commit)."""
        self._follower: tuple[threading.Thread, threading.Event] | None = None
        """The helper thread replaying the log while a joiner waits for the members."""

    @classmethod
    def from_env(cls, model, optimizer, env: Mapping[str, str] | None = None, **overrides) -> "Manager":
        """The manager configured by `fthsdp agent`. In a warm standby (``fthsdp
        agent --standby``) this waits until the agent activates it."""
        env = os.environ if env is None else env
        wait_for_activation(env)
        return cls(model, optimizer, ManagerConfig.from_env(env, **overrides))

    @property
    def replica_rank(self) -> int:
        return self.config.replica_rank

    @property
    def num_replicas(self) -> int:
        return self.config.num_replicas

    @property
    def replica_id(self) -> str:
        return self.config.replica_id

    @property
    def quorum_id(self) -> int:
        """The newest quorum this replica knows of (0 before the first)."""
        return self.tracker.newest_id()

    def participation(self) -> Participation:
        """This replica's ``index`` among the ``count`` replicas whose gradients
        the next ``allreduce_gradients()`` is expected to average, the same on
        every member (agent/participation.py). A failure during the step may
        leave fewer (``StepResult.contributors``); a joiner's first step has none of its."""
        if self.group is None:
            raise ApiMisuse("participation() before start(): the replica is in no quorum yet")
        return self._quorums.participation(self.membership.training_quorum_id, self._following)

    # ----- lifecycle -----------------------------------------------------------------

    def source_client(self, address: str) -> SourceClient:
        """A connection to a catch-up source, with this job's token (and TLS
        when this replica has a certificate: agent/catchup_tls.py)."""
        if self._source_tls is None and catchup_tls.uses_tls(self._catch_up_tls):
            self._source_tls = catchup_tls.client_context(self._catch_up_tls)
        return SourceClient(address, self.config.token, timeout=self.config.timeout, tls=self._source_tls)

    def start(self, wait_for_replicas: int = 1, admission_timeout: float = 120.0) -> None:
        """Register, and return once this replica can train: for a fresh job,
        once a quorum of ``wait_for_replicas`` members includes it (a fresh
        job passes its replica count so that every replica starts at step 0
        together); for a replica behind the quorum, once it caught up from a
        peer and asked to join. Its first ``allreduce_gradients()`` then waits
        for the admission, replaying the steps the members take meanwhile, so
        that the members never wait for this replica's forward pass."""
        if self.config.shard_count > 1 and not dist.is_initialized():
            raise ConfigError(
                f"this replica group has {self.config.shard_count} ranks: call torch.distributed.init_process_group() "
                "(the group's own world, for FSDP) before Manager.start()"
            )
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self._drain.set())
        cfg = self.config
        self.group = ReplicaGroup(cfg.shard_rank, cfg.shard_count, max(cfg.timeout, admission_timeout))
        tls = catchup_tls.server_context(self._catch_up_tls)
        self._server = CatchUpServer(self.source, cfg.host, token=cfg.token, max_rate=cfg.catch_up_max_rate, tls=tls).start()
        self.membership.catch_up_addresses = self.group.all_gather_strings(self._server.address)
        if self.leader:
            self.membership.start()
        else:
            self.membership.observe(cfg.shard_rank)
        self._admission_timeout = admission_timeout
        self._joiner = Joiner(self)
        admitted = self._joiner.run(time.monotonic() + admission_timeout, min_members=wait_for_replicas)
        self.catch_up = self._joiner.report
        if admitted:
            self._admitted()
        else:
            self._following = True
            log.info("replica %s caught up to step %d; joining at its first all-reduce", cfg.replica_id, self.step)

    def _admitted(self) -> None:
        if self._joiner is not None and not self._joiner.source_address:
            self._joiner = None  # admitted as up to date: no source to let go of
        # Rank 0 saw the admission; the other ranks follow the same push on their own stream.
        quorum = self.tracker.wait_for_membership(self._admission_timeout)
        self.membership.training_quorum_id = quorum.id
        log.info("replica %s admitted in quorum %d at step %d", self.config.replica_id, quorum.id, self.step)
        if self.config.shard_count > 1:
            watchdog = (self.tracker, self.config.shard_rank, lambda: self.stopped, self._drain)
            threading.Thread(target=exit_when_evicted, args=watchdog, name="fthsdp-eviction-watchdog", daemon=True).start()

    def close(self, reason: str = "finished") -> None:
        """Leave the job (the others go on without this replica) and stop."""
        if not self.stopped:
            self.stopped = True
            try:
                self.membership.leave(reason)
            except FthsdpError as e:
                log.warning("could not tell the coordinator that this replica leaves: %s", e)
                self.membership.close()
            if self._server is not None:
                self._server.close()

    def __enter__(self) -> "Manager":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close("finished" if exc[0] is None else f"failed: {exc[1]}")

    # ----- the step ------------------------------------------------------------------

    def allreduce_gradients(self) -> StepResult | None:
        """Replace every gradient by its average over the quorum's replicas.

        With FSDP (HSDP), each rank all-reduces its own gradient shards with
        the same rank of the other replica groups. Returns None, leaving the
        gradients alone, once this replica has been drained out of the quorum.
        """
        if self.stopped:
            return None
        if self._reduced:
            raise ApiMisuse("allreduce_gradients() called twice in one step; call commit() after optimizer.step()")
        contributes = True
        if self._following:
            # Caught up, not yet admitted: follow the members until a quorum
            # includes this replica. The gradients just computed are then for
            # a step the state has moved past: this step contributes none.
            self._joiner.run(time.monotonic() + self._admission_timeout, until_admitted=True)
            self._following, contributes = False, False
            self._admitted()
        for p in self._params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)  # (a DTensor for an FSDP2 parameter)
        grads = [p.grad for p in self._params]
        shards = [_local(g) for g in grads]

        spare = shards[0].new_zeros(CONTROL_SLOTS)  # FTAR's switch proposals ride along

        def flatten() -> torch.Tensor:  # the gradients stay intact, so a redo can flatten again
            flat = torch.cat([g.reshape(-1) for g in shards] + [spare])
            return flat if contributes else flat.zero_()

        proposal, self._proposal = self._proposal, 0
        try:
            result = self.ftar.allreduce(
                self.step, flatten(), self.structure, refill=flatten, contributes=contributes, proposal=proposal,
                control_slots=True,
            )
        except Evicted:
            if self._drain.is_set():  # drained: the quorum went on without us
                self.stopped = True
                return None
            raise
        if not contributes and self.config.shard_count > 1:
            # Every rank of the group must have joined at the same step (the
            # members switch every shard's group at one agreed step boundary).
            top, neg_bottom = self.group.max(result.step, -result.step)
            if top != -neg_bottom:
                raise FtarError(f"the ranks of replica {self.replica_id} joined the quorum at steps {-neg_bottom}..{top}")
        for p, grad in zip(self._params, grads):
            p.grad = grad  # a joiner's replays inside FTAR reset the gradients; the result goes here
        offset = 0
        for g in shards:
            n = g.numel()
            # One pass per gradient: divide the sum straight into it.
            torch.div(result.total[offset : offset + n].view_as(g), result.contributors, out=g)
            offset += n
        self.step = result.step  # a joiner that closed a gap of several steps is further on
        self._reduced = True
        self.last = result
        # A snapshot taken at the last boundary must be copied before optimizer.step() changes the state.
        self.source.wait_copied(self.config.timeout)
        return result

    def commit(self) -> None:
        """Mark the step boundary after ``optimizer.step()``."""
        if self.stopped:
            return
        if not self._reduced:
            raise ApiMisuse("commit() before allreduce_gradients(): every step must all-reduce its gradients first")
        self._reduced = False
        self.step += 1
        m = self.membership
        m.step = self.step
        m.training_quorum_id = self.last.quorum_id
        every = self.config.checksum_every
        periodic = bool(every) and self.step % every == 0
        checksum = self.group_checksum() if periodic or self._checksum_wanted else ""
        if periodic:
            m.state_checksum, m.checksum_step = checksum, self.step
            m.recent_checksums = self._history.record(self.step, checksum)
        self._checksum_wanted = False
        last = self.last
        self.log.append(self.step - 1, last.total, last.contributors, last.quorum_id, self._hyperparams(), checksum)
        latest = m.latest
        drain = self._drain.is_set() or (latest is not None and latest.drain_requested)
        # Every rank of the group must stop, snapshot, or propose a switch to
        # a growth quorum at the same step boundary (the ranks' proposals
        # must be equal, so that every shard's group switches at one step).
        proposal = self.ftar.growth_ready()
        drain, snapshot, top, neg_bottom = self.group.max(int(drain), int(self.source.wanted), proposal, -proposal)
        self._proposal = top if top == -neg_bottom else 0
        if snapshot:
            self.source.take(self.step, capture_state(self.model, self.optimizer))
            self._checksum_wanted = True  # the joiner checks its replay against the next step's checksum
        else:
            self.source.expire()  # a joiner that died without releasing its snapshot
        if self._joiner is not None:
            self._joiner.finish()  # the first step in the quorum is committed: release the source
            self._joiner = None
        if drain:
            log.info("replica %s drains after step %d", self.config.replica_id, self.step)
            self.close("drained")

    # ----- catch-up (see agent/joiner.py) ----------------------------------------------

    def _hyperparams(self) -> str:
        """The optimizer's numeric hyperparameters, which a joiner replays."""
        groups = [
            {k: v for k, v in g.items() if k != "params" and isinstance(v, (int, float)) and not isinstance(v, bool)}
            for g in self.optimizer.param_groups
        ]
        return json.dumps(groups, separators=(",", ":"))

    def _set_hyperparams(self, text: str) -> None:
        groups = json.loads(text) if text else []
        if len(groups) != len(self.optimizer.param_groups):
            raise CatchUpError(f"the source's optimizer has {len(groups)} param groups, this one {len(self.optimizer.param_groups)}")
        for group, values in zip(self.optimizer.param_groups, groups):
            group.update(values)

    def load_snapshot(self, state: dict, step: int) -> None:
        load_state(self.model, self.optimizer, state)
        self.step = self.membership.step = step

    def replay(self, entry: cpb.LogEntry, total: torch.Tensor) -> None:
        """Apply one logged step, exactly as the members did."""
        if entry.step != self.step:
            raise CatchUpError(f"log entry of step {entry.step}, but this replica is at step {self.step}")
        if entry.numel != sum(_local(p).numel() for p in self._params):
            raise CatchUpError(f"log entry of {entry.numel} gradient elements for a model of a different size")
        self._set_hyperparams(entry.hyperparams_json)
        offset = 0
        for p in self._params:
            shard = _local(p)
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            n = shard.numel()
            grad = _local(p.grad)
            torch.div(total[offset : offset + n].view_as(grad).to(grad.device), entry.contributors, out=grad)
            offset += n
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.membership.step = self.step
        self.log.append(entry.step, total, entry.contributors, entry.quorum_id, entry.hyperparams_json)

    def _gap_client(self, head: int):
        client = self._joiner.gap_client() if self._joiner is not None else None
        if client is None:
            raise FtarError(f"this replica is at step {self.step}, the quorum at {head}, and it has no catch-up source")
        return client

    def _replay_until(self, client, target: int) -> None:
        while self.step < target:
            entries, _, _ = client.log(self.step, wait=self.config.timeout)
            for entry, data in entries:
                if entry.step >= target:
                    break
                self.replay(entry, data)

    def _close_gap(self, step: int, head: int) -> int:
        """FTAR found the members at ``head`` and this joiner, with a
        gradient for ``step``, two or more steps behind (admitted while it
        still replayed): replay from the catch-up source up to ``head - 1``
        with the hyperparameters of that step; FTAR then hands over the
        members' sum of ``head - 1``."""
        self._stop_following()
        client = self._gap_client(head)
        self.step = step
        target = head - 1
        self._replay_until(client, target)
        entries, _, _ = client.log(target, wait=self.config.timeout)
        if not entries or entries[0][0].step != target:
            raise FtarError(f"the catch-up source has no log entry of step {target}")
        self._set_hyperparams(entries[0][0].hyperparams_json)
        return self.step

    def _join_members(self, head: int):
        """FTAR: this joiner, without a gradient, joins the members' data
        all-reduce of step ``head``. Their hyperparameters for ``head`` are
        read now, while they wait in that all-reduce; the steps still missing
        are replayed while it runs (see ``FTAR.on_join``)."""
        client = self._gap_client(head)
        hyperparams = client.hyperparams()

        def replay() -> int:
            self._stop_following()  # it may be in the middle of a step: let it finish
            if self.step > head:
                raise FtarError(f"this replica is at step {self.step}, ahead of the quorum's {head}")
            self._replay_until(client, head)
            self._set_hyperparams(hyperparams)
            return self.step

        return replay

    def _follow_log(self) -> None:
        """FTAR: this joiner waits in its new group for the members to switch
        to it. It replays what they commit meanwhile on a helper thread:
        the members must never find it busy with a replay when they arrive
        (its part of their all-reduce needs no state, only zeros)."""
        joiner = self._joiner
        if self._follower is not None or joiner is None or not joiner.source_address:
            return
        stop = threading.Event()
        client = self.source_client(joiner.source_address)

        def follow() -> None:
            try:
                while not stop.is_set():
                    entries, _, _ = client.log(self.step, wait=0.05)
                    for entry, data in entries:
                        if stop.is_set():
                            break
                        self.replay(entry, data)
            except (CatchUpError, FthsdpError) as e:
                log.warning("following the log while waiting for the members: %s", e)
            finally:
                client.close()

        thread = threading.Thread(target=follow, name="fthsdp-follow-log", daemon=True)
        thread.start()
        self._follower = (thread, stop)

    def _stop_following(self) -> None:
        if self._follower is not None:
            thread, stop = self._follower
            stop.set()
            thread.join()
            self._follower = None

    def report_progress(self, done: int, total: int) -> None:
        if self.leader:
            self.membership.catch_up_progress = (done, total)

    def group_checksum(self) -> str:
        """The checksum of this rank's shards, combined over the replica group
        (a collective: every rank of the group calls it at the same point)."""
        own = state_checksum(self.model, self.optimizer, local=_local)
        if self.config.shard_count == 1:
            return own
        parts = self.group.all_gather_int(int(own, 16))
        return f"{zlib.crc32(b''.join(x.to_bytes(4, 'big') for x in parts)):08x}"

    @property
    def checksum(self) -> str:
        return self.membership.state_checksum
