"""The coordinator's configuration (flags, FTHSDP_* variables, [coordinator] in TOML)."""

from __future__ import annotations

import dataclasses

from fthsdp.coordinator.decisions.hang import HangRules
from fthsdp.coordinator.decisions.quorum_types import Rules
from fthsdp.coordinator.hosts.rendezvous import RendezvousRules
from fthsdp.core.credentials import TlsFiles, read_token_file
from fthsdp.core.errors import ConfigError
from fthsdp.core.log_format import check_log_format
from fthsdp.core.names import MAX_JOB_LEN, name_problem, split_host_port
from fthsdp.core.settings import DURATION, LIST

DEFAULT_PORT = 29510


@dataclasses.dataclass(frozen=True)
class JobSettings:
    """What the engine reads of the configuration for each job it serves
    (``CoordinatorConfig.job_settings``): each setting reaches the rule that
    uses it by this one route, and nothing past the engine's composition
    (fthsdp/coordinator/engine/runtime.py) reads the configuration itself."""

    store_prefix: str
    """Key prefix in the store; the job's keys are under PREFIX/jobs/JOB/ (--store-prefix)."""

    rules: Rules
    """The quorum decision's rules as configured; the heartbeat timeout and the join settle stretch with the
    heartbeat pace and the quorum's size from these (fthsdp/coordinator/engine/decision_loop.py ``_pace``)."""

    hang_rules: HangRules
    """When a member is hung or a straggler (fthsdp/coordinator/decisions/hang.py)."""

    heartbeat_interval: float
    """The replicas' heartbeat interval before pacing (--heartbeat-interval)."""

    heartbeat_budget: float
    """Heartbeats per second the pace keeps the job's senders to (--heartbeat-budget; 0: no limit)."""

    rendezvous: RendezvousRules
    """How the rounds of groups of several hosts wait for spares (fthsdp/coordinator/hosts/rendezvous.py)."""

    auto_restore: bool
    """Whether a lost state is restored from the newest checkpoint without an operator (--auto-restore)."""


