"""Settings of the fault-tolerant step, from the FTHSDP_* variables that
`fthsdp agent` sets for its ranks (``ManagerConfig.from_env``, the one place
they are parsed, from the mapping ``Manager.from_env`` hands it: the training
process's entry point, and the one place the training library takes settings
from ``os.environ``); explicit keyword arguments win."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fthsdp.core.checkpoint_dir import check_checkpoint_dir
from fthsdp.core.credentials import TlsFiles, read_token_file
from fthsdp.core.errors import ConfigError
from fthsdp.core.every import Every, parse_every


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
    """Address other replicas use to reach this one (FTHSDP_ADVERTISE_HOST):
    its rendezvous store, catch-up server and cross-replica gloo pairs bind it."""

    gloo_interface: str = ""
    """GLOO_SOCKET_IFNAME, when set: the interface the cross-replica gloo
    pairs use instead of ``host``'s (torch's own setting, honoured)."""

    timeout: float = 60.0
    """Longest wait for a collective or a quorum before giving up
    (FtarTimeout); a collective waits at least the coordinator's hang limit
    for a verdict on a hung member first (fthsdp/coordinator/decisions/hang.py)."""

    checksum_every: int = 10
    """Report the state checksum every this many steps (0: never). One checksum
    reads the whole state once (6.6 ms for the 3.2M-parameter example with
    AdamW, 38 MB, on one CPU core: 2-3% of its step), hence not every step."""

    shard_rank: int = 0
    """This rank's index inside its replica group (RANK from `fthsdp agent`)."""

    shard_count: int = 1
    """Ranks in the replica group (WORLD_SIZE): more than one for HSDP."""

    token: str = dataclasses.field(default="", repr=False)
    """Bearer token presented to the coordinator, and the key of the
    transfer tokens catch-up servers require and joiners present
    (fthsdp/agent/training/catchup/transfer_token.py): the job's one credential (read
    from FTHSDP_TOKEN_FILE, which `fthsdp agent --token-file` sets); empty:
    no authentication."""

    tls: TlsFiles = TlsFiles()
    """TLS to the coordinator (FTHSDP_TLS_CA, _CERT, _KEY, set by `fthsdp agent`); off when empty."""

    catch_up_tls: bool = True
    """Serve and fetch catch-up over TLS whenever the coordinator uses it:
    with this replica's certificate and key (FTHSDP_TLS_CERT/_KEY: mutual
    TLS), or, with a CA file only, an ephemeral certificate that joiners pin
    (fthsdp/agent/training/catchup/tls.py). Python's TLS costs the bulk transfer
    about two thirds of its throughput (benchmarks/README.md); off keeps plain
    HTTP guarded by the transfer tokens, for networks the job trusts."""

    catch_up_max_rate: float = 0.0
    """Bytes per second a catch-up server sends of a snapshot to one joiner
    (0: no limit), so that a catch-up does not crowd out the training
    traffic. The gradient log is never limited: a joiner must replay faster
    than the members train."""

    catch_up_log_steps: int = 4
    """Recent step gradients every replica keeps (enough to close the last
    gap of an admitted joiner)."""

    catch_up_log_bytes: int = 2 << 30
    """The most bytes of step gradients kept while a snapshot is served,
    for the joiner to replay; a joiner that falls further behind takes a
    fresh snapshot."""

    cross_replica_backend: str = "auto"
    """What the all-reduce across replicas runs on (FTHSDP_CROSS_REPLICA_BACKEND;
    fthsdp/agent/training/transport/): gloo, nccl, or auto (NCCL for CUDA gradients)."""

    cross_replica_groups: str = "auto"
    """How the cross-replica gloo group follows the quorum (FTHSDP_CROSS_REPLICA_GROUPS;
    fthsdp/agent/training/transport/reconfigure.py): reconfigure (one group for
    the life of the process, reconfigured in place per quorum: torch >= 2.14),
    per-quorum (a new group per quorum), or auto (reconfigure where torch can)."""

    catch_up_transport: str = "auto"
    """How this rank copies a peer's snapshot when it joins (FTHSDP_CATCH_UP_TRANSPORT;
    fthsdp/agent/training/catchup/group.py): http, distributed (a two-rank group of
    the cross-replica backend, HTTP taking over if it breaks off), or auto
    (distributed on NCCL without catch-up TLS, else http)."""

    bucket_cap_mb: float = 25.0
    """The buckets of the all-reduce started during the backward pass
    (FTHSDP_BUCKET_CAP_MB; fthsdp/agent/training/ftar/overlap.py); 0: one all-reduce after it."""

    checkpoint_dir: str = ""
    """Where durable checkpoints go (FTHSDP_CHECKPOINT_DIR, from `fthsdp
    agent --checkpoint-dir`): a folder every replica of the job can read
    and write; "": no checkpoints (fthsdp/agent/training/checkpoint/)."""

    checkpoint_every: Every = Every()
    """How often to save (FTHSDP_CHECKPOINT_EVERY): every N steps or every
    T of wall-clock time (fthsdp/core/every.py); an int or a string such as
    "30m" is read as ``parse_every`` reads it. Never by default."""

    checkpoint_keep: int = 3
    """Complete checkpoints kept; older ones are deleted."""

    resume: bool = False
    """Start a job from the newest complete checkpoint in ``checkpoint_dir``."""

    restart_count: int = 0
    """How often the node agent restarted this replica group before this
    process (FTHSDP_RESTART_COUNT): names the incarnation that a hang notice is for."""

    agent_id: str = ""
    """The id of the node agent that started this process (FTHSDP_AGENT_ID,
    set by `fthsdp agent`), sent when registering: the coordinator takes only
    that agent's reports about this incarnation. "": not started by an agent."""

    outcome_file: str = ""
    """Where this process writes how it ended (drained, finished, ...) for its
    node agent (FTHSDP_OUTCOME_FILE, set by `fthsdp agent`; fthsdp/agent/outcome.py);
    "": nowhere."""

    standalone: bool = False
    """No coordinator and no other replica: the script runs as one replica on
    its own, as plain PyTorch would (``allreduce_gradients()`` averages over
    this replica alone, ``commit()`` runs the update; nothing is fault
    tolerant). What ``from_env`` gives a script started outside `fthsdp
    agent` (no FTHSDP_REPLICA_ID), so that it debugs as a plain run."""

    def __post_init__(self) -> None:
        if self.standalone:
            if self.num_replicas != 1 or self.replica_rank != 0:
                raise ConfigError("a standalone replica (no `fthsdp agent`) is the only one: "
                                  f"replica rank {self.replica_rank} of {self.num_replicas}")
        elif not self.coordinator:
            raise ConfigError("FTHSDP_COORDINATOR is not set but FTHSDP_REPLICA_ID is: run the script under "
                              "`fthsdp agent`, or unset both to train standalone")
        elif not self.replica_id:
            raise ConfigError("FTHSDP_REPLICA_ID is not set but FTHSDP_COORDINATOR is: run the script under "
                              "`fthsdp agent`, or unset both to train standalone")
        if self.replica_rank < 0 or self.num_replicas < 1:
            raise ConfigError("replica rank must be >= 0 and the number of replicas >= 1")
        if self.timeout <= 0 or self.checksum_every < 0:
            raise ConfigError("timeout must be positive and checksum_every >= 0")
        if not 0 <= self.shard_rank < self.shard_count:
            raise ConfigError(f"RANK {self.shard_rank} is outside WORLD_SIZE {self.shard_count}")
        if self.cross_replica_backend not in ("auto", "gloo", "nccl"):
            raise ConfigError("FTHSDP_CROSS_REPLICA_BACKEND must be auto, gloo or nccl, got "
                              f"{self.cross_replica_backend!r}")
        if self.cross_replica_groups not in ("auto", "reconfigure", "per-quorum"):
            raise ConfigError("FTHSDP_CROSS_REPLICA_GROUPS must be auto, reconfigure or per-quorum, got "
                              f"{self.cross_replica_groups!r}")
        if self.catch_up_transport not in ("auto", "http", "distributed"):
            raise ConfigError("FTHSDP_CATCH_UP_TRANSPORT must be auto, http or distributed, got "
                              f"{self.catch_up_transport!r}")
        if not 0 <= self.bucket_cap_mb <= 1 << 20:
            raise ConfigError(f"FTHSDP_BUCKET_CAP_MB must be between 0 and {1 << 20}, got {self.bucket_cap_mb:g}")
        if self.catch_up_max_rate < 0 or self.catch_up_log_steps < 1 or self.catch_up_log_bytes < 0:
            raise ConfigError("catch-up settings: the rate and log bytes must be >= 0, the log steps >= 1")
        if not isinstance(self.checkpoint_every, Every):  # 500 or "30m" given in code
            object.__setattr__(self, "checkpoint_every", parse_every(self.checkpoint_every, "checkpoint_every"))
        if self.checkpoint_keep < 1:
            raise ConfigError("FTHSDP_CHECKPOINT_KEEP must be >= 1")
        if (not self.checkpoint_every.never or self.resume) and not self.checkpoint_dir:
            raise ConfigError("FTHSDP_CHECKPOINT_EVERY and FTHSDP_RESUME need FTHSDP_CHECKPOINT_DIR")
        if self.checkpoint_dir:
            check_checkpoint_dir(self.checkpoint_dir, "FTHSDP_CHECKPOINT_DIR")

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides) -> ManagerConfig:
        """The settings `fthsdp agent` gives its ranks; with neither
        FTHSDP_REPLICA_ID nor FTHSDP_COORDINATOR (a script started on its own,
        not by the agent) a ``standalone`` replica. One of them without the
        other is a half-configured replica: a ConfigError."""
        def get(name: str, default: str) -> str:
            return env.get(f"FTHSDP_{name}", default) or default

        started_alone = not get("REPLICA_ID", "") and not get("COORDINATOR", "")
        if started_alone and "standalone" not in overrides and "replica_id" not in overrides:
            overrides = {"replica_id": "standalone", "standalone": True, **overrides}

        try:
            values: dict[str, Any] = dict(
                coordinator=tuple(a for a in get("COORDINATOR", "").split(",") if a),
                replica_id=get("REPLICA_ID", ""),
                job=get("JOB", "default"),
                replica_rank=int(get("REPLICA_RANK", "0")),
                num_replicas=int(get("NUM_REPLICAS", "1")),
                host=get("ADVERTISE_HOST", "127.0.0.1"),
                gloo_interface=env.get("GLOO_SOCKET_IFNAME", ""),
                timeout=float(get("FTAR_TIMEOUT", "60")),
                checksum_every=int(get("CHECKSUM_EVERY", "10")),
                shard_rank=int(env.get("RANK", "0") or 0),
                shard_count=int(env.get("WORLD_SIZE", "1") or 1),
                token=read_token_file(get("TOKEN_FILE", ""), "FTHSDP_TOKEN_FILE"),
                tls=TlsFiles(get("TLS_CA", ""), get("TLS_CERT", ""), get("TLS_KEY", "")),
                catch_up_tls=_flag(get("CATCH_UP_TLS", "1"), "FTHSDP_CATCH_UP_TLS"),
                catch_up_max_rate=float(get("CATCH_UP_MAX_RATE", "0")),
                catch_up_log_steps=int(get("CATCH_UP_LOG_STEPS", "4")),
                catch_up_log_bytes=int(get("CATCH_UP_LOG_BYTES", str(2 << 30))),
                bucket_cap_mb=float(get("BUCKET_CAP_MB", "25")),
                cross_replica_backend=get("CROSS_REPLICA_BACKEND", "auto"),
                cross_replica_groups=get("CROSS_REPLICA_GROUPS", "auto"),
                catch_up_transport=get("CATCH_UP_TRANSPORT", "auto"),
                checkpoint_dir=get("CHECKPOINT_DIR", ""),
                checkpoint_every=parse_every(get("CHECKPOINT_EVERY", "0"), "FTHSDP_CHECKPOINT_EVERY"),
                checkpoint_keep=int(get("CHECKPOINT_KEEP", "3")),
                resume=_flag(get("RESUME", "0"), "FTHSDP_RESUME"),
                restart_count=int(get("RESTART_COUNT", "0")),
                agent_id=get("AGENT_ID", ""),
                outcome_file=get("OUTCOME_FILE", ""),
            )
        except ValueError as e:
            raise ConfigError(f"bad FTHSDP_* setting: {e}") from e
        values.update(overrides)
        return cls(**values)


def _flag(value: str, name: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be 1/0, true/false, yes/no or on/off, got {value!r}")
