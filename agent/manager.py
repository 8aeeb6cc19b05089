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

Data semantics: replica ``r`` trains on batch ``(step, r)`` of a deterministic
stream. While a replica is out, its batches are not trained on (the global
batch shrinks); no other replica skips or repeats data because of it.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import signal
import sys
import threading
import zlib
from collections.abc import Mapping

import torch
import torch.distributed as dist

from agent.checksum import state_checksum, structure_hash
from agent.ftar import FTAR, Evicted, QuorumTracker, StepResult
from agent.membership import Membership
from coordinator.errors import ConfigError, FthsdpError

log = logging.getLogger("fthsdp.agent.manager")


CHECKSUM_STRIDES = (1, 10, 100, 1000, 10000)
EVICTION_GRACE = 2.0
"""Seconds an evicted rank of a multi-rank group waits (for a drain to finish) before exiting."""
EXIT_EVICTED = 75


class ApiMisuse(FthsdpError):
    """The training script called the API out of order."""


@dataclasses.dataclass(frozen=True)
class ManagerConfig:
    """Settings of the fault-tolerant step (from FTHSDP_* set by `fthsdp agent`)."""

    coordinator: tuple[str, ...]
    """Coordinator addresses."""

    replica_id: str
    """This replica group's id."""

    job: str = "default"
    """Job name on the coordinator."""

    replica_rank: int = 0
    """This replica's fixed index, for data sharding."""

    num_replicas: int = 1
    """The nominal number of replicas, for data sharding."""

    host: str = "127.0.0.1"
    """Address other replicas use to reach this one."""

    timeout: float = 60.0
    """Longest wait for a collective or a quorum before giving up."""

    checksum_every: int = 10
    """Report the state checksum every this many steps (0: never). One checksum
    reads the whole state once (6.6 ms for the 3.2M-parameter example with
    AdamW, 38 MB, on one CPU core: 2-3% of its step), hence not every step."""

    shard_rank: int = 0
    """This rank's index inside its replica group (RANK from `fthsdp agent`)."""

    shard_count: int = 1
    """Ranks in the replica group (WORLD_SIZE): more than one for HSDP."""

    def __post_init__(self) -> None:
        if not self.coordinator:
            raise ConfigError("FTHSDP_COORDINATOR: no coordinator address")
        if not self.replica_id:
            raise ConfigError("FTHSDP_REPLICA_ID is not set: run the script under `fthsdp agent`")
        if self.replica_rank < 0 or self.num_replicas < 1:
            raise ConfigError("replica rank must be >= 0 and the number of replicas >= 1")
        if self.timeout <= 0 or self.checksum_every < 0:
            raise ConfigError("timeout must be positive and checksum_every >= 0")
        if not 0 <= self.shard_rank < self.shard_count:
            raise ConfigError(f"RANK {self.shard_rank} is outside WORLD_SIZE {self.shard_count}")

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides) -> "ManagerConfig":
        def get(name: str, default: str) -> str:
            return env.get(f"FTHSDP_{name}", default) or default

        try:
            values = dict(
                coordinator=tuple(a for a in get("COORDINATOR", "127.0.0.1:29510").split(",") if a),
                replica_id=get("REPLICA_ID", ""),
                job=get("JOB", "default"),
                replica_rank=int(get("REPLICA_RANK", "0")),
                num_replicas=int(get("NUM_REPLICAS", "1")),
                host=get("ADVERTISE_HOST", "127.0.0.1"),
                timeout=float(get("FTAR_TIMEOUT", "60")),
                checksum_every=int(get("CHECKSUM_EVERY", "10")),
                shard_rank=int(env.get("RANK", "0") or 0),
                shard_count=int(env.get("WORLD_SIZE", "1") or 1),
            )
        except ValueError as e:
            raise ConfigError(f"bad FTHSDP_* setting: {e}") from e
        values.update(overrides)
        return cls(**values)


