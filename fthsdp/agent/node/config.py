"""The node agent's configuration (flags, FTHSDP_* variables, [agent] in TOML).

Built the same way as ``CoordinatorConfig``: a frozen dataclass whose field
docstrings are the ``--help`` text, validated in ``__post_init__`` so that a
bad setting is one ``ConfigError`` line, and layered by
``fthsdp.core.settings.resolve``.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Mapping, Sequence

from fthsdp.core.checkpoint_dir import check_checkpoint_dir
from fthsdp.core.credentials import TlsFiles, read_token_file
from fthsdp.core.errors import ConfigError
from fthsdp.core.every import Every
from fthsdp.core.log_format import check_log_format
from fthsdp.core.names import MAX_JOB_LEN, MAX_REPLICA_ID_LEN, name_problem, split_host_port
from fthsdp.core.relay_address import LOCAL_PING_EVERY as LOCAL_EVERY
from fthsdp.core.settings import DURATION, EVERY, load_toml, resolve

MAX_BACKOFF = 30.0
"""The restart back-off doubles per restart up to this many seconds."""

_TRAILING_DIGITS = re.compile(r"(\d+)$")


def coordinator_addresses(text: str) -> list[str]:
    """'h1:p1,h2:p2' -> ['h1:p1', 'h2:p2'] (the same rule as the client's, without
    importing gRPC just to build the command line)."""
    out = [part.strip() for part in text.split(",") if part.strip()]
    if not out:
        raise ConfigError("--coordinator: give at least one HOST:PORT")
    for part in out:
        try:
            split_host_port(part, "--coordinator")
        except ValueError as e:
            raise ConfigError(str(e)) from e
    return out


def replica_rank_from_id(replica_id: str, num_replicas: int) -> int:
    """The default replica rank: 0 for a job of one replica group (a name is
    not a number: `--replica-id r5` alone is a valid replica); else the
    trailing digits of the id ('replica-3' -> 3), or 0 if it has none. The
    caller refuses digits outside ``num_replicas``: wrapping them round would
    silently train two groups on one data shard."""
    match = _TRAILING_DIGITS.search(replica_id)
    return int(match.group(1)) if match and num_replicas > 1 else 0


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """Settings of ``fthsdp agent``."""

    coordinator: str = "127.0.0.1:29510"
    """Coordinator address(es), HOST:PORT[,HOST:PORT...], that agent events are reported to (and that ranks are told
    about)."""

    job: str = "default"
    """Name of the training job this replica group belongs to."""

    replica_id: str = ""
    """Name of this replica group (required, except with --spare), e.g. replica-3; unique within the job. Every host
    of a group of several hosts gives the same id."""

    replica_rank: int = -1
    """Index of this replica among --num-replicas, for data sharding; -1 (the default) takes the trailing digits of
    --replica-id (replica-3 -> 3) when --num-replicas is above 1, else 0."""

    num_replicas: int = 1
    """Nominal number of replica groups in the job, for data sharding."""

    nproc: int = 1
    """Ranks to start on this node (usually one per GPU)."""

    nnodes: int = 1
    """Hosts that the ranks of this replica group span, one agent each. Above 1, the group's hosts meet through the
    coordinator (a rendezvous round per incarnation: node ranks, the store, the round number as restart count), unless
    --master-port is given (a static launch: every host then gives the same --master-addr and --master-port and its own
    --node-rank)."""

    node_rank: int = -1
    """Index of this host among --nnodes; RANK = node_rank * nproc + local rank. -1 (the default): 0 with --nnodes 1,
    else the coordinator's rendezvous hands it out; give it only for a static launch (with --master-port)."""

    master_addr: str = "127.0.0.1"
    """Address of the replica group's rank 0 (torch.distributed's MASTER_ADDR) for a static launch of several hosts."""

    master_port: int = 0
    """Port of the replica group's store (MASTER_PORT); 0 (the default): a free port at every start with --nnodes 1,
    the rendezvous's store with --nnodes above 1. Given with --nnodes above 1: a static launch."""

    host_id: str = ""
    """This host's name in its group's rendezvous, unique in the job; empty: the host name. Give each agent its own
    when several share a host name (containers, network namespaces, tests): while one agent's stream is open under
    a host id, the coordinator refuses another agent that says it."""

    spare: bool = False
    """Register this host as a spare of the job instead of a member of a group: the coordinator gives it the node rank
    of a host a group lost (after the coordinator's --spare-wait) and it trains as that group's host from then on.
    Give --nnodes and --nproc as the groups' hosts do, and no --replica-id."""

    rendezvous_timeout: float = dataclasses.field(default=600.0, metadata=DURATION)
    """With --nnodes above 1: how long a rendezvous round may gather (hosts missing, no spare) before the group's agents
    give up, saying why."""

    cross_replica_backend: str = "auto"
    """What the all-reduce across replica groups runs on (passed as FTHSDP_CROSS_REPLICA_BACKEND): gloo, nccl, or
    auto: NCCL when the gradients are on a GPU (each replica's rank k on a GPU of its own: NCCL refuses two ranks on
    one), else gloo."""

    cross_replica_groups: str = "auto"
    """How the cross-replica gloo group follows the quorum (passed as FTHSDP_CROSS_REPLICA_GROUPS): reconfigure (one
    group per rank for the life of the process, reconfigured in place per quorum: torch >= 2.14), per-quorum (a new
    group per quorum), or auto: reconfigure where torch can. NCCL builds a communicator per quorum."""

    catch_up_transport: str = "auto"
    """How a joiner copies a peer's snapshot (passed as FTHSDP_CATCH_UP_TRANSPORT): http; distributed (over a
    two-rank group of the cross-replica backend: NCCL between GPUs, gloo on CPU; HTTP takes over if it breaks off);
    or auto: distributed when the cross-replica all-reduce runs on NCCL and catch-up is not over TLS, else http."""

    bucket_cap_mb: float = 25.0
    """Size of the buckets in which the cross-replica all-reduce starts during the backward pass, as torch DDP's
    bucket_cap_mb (passed as FTHSDP_BUCKET_CAP_MB); 0: one all-reduce after the backward pass. The same on every
    agent of the job."""

    max_restarts: int = 3
    """How often the whole group is restarted after a rank fails before the agent gives up."""

    restart_backoff: float = dataclasses.field(default=1.0, metadata=DURATION)
    """Pause before restarting a group that failed within a minute of starting (a crash loop); doubles at every further
    such restart, up to 30s. A group that ran longer restarts at once."""

    standby_delay: float = dataclasses.field(default=10.0, metadata=DURATION)
    """With --standby: how long after a (re)start the next standby is started, so that its start-up does not take CPU
    from a group still catching up."""

    standby: bool = False
    """Keep a warm standby of the rank command (started ahead with the next restart's environment, waiting inside
    Manager.from_env with torch imported and the model built) to replace a failed group without process start-up. What
    the script does before Manager.from_env runs ahead of time, and the model takes memory twice (on the GPU for a GPU
    model). Only with --nnodes 1."""

    monitor_interval: float = dataclasses.field(default=0.1, metadata=DURATION)
    """How often the ranks are checked for exits."""

    stop_timeout: float = dataclasses.field(default=10.0, metadata=DURATION)
    """How long ranks get to exit after SIGTERM before they are SIGKILLed."""

    hang_grace: float = dataclasses.field(default=5.0, metadata=DURATION)
    """How long the ranks of a replica the coordinator took out as hung (fthsdp/coordinator/decisions/hang.py) get
    after SIGTERM
    before SIGKILL; their stack dumps are written as the notice arrives."""

    rank_silence: float = dataclasses.field(default=10.0, metadata=DURATION)
    """How long a local rank may send this agent no ping before the agent calls it stopped or hung and ends its group's
    ranks, as after a crash. Every rank pings its agent once a second, whatever the coordinator's pace (at thousands
    of hosts the coordinator's own heartbeat timeout stretches to most of a minute). A loop hung while its threads
    run is the coordinator's progress verdict (--hang-grace)."""

    checkpoint_dir: str = ""
    """Folder for durable checkpoints of the committed state, on a filesystem every node of the job shares (passed to
    the ranks as FTHSDP_CHECKPOINT_DIR); each replica writes 1/R of each checkpoint. Empty: no checkpoints."""

    checkpoint_every: Every = dataclasses.field(default=Every(), metadata=EVERY)
    """How often to save a checkpoint, all members at the same step boundary, in the background: a number of steps
    (500: at every multiple of 500) or a time (30m, 90s, 2h: at the first boundary after that long since the last
    one); 0: never. Needs --checkpoint-dir."""

    checkpoint_keep: int = 3
    """Complete checkpoints kept; older ones are deleted once a newer one is complete."""

    resume: bool = False
    """A replica that starts a job (no quorum exists yet, nothing to catch up from) first loads the newest complete
    checkpoint of this job in --checkpoint-dir, and the job goes on from its step."""

    token_file: str = ""
    """File holding the job's bearer token: presented to the coordinator, and passed to the ranks (FTHSDP_TOKEN_FILE)
    for their coordinator calls and catch-up transfers. Empty: no token."""

    tls_ca: str = ""
    """Connect to the coordinator over TLS, trusting this PEM CA bundle (passed to the ranks as FTHSDP_TLS_CA)."""

    tls_cert: str = ""
    """PEM client certificate for a coordinator that requires mutual TLS, with --tls-key (passed to the ranks)."""

    tls_key: str = ""
    """PEM key of --tls-cert."""

    log_level: str = "info"
    """debug, info, warning or error."""

    log_format: str = "text"
    """text or json (one JSON object per line: time, level, logger, message and the event's fields) for the agent's own
    log; the ranks' output passes through unchanged."""

    @property
    def tls(self) -> TlsFiles:
        return TlsFiles(self.tls_ca, self.tls_cert, self.tls_key)

    def __post_init__(self) -> None:
        coordinator_addresses(self.coordinator)
        read_token_file(self.token_file)
        self.tls.check()
        problem = name_problem("job name", self.job, MAX_JOB_LEN)
        if problem:
            raise ConfigError(f"--job: {problem}")
        if self.spare and self.replica_id:
            raise ConfigError(f"--spare and --replica-id {self.replica_id}: a spare serves whichever group needs a "
                              "host; give one or the other")
        if not self.replica_id and not self.spare:
            raise ConfigError("--replica-id is required (the name of this replica group, e.g. replica-0), "
                              "or --spare for a spare host")
        if self.replica_id:
            problem = name_problem("replica id", self.replica_id, MAX_REPLICA_ID_LEN)
            if problem:
                raise ConfigError(f"--replica-id: {problem}")
        if self.host_id:
            problem = name_problem("host id", self.host_id, MAX_REPLICA_ID_LEN)
            if problem:
                raise ConfigError(f"--host-id: {problem}")
        derived = self.replica_rank == -1
        if derived:
            # The documented default, filled in here so that every layer
            # (flag, env, file) that sets replica_id also moves the default.
            object.__setattr__(self, "replica_rank", replica_rank_from_id(self.replica_id, max(self.num_replicas, 1)))
        for name in ("nproc", "nnodes", "num_replicas"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.replica_rank < 0:
            raise ConfigError(f"--replica-rank must not be negative, got {self.replica_rank}")
        if self.replica_rank >= self.num_replicas:
            if derived:
                raise ConfigError(
                    f"--replica-id {self.replica_id} reads as replica rank {self.replica_rank}, which is not below "
                    f"--num-replicas {self.num_replicas}: number the replica ids from 0, set --num-replicas to the "
                    "number of replica groups, or give --replica-rank")
            raise ConfigError(
                f"--replica-rank {self.replica_rank} must be less than --num-replicas {self.num_replicas}; "
                "set --num-replicas to the number of replica groups"
            )
        if self.node_rank == -1 and not self.rendezvous:
            object.__setattr__(self, "node_rank", 0 if self.nnodes == 1 else -1)
        if self.spare and self.nnodes == 1:
            raise ConfigError("--spare needs the --nnodes of the groups it may serve (above 1): a group of one host is "
                              "restarted by its own agent")
        if self.spare and self.master_port:
            raise ConfigError("--spare works through the coordinator's rendezvous: give no --master-port")
        if self.rendezvous and self.node_rank != -1:
            raise ConfigError(f"--node-rank {self.node_rank} without --master-port: with --nnodes {self.nnodes} the "
                              "coordinator hands out node ranks; give --master-port (and --master-addr) too for a "
                              "static launch")
        if self.nnodes > 1 and self.master_port and self.node_rank == -1:
            raise ConfigError(f"--master-port {self.master_port} with --nnodes {self.nnodes} is a static launch: give "
                              "each host its --node-rank (or leave out --master-port to meet through the coordinator)")
        if not self.rendezvous and not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"--node-rank must be in [0, --nnodes={self.nnodes}), got {self.node_rank}")
        if self.rendezvous_timeout <= 0:
            raise ConfigError(f"--rendezvous-timeout must be positive, got {self.rendezvous_timeout:g}")
        if not self.master_addr.strip():
            raise ConfigError("--master-addr must not be empty")
        if not 0 <= self.master_port <= 65535:
            raise ConfigError(f"--master-port {self.master_port} is out of range")
        if self.standby and self.nnodes > 1:
            raise ConfigError("--standby works only with --nnodes 1 (a standby group must be complete on one node)")
        if self.cross_replica_backend not in ("auto", "gloo", "nccl"):
            raise ConfigError(f"--cross-replica-backend must be auto, gloo or nccl, got {self.cross_replica_backend!r}")
        if self.cross_replica_groups not in ("auto", "reconfigure", "per-quorum"):
            raise ConfigError("--cross-replica-groups must be auto, reconfigure or per-quorum, got "
                              f"{self.cross_replica_groups!r}")
        if self.catch_up_transport not in ("auto", "http", "distributed"):
            raise ConfigError(
                f"--catch-up-transport must be auto, http or distributed, got {self.catch_up_transport!r}"
            )
        if not 0 <= self.bucket_cap_mb <= 1 << 20:
            raise ConfigError(f"--bucket-cap-mb must be between 0 and {1 << 20}, got {self.bucket_cap_mb:g}")
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts must not be negative, got {self.max_restarts}")
        for name in ("restart_backoff", "stop_timeout", "standby_delay", "hang_grace"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must not be negative, got {getattr(self, name)}")
        if self.rank_silence <= LOCAL_EVERY:
            raise ConfigError(f"--rank-silence must be longer than the ranks' ping period ({LOCAL_EVERY:g}s), got "
                              f"{self.rank_silence:g}")
        if self.monitor_interval <= 0:
            raise ConfigError(f"--monitor-interval must be positive, got {self.monitor_interval}")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"--log-level must be debug, info, warning or error, got {self.log_level!r}")
        check_log_format(self.log_format)
        if self.checkpoint_keep < 1:
            raise ConfigError("--checkpoint-keep must be at least 1")
        if (not self.checkpoint_every.never or self.resume) and not self.checkpoint_dir:
            raise ConfigError("--checkpoint-every and --resume need --checkpoint-dir")
        if self.checkpoint_dir:
            check_checkpoint_dir(self.checkpoint_dir, "--checkpoint-dir")

    @property
    def rendezvous(self) -> bool:
        """Whether this host meets its group through the coordinator (not a static launch)."""
        return self.spare or (self.nnodes > 1 and self.master_port == 0)

    @property
    def coordinators(self) -> list[str]:
        return coordinator_addresses(self.coordinator)


_NOT_SETTINGS = ("command", "run", "config", "rank_command")


def config_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[AgentConfig, list[str]]:
    """The resolved config and the rank command from ``fthsdp agent``'s parsed arguments."""
    file_values = load_toml(args.config, "agent") if args.config else None
    flags = {k: v for k, v in vars(args).items() if k not in _NOT_SETTINGS}
    config = resolve(AgentConfig, flags, env, file_values, file_name=args.config or "config file")
    return config, rank_command(args.rank_command)


def rank_command(remainder: Sequence[str]) -> list[str]:
    """The command after ``--``. argparse's REMAINDER keeps the ``--`` itself
    (on Python 3.11), so it is dropped here; a command without ``--`` is taken
    too, as torchrun does, since the two cannot be told apart everywhere."""
    command = list(remainder)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError(
            "no rank command: give it after '--', e.g. fthsdp agent --replica-id replica-0 -- python train.py"
        )
    return command
