"""Checks of incoming requests; each failure is one InvalidRequest with a clear message."""

from __future__ import annotations

import re

from fthsdp.core.errors import InvalidRequest
from fthsdp.core.names import MAX_ADDRESS_LEN, MAX_JOB_LEN, MAX_REPLICA_ID_LEN, name_problem, split_host_port
from fthsdp.protos.v1 import coordinator_pb2 as pb

MAX_WORLD_SIZE = 1 << 20
MAX_SHORT_TEXT = 128
MAX_REASON = 1024
MAX_STEP_INPUTS = 512
"""StepChecksum.inputs: fthsdp/agent/training/state/checksum.py's MAX_INPUTS."""
_FINGERPRINT = re.compile(r"^[0-9a-f]{64}$")
"""RegisterRequest.catch_up_fingerprints: fthsdp/agent/training/catchup/tls.py's ``fingerprint``."""


def check_size(request, limit: int) -> None:
    size = request.ByteSize()
    if size > limit:
        raise InvalidRequest(f"request is {size} bytes; the limit is {limit} (--max-request-bytes)")


def check_job_field(job: str, allow_empty: bool = False) -> None:
    if allow_empty and not job:
        return
    problem = name_problem("job", job, MAX_JOB_LEN)
    if problem:
        raise InvalidRequest(problem)


def check_replica_id(replica_id: str) -> None:
    problem = name_problem("replica_id", replica_id, MAX_REPLICA_ID_LEN)
    if problem:
        raise InvalidRequest(problem)


def _short(field: str, value: str, limit: int = MAX_SHORT_TEXT) -> None:
    if len(value) > limit:
        raise InvalidRequest(f"{field} is {len(value)} characters long; the limit is {limit}")


def _non_negative(field: str, value: int) -> None:
    if value < 0:
        raise InvalidRequest(f"{field} must not be negative, got {value}")


def check_register(req) -> None:
    check_replica_id(req.replica_id)
    if not req.address:
        raise InvalidRequest("address is empty; give the HOST:PORT where peers reach this replica")
    _short("address", req.address, MAX_ADDRESS_LEN)
    try:
        split_host_port(req.address)
    except ValueError as e:
        raise InvalidRequest(str(e)) from e
    if not 1 <= req.world_size <= MAX_WORLD_SIZE:
        raise InvalidRequest(f"world_size must be between 1 and {MAX_WORLD_SIZE}, got {req.world_size}")
    _non_negative("step", req.step)
    _non_negative("quorum_id", req.quorum_id)
    if len(req.catch_up_addresses) not in (0, req.world_size):
        raise InvalidRequest(
            f"catch_up_addresses has {len(req.catch_up_addresses)} entries; give one per shard rank ({req.world_size})"
        )
    for address in req.catch_up_addresses:
        _short("catch_up_addresses", address, MAX_ADDRESS_LEN)
        try:
            split_host_port(address)
        except ValueError as e:
            raise InvalidRequest(f"catch_up_addresses: {e}") from e
    if req.catch_up_fingerprints and len(req.catch_up_fingerprints) != len(req.catch_up_addresses):
        raise InvalidRequest(f"catch_up_fingerprints has {len(req.catch_up_fingerprints)} entries; give one "
                             f"per catch-up address ({len(req.catch_up_addresses)}), or none")
    for fingerprint in req.catch_up_fingerprints:
        if not _FINGERPRINT.match(fingerprint):
            raise InvalidRequest(f"catch_up_fingerprints: {fingerprint[:80]!r} is not a SHA-256 fingerprint "
                                 "(64 lower-case hex digits)")


def check_session(req) -> None:
    check_replica_id(req.replica_id)
    if not req.session_id:
        raise InvalidRequest("session_id is empty; use the one Register returned")
    _short("session_id", req.session_id)


MAX_RECENT_CHECKSUMS = 16


def check_heartbeat(req, names_checked: set[str] | None = None) -> None:
    """``names_checked``: replica ids found well-formed already (a host's batch names its group a hundred
    times): checked once, and added."""
    if req.local_only:
        raise InvalidRequest("local_only: a ping for the node agent's relay alone, never for the coordinator")
    if not 0 <= req.shard_rank < MAX_WORLD_SIZE:
        raise InvalidRequest(f"shard_rank must be between 0 and {MAX_WORLD_SIZE - 1}, got {req.shard_rank}")
    if req.shard_rank == 0:
        check_session(req)
    else:
        if names_checked is None or req.replica_id not in names_checked:
            check_replica_id(req.replica_id)
            if names_checked is not None:
                names_checked.add(req.replica_id)
        _short("session_id", req.session_id)
    _non_negative("step", req.step)
    _non_negative("checksum_step", req.checksum_step)
    _non_negative("catch_up_bytes", req.catch_up_bytes)
    _non_negative("catch_up_total_bytes", req.catch_up_total_bytes)
    _short("state_checksum", req.state_checksum)
    if len(req.recent_checksums) > MAX_RECENT_CHECKSUMS:
        raise InvalidRequest(
            f"recent_checksums has {len(req.recent_checksums)} entries; the limit is {MAX_RECENT_CHECKSUMS}")
    for item in req.recent_checksums:
        _non_negative("recent_checksums.step", item.step)
        _short("recent_checksums.checksum", item.checksum)
        _short("recent_checksums.inputs", item.inputs, MAX_STEP_INPUTS)