class Manager:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: ManagerConfig) -> None:
        self.model = model
        self.optimizer = optimizer
        self.config = config
        self.step = 0
        self.stopped = False
        self.last: StepResult | None = None
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._structure = structure_hash(model)
        self._reduced = False
        self._history: dict[int, tuple[int, str]] = {}
        self._drain = threading.Event()
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
        self.membership = Membership(
            config.coordinator, config.job, config.replica_id, self.address or "unused:0", config.shard_count, 0
        )
        self.membership.add_listener(self.tracker.update)
        self.ftar = FTAR(self.tracker, config.job, shard_rank=config.shard_rank, timeout=config.timeout)

    @classmethod
    def from_env(cls, model, optimizer, env: Mapping[str, str] | None = None, **overrides) -> "Manager":
        return cls(model, optimizer, ManagerConfig.from_env(os.environ if env is None else env, **overrides))

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

    # ----- lifecycle -----------------------------------------------------------------

    def start(self, wait_for_replicas: int = 1, admission_timeout: float = 120.0) -> None:
        """Register and wait until a quorum of at least ``wait_for_replicas``
        members includes this replica (a fresh job passes its replica count so
        that every replica starts at step 0 together)."""
        if self.config.shard_count > 1 and not dist.is_initialized():
            raise ConfigError(
                f"this replica group has {self.config.shard_count} ranks: call torch.distributed.init_process_group() "
                "(the group's own world, for FSDP) before Manager.start()"
            )
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self._drain.set())
        if self.leader:
            self.membership.start()
        else:
            self.membership.observe(self.config.shard_rank)
        quorum = self.tracker.wait_for_membership(admission_timeout, wait_for_replicas)
        self.membership.training_quorum_id = quorum.id
        log.info("replica %s admitted in quorum %d", self.config.replica_id, quorum.id)
        if self.config.shard_count > 1:
            threading.Thread(target=self._eviction_watchdog, name="fthsdp-eviction-watchdog", daemon=True).start()

    def _eviction_watchdog(self) -> None:
        """Exit at once when the coordinator takes this replica group out.

        Another rank of the group may have died, on this node or another,
        leaving this one blocked in an FSDP collective that gloo would only
        time out much later. Out of the quorum this incarnation's state is
        lost anyway: exiting lets every node's agent restart the whole group.
        A drain (a planned exit at a step boundary) is given a grace period.
        """
        with self.tracker.cond:
            while not self.stopped:
                quorum = self.tracker.quorum
                if quorum is not None and not self.tracker.includes_me(quorum) and not self._drain.is_set():
                    self.tracker.cond.wait(EVICTION_GRACE)
                    quorum = self.tracker.quorum
                    if not self.stopped and not self._drain.is_set() and not self.tracker.includes_me(quorum):
                        print(
                            f"fthsdp: replica {self.config.replica_id} was taken out of quorum {quorum.id}; "
                            f"rank {self.config.shard_rank} exits so that its agent restarts the group",
                            file=sys.stderr,
                            flush=True,
                        )
                        os._exit(EXIT_EVICTED)
                self.tracker.cond.wait(1.0)

    def close(self, reason: str = "finished") -> None:
        """Leave the job (the others go on without this replica) and stop."""
        if not self.stopped:
            self.stopped = True
            try:
                self.membership.leave(reason)
            except FthsdpError as e:
                log.warning("could not tell the coordinator that this replica leaves: %s", e)
                self.membership.close()

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
        shards = [_local(p.grad) if p.grad is not None else torch.zeros_like(_local(p)) for p in self._params]

        def flatten() -> torch.Tensor:  # the gradients stay intact, so a redo can flatten again
            return torch.cat([g.reshape(-1) for g in shards])

        try:
            result = self.ftar.allreduce(self.step, flatten(), self._structure, refill=flatten)
        except Evicted:
            if self._drain.is_set():  # drained: the quorum went on without us
                self.stopped = True
                return None
            raise
        offset = 0
        for p, g in zip(self._params, shards):
            n = g.numel()
            if p.grad is None and not _is_dtensor(p):
                p.grad = g
            # One pass per gradient: divide the sum straight into it.
            torch.div(result.total[offset : offset + n].view_as(g), result.contributors, out=g)
            offset += n
        self._reduced = True
        self.last = result
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
        if every and self.step % every == 0:
            checksum = self._group_checksum()
            m.state_checksum, m.checksum_step = checksum, self.step
            m.recent_checksums = self._strided_history(checksum)
        latest = m.latest
        drain = self._drain.is_set() or (latest is not None and latest.drain_requested)
        if self.config.shard_count > 1:
            # Every rank of the group must stop at the same step boundary.
            flag = torch.tensor([int(drain)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            drain = bool(flag.item())
        if drain:
            log.info("replica %s drains after step %d", self.config.replica_id, self.step)
            self.close("drained")

    def _group_checksum(self) -> str:
        """The checksum of this rank's shards, combined over the replica group."""
        own = state_checksum(self.model, self.optimizer, local=_local)
        if self.config.shard_count == 1:
            return own
        parts = [torch.zeros(1, dtype=torch.int64) for _ in range(self.config.shard_count)]
        dist.all_gather(parts, torch.tensor([int(own, 16)], dtype=torch.int64))
        return f"{zlib.crc32(b''.join(int(x).to_bytes(4, 'big') for x in parts)):08x}"

    def _strided_history(self, checksum: str) -> dict[int, str]:
        """The latest checksum at each stride of 1, 10, 100... checksum periods:
        replicas whose heartbeats sample different steps still share some."""
        every = self.config.checksum_every
        for level in CHECKSUM_STRIDES:
            if self.step % (every * level) == 0:
                self._history[level] = (self.step, checksum)
        return dict(self._history.values())

    @property
    def checksum(self) -> str:
        return self.membership.state_checksum



def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "to_local") and hasattr(t, "placements")


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 (DTensor) parameter or gradient; the tensor itself otherwise."""
    return t.to_local() if _is_dtensor(t) else t