@dataclasses.dataclass(frozen=True)
class CoordinatorConfig:
    """Settings of ``fthsdp coordinator``."""

    bind: str = f"0.0.0.0:{DEFAULT_PORT}"
    """HOST:PORT to serve gRPC on; port 0 picks a free port."""

    advertise: str = ""
    """HOST:PORT that clients should use to reach this coordinator (shown as the leader); empty: the bind address, with
    this host's name for a wildcard host."""

    store: str = "memory"
    """Where the quorum and membership live: 'memory' (embedded, one machine, lost on restart) or
    etcd://HOST:PORT[,HOST:PORT...]."""

    store_prefix: str = "/fthsdp/v1"
    """Key prefix in the store; each job's keys are under PREFIX/jobs/JOB/."""

    store_timeout: float = dataclasses.field(default=2.0, metadata=DURATION)
    """Deadline of one store operation."""

    job: tuple[str, ...] = dataclasses.field(default=("default",), metadata=LIST)
    """Job names this coordinator serves (repeat the flag or separate with commas); several jobs can share one
    coordinator and one etcd."""

    min_replicas: int = 1
    """Fewest replicas that may form a quorum."""

    heartbeat_interval: float = dataclasses.field(default=1.0, metadata=DURATION)
    """How often replicas are told to heartbeat."""

    heartbeat_timeout: float = dataclasses.field(default=5.0, metadata=DURATION)
    """A replica silent this long is dropped from the next quorum."""

    member_lease: float = dataclasses.field(default=5.0, metadata=DURATION)
    """A member that has not had an answer from the coordinator for this long (counted from the heartbeat answered)
    commits no more steps until it has one; the coordinator waits out the leases of members it cannot confirm dead
    before it declares the state lost, restores a checkpoint or forms a quorum without any previous member, so that a
    quorum cut from it never trains on beside a new one. It must outlast a coordinator restart or failover plus a
    heartbeat interval (else training pauses through one), and is at least 3 heartbeat intervals (stretched with
    them); longer than --heartbeat-timeout + --join-timeout delays those decisions past the split-brain guard."""

    heartbeat_budget: float = 5000.0
    """Most heartbeats per second to ask for, every replica and rank together: with more senders than this times
    --heartbeat-interval, the interval (and --heartbeat-timeout in proportion) stretches to fit. A crash is noticed as
    fast either way (the replica's session stream closes, the agent reports); a hang takes longer. 0: no limit."""

    join_timeout: float = dataclasses.field(default=10.0, metadata=DURATION)
    """How long a ready joiner waits for other catching-up replicas so that they join together, and how long the
    split-brain guard waits before shrinking to a minority."""

    join_settle: float = dataclasses.field(default=0.2, metadata=DURATION)
    """Admit joiners once none has become ready for this long, so that replicas arriving in a burst (a job starting)
    join in a few membership changes rather than one each; capped by --join-timeout. A large quorum waits longer (0.2 ms
    per member: every change is pushed to every member; 2 s at 10,000). 0 admits at once in a small quorum."""

    spare_wait: float = dataclasses.field(default=10.0, metadata=DURATION)
    """How long a replica group of several hosts waits for a lost host to come back before a spare host (fthsdp agent
    --spare) takes its node rank."""

    auto_restore: bool = True
    """When a job's committed state is lost (no live replica holds it) and a complete checkpoint of it is recorded,
    restore the newest: the replicas load it and the job goes on from its step (the steps after it are lost). Off:
    the job waits for a replica holding the state, or for an operator (give-up-state)."""

    disconnect_is_failure: bool = True
    """Treat a replica whose session stream (or Watch stream) closes as failed at once (a killed process is detected in
    milliseconds instead of after the heartbeat timeout)."""

    leader_ttl: float = dataclasses.field(default=3.0, metadata=DURATION)
    """Lease on the leader's key in the store: several coordinators on one etcd elect one leader, and when it dies
    another takes over within about 4/3 of this."""

    hang_multiple: float = 5.0
    """A member that makes no progress while others wait for it in the all-reduce for this many times the job's median
    step time is hung: it is taken out of the quorum and its agent ends and restarts it
    (fthsdp/coordinator/decisions/hang.py)."""

    hang_floor: float = dataclasses.field(default=10.0, metadata=DURATION)
    """The hang limit is never shorter than this (a short step time must not turn a hiccup, a GC pause or a slow read
    into a restart)."""

    hang_ceiling: float = dataclasses.field(default=300.0, metadata=DURATION)
    """The hang limit is never longer than this; it is also the limit before any step time is known (the first step,
    with its compilation)."""

    section_timeout: float = dataclasses.field(default=1800.0, metadata=DURATION)
    """The limit inside a section the training script marked as long (Manager.section: evaluation, a checkpoint) when
    the script gives none."""

    straggler_multiple: float = 0.0
    """Straggler policy: take out and cordon a member whose compute time is this many times the other members' median
    for --straggler-steps steps, so that the job trains on without it until an operator replaces the node and uncordons
    it. 0: off (scores are still shown)."""

    straggler_steps: int = 50
    """How many steps in a row a member must be that slow before the straggler policy takes it out."""

    tick_interval: float = dataclasses.field(default=0.1, metadata=DURATION)
    """How often the quorum decision is re-evaluated when nothing else triggers it."""

    token_file: str = ""
    """File holding the bearer token every client must present (gRPC metadata ``authorization: Bearer TOKEN``); calls
    without it get UNAUTHENTICATED and change nothing. The health service stays open for probes. Empty: no token."""

    admin_token_file: str = ""
    """File holding the admin token: admin calls (drain, cordon, give-up-state, restore, reopen-job, inject; the
    status page's drain) must then present it (gRPC metadata ``fthsdp-admin-token``; over HTTP as the bearer token)
    besides the --token-file token. Fault injection (`fthsdp inject`) is refused without one. Empty: admin calls
    need only the --token-file token, and fault injection is off."""

    tls_cert: str = ""
    """PEM certificate chain of this coordinator: serve gRPC over TLS only (with --tls-key). Empty: plain text."""

    tls_key: str = ""
    """PEM private key of --tls-cert."""

    tls_ca: str = ""
    """PEM CA bundle: require every client to present a certificate signed by it (mutual TLS). Needs --tls-cert."""

    metrics_port: int = -1
    """Serve HTTP on the --bind host: the status page at http://HOST:PORT/, its JSON at /api/status and Prometheus
    metrics at /metrics, all read-only and open; the one admin action (POST /api/replicas/ID/drain) needs the
    --admin-token-file token if there is one, else the --token-file token, and is off without either. 0 picks a free
    port, which the start-up line prints; -1: off."""

    max_request_bytes: int = 65536
    """Larger requests are refused with INVALID_ARGUMENT."""

    log_level: str = "info"
    """debug, info, warning or error."""

    log_format: str = "text"
    """text (one human-readable line per event) or json (one JSON object per line: time, level, logger, message and the
    event's fields, e.g. quorum_id, members and reason of a quorum change)."""

    def __post_init__(self) -> None:
        try:
            split_host_port(self.bind, "--bind")
            if self.advertise:
                split_host_port(self.advertise, "--advertise")
        except ValueError as e:
            raise ConfigError(str(e)) from e
        if not self.job:
            raise ConfigError("--job: at least one job name is needed")
        for name in self.job:
            problem = name_problem("job name", name, MAX_JOB_LEN)
            if problem:
                raise ConfigError(f"--job: {problem}")
        if len(set(self.job)) != len(self.job):
            raise ConfigError(f"--job: duplicate job names in {','.join(self.job)}")
        if not self.store_prefix.startswith("/") or self.store_prefix.endswith("/"):
            raise ConfigError(f"--store-prefix must start with '/' and not end with '/', got {self.store_prefix!r}")
        if self.min_replicas < 1:
            raise ConfigError(f"--min-replicas must be at least 1, got {self.min_replicas}")
        for name in ("store_timeout", "heartbeat_interval", "heartbeat_timeout", "tick_interval", "leader_ttl",
                     "member_lease"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        for name in ("hang_multiple", "hang_floor", "hang_ceiling", "section_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name):g}")
        if self.hang_floor > self.hang_ceiling:
            raise ConfigError(
                f"--hang-floor ({self.hang_floor:g}s) must not exceed --hang-ceiling ({self.hang_ceiling:g}s)")
        if self.straggler_multiple != 0 and self.straggler_multiple <= 1:
            raise ConfigError(f"--straggler-multiple must be above 1 (0: off), got {self.straggler_multiple:g}")
        if self.straggler_steps < 1:
            raise ConfigError(f"--straggler-steps must be at least 1, got {self.straggler_steps}")
        for name in ("join_timeout", "join_settle", "spare_wait"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must not be negative, got {getattr(self, name)}")
        if self.heartbeat_interval >= self.heartbeat_timeout:
            raise ConfigError(
                f"--heartbeat-interval ({self.heartbeat_interval:g}s) must be shorter than "
                f"--heartbeat-timeout ({self.heartbeat_timeout:g}s)"
            )
        if not -1 <= self.metrics_port <= 65535:
            raise ConfigError(
                f"--metrics-port must be a port number, 0 (any free port) or -1 (off), got {self.metrics_port}")
        if self.heartbeat_budget < 0:
            raise ConfigError(f"--heartbeat-budget must not be negative (0: no limit), got {self.heartbeat_budget:g}")
        if self.max_request_bytes < 1024:
            raise ConfigError(f"--max-request-bytes must be at least 1024, got {self.max_request_bytes}")
        token = read_token_file(self.token_file)  # readable and well-formed now, not at the first call
        if self.admin_token_file and read_token_file(self.admin_token_file, "--admin-token-file") == token:
            raise ConfigError("--admin-token-file holds the same token as --token-file: every agent and rank has "
                              "that one; give operators a token of their own")
        self.tls.check()
        if self.tls_ca and not self.tls_cert:
            raise ConfigError("--tls-ca (mutual TLS) needs --tls-cert and --tls-key: the server side of TLS")
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"--log-level must be debug, info, warning or error, got {self.log_level!r}")
        check_log_format(self.log_format)

    @property
    def tls(self) -> TlsFiles:
        return TlsFiles(self.tls_ca, self.tls_cert, self.tls_key)

    @property
    def hang_rules(self) -> HangRules:
        return HangRules(self.hang_multiple, self.hang_floor, self.hang_ceiling, self.section_timeout,
                         self.straggler_multiple, self.straggler_steps)

    def job_settings(self) -> JobSettings:
        return JobSettings(store_prefix=self.store_prefix, rules=self.rules, hang_rules=self.hang_rules,
                           heartbeat_interval=self.heartbeat_interval, heartbeat_budget=self.heartbeat_budget,
                           rendezvous=RendezvousRules(spare_wait=self.spare_wait), auto_restore=self.auto_restore)

    @property
    def rules(self) -> Rules:
        return Rules(
            min_replicas=self.min_replicas,
            heartbeat_timeout=self.heartbeat_timeout,
            join_timeout=self.join_timeout,
            join_settle=self.join_settle,
            disconnect_is_failure=self.disconnect_is_failure,
            member_lease=self.member_lease,
        )