def check_rank_ping(req, replicas_checked: set[str]) -> None:
    """A batched ping of a rank other than 0: only what such a ping is read for (its replica, rank, step,
    progress, whether it left) is checked, and its replica id once per batch (``replicas_checked``); the
    rank-0 fields it may carry are never read (fthsdp/coordinator/job/replica_calls.py ``rank_ping``)."""
    if req.local_only:
        raise InvalidRequest("local_only: a ping for the node agent's relay alone, never for the coordinator")
    if not 0 < req.shard_rank < MAX_WORLD_SIZE:
        raise InvalidRequest(f"shard_rank must be between 0 and {MAX_WORLD_SIZE - 1}, got {req.shard_rank}")
    if req.replica_id not in replicas_checked:
        check_replica_id(req.replica_id)
        replicas_checked.add(req.replica_id)
    if req.step < 0:
        _non_negative("step", req.step)
    if req.ack:
        raise InvalidRequest("a batched ping asks for no answer (ack): send it on HeartbeatStream")


DIGEST_PHASES = frozenset(pb.Phase.values()) - {pb.PHASE_SECTION}
"""A rank in a marked section sends its section's name and timeout: a whole HeartbeatRequest, not a digest."""


def check_rank_digest(digest, replicas_checked: set[str]) -> None:
    """A ``RankDigest``: its names (the replica once per batch), ranks above 0 and none twice, columns of one
    length, steps not negative, phases known and outside a section."""
    if digest.replica_id not in replicas_checked:
        check_replica_id(digest.replica_id)
        replicas_checked.add(digest.replica_id)
    ranks = digest.ranks
    n = len(ranks)
    if any(len(column) != n for column in (digest.phases, digest.phase_ages_s, digest.steps, digest.step_times_s,
                                           digest.compute_times_s)):
        raise InvalidRequest(f"a rank digest of replica {digest.replica_id!r} has columns of different lengths "
                             f"({n} ranks)")
    if n and not (0 < min(ranks) and max(ranks) < MAX_WORLD_SIZE):
        raise InvalidRequest(f"a rank digest's ranks must be between 1 and {MAX_WORLD_SIZE - 1}, got "
                             f"{min(ranks)} to {max(ranks)}")
    if len(set(ranks)) != n:
        raise InvalidRequest(f"a rank digest of replica {digest.replica_id!r} names a rank twice")
    if n and min(digest.steps) < 0:
        _non_negative("steps", min(digest.steps))
    if not DIGEST_PHASES.issuperset(digest.phases):
        raise InvalidRequest(f"a rank digest's phases must be phases outside a section, got "
                             f"{sorted(set(digest.phases) - DIGEST_PHASES)}")


def check_watch(req) -> None:
    if req.session_id:
        check_session(req)
    elif req.replica_id:
        check_replica_id(req.replica_id)  # an observer of the replica (its other ranks)


def check_leave(req) -> None:
    check_session(req)
    _short("reason", req.reason, MAX_REASON)
    _non_negative("step", req.step)


def check_agent_event(req) -> None:
    check_replica_id(req.replica_id)
    if req.state not in pb.AgentState.values() or req.state == pb.AGENT_STATE_UNSPECIFIED:
        raise InvalidRequest(f"state: {req.state} is not an agent state")
    _non_negative("node_rank", req.node_rank)
    _non_negative("restart_count", req.restart_count)
    _short("detail", req.detail, MAX_REASON)


MAX_PROBE_NAMES = 100_000


def check_reach_report(req) -> None:
    check_replica_id(req.replica_id)
    _non_negative("shard_rank", req.shard_rank)
    if req.probe_id <= 0:
        raise InvalidRequest(f"probe_id must be the id of a probe the coordinator asked for, got {req.probe_id}")
    if len(req.reached) + len(req.unreached) > MAX_PROBE_NAMES:
        raise InvalidRequest(f"a probe report names at most {MAX_PROBE_NAMES} replicas")
    for rid in (*req.reached, *req.unreached):
        check_replica_id(rid)


def check_reopen(req) -> None:
    if req.step <= 0:
        raise InvalidRequest(
            f"step must be the step the job finished at (StatusResponse.finished.step), got {req.step}")
    _short("requested_by", req.requested_by)


def check_give_up(req) -> None:
    if req.step <= 0:
        raise InvalidRequest(
            f"step must be the step whose state is lost (StatusResponse.state_lost_step), got {req.step}")
    _short("requested_by", req.requested_by)
    if req.resume_step:
        raise InvalidRequest(
            "resume_step (resuming from a checkpoint) is not implemented yet; leave it 0 to start over")


def check_restore(req) -> None:
    if req.step <= 0:
        raise InvalidRequest(
            f"step must be the step of a complete checkpoint (StatusResponse.checkpoint), got {req.step}")
    _short("requested_by", req.requested_by)


MAX_SLOW_SECONDS = 3600.0
MAX_SLOW_STEPS = 1_000_000


def check_inject(req) -> None:
    check_replica_id(req.replica_id)
    if req.kind not in (pb.FAULT_KIND_KILL, pb.FAULT_KIND_HANG, pb.FAULT_KIND_SLOW):
        raise InvalidRequest(f"kind: {req.kind} is not a fault kind (kill, hang or slow)")
    _short("requested_by", req.requested_by)
    if req.kind != pb.FAULT_KIND_SLOW:
        if req.seconds or req.steps:
            raise InvalidRequest("seconds and steps are for a slow fault only; leave them 0")
        return
    # `not 0 < x <= limit` also refuses NaN.
    if not 0 < req.seconds <= MAX_SLOW_SECONDS:
        raise InvalidRequest(f"seconds (added to each step) must be above 0 and at most {MAX_SLOW_SECONDS:g}, "
                             f"got {req.seconds:g}")
    if not 0 < req.steps <= MAX_SLOW_STEPS:
        raise InvalidRequest(
            f"steps (how many steps are slowed) must be between 1 and {MAX_SLOW_STEPS}, got {req.steps}")


MAX_NODES = 1 << 16


def check_host_hello(req) -> None:
    problem = name_problem("host_id", req.host_id, MAX_REPLICA_ID_LEN)
    if problem:
        raise InvalidRequest(problem)
    if req.replica_id:
        check_replica_id(req.replica_id)
    if not 1 <= req.nnodes <= MAX_NODES:
        raise InvalidRequest(f"nnodes must be between 1 and {MAX_NODES}, got {req.nnodes}")
    if not 1 <= req.nproc <= MAX_WORLD_SIZE:
        raise InvalidRequest(f"nproc must be between 1 and {MAX_WORLD_SIZE}, got {req.nproc}")
    for field in ("replica_rank", "num_replicas", "round"):
        _non_negative(field, getattr(req, field))
    if req.node_rank < -1 or req.node_rank >= req.nnodes:
        raise InvalidRequest(f"node_rank must be -1 (none) or below nnodes {req.nnodes}, got {req.node_rank}")
    if req.rendezvous_timeout < 0:
        raise InvalidRequest(f"rendezvous_timeout must not be negative, got {req.rendezvous_timeout:g}")
    if req.store:
        _store(req.store)


def _store(store: str, field: str = "store") -> None:
    _short(field, store, MAX_ADDRESS_LEN)
    try:
        split_host_port(store)
    except ValueError as e:
        raise InvalidRequest(str(e)) from e


def check_ping_batch(batch) -> None:
    """A PingBatch's own fields (its pings are checked one by one, each refused alone)."""
    check_job_field(batch.job, allow_empty=True)
    if len(batch.hosts) > MAX_NODES:
        raise InvalidRequest(f"a ping batch speaks for {len(batch.hosts)} hosts; a group has at most {MAX_NODES}")
    for host_id in batch.hosts:
        problem = name_problem("hosts entry", host_id, MAX_REPLICA_ID_LEN)
        if problem:
            raise InvalidRequest(problem)


MAX_PINGS_CERT = 4096
"""Bytes of a relay's certificate (HostJoin.pings_cert): a P-256 one is about 600."""


def _pings_cert(join) -> None:
    cert = join.pings_cert
    if not cert:
        return
    if not join.pings:
        raise InvalidRequest("join.pings_cert without join.pings: a certificate goes with the address it serves on")
    if len(cert) > MAX_PINGS_CERT:
        raise InvalidRequest(f"join.pings_cert is {len(cert)} bytes, more than {MAX_PINGS_CERT}")
    if not cert.startswith(b"-----BEGIN CERTIFICATE-----"):
        raise InvalidRequest("join.pings_cert is not a PEM certificate")


def check_host_request(req) -> None:
    """A Host stream's message after the hello."""
    which = req.WhichOneof("message")
    if which == "hello":
        raise InvalidRequest("a Host stream says hello once, first")
    if which == "join":
        _non_negative("round", req.join.round)
        if not req.join.store:
            raise InvalidRequest("join.store is empty; give the HOST:PORT of the store this host opened")
        _store(req.join.store)
        if req.join.pings:
            _store(req.join.pings, "join.pings")
        _pings_cert(req.join)
    elif which in ("failure", "leave"):
        message = getattr(req, which)
        _non_negative("round", message.round)
        _short("reason", message.reason, MAX_REASON)
