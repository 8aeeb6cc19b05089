"""Ranks' pings in columns: one ``RankDigest`` per replica incarnation in a batch.

At the target size the coordinator's CPU is the ranks' pings: a rank other
than 0 pings once per interval with its progress, 100,000 a second for
12,500 hosts of 8 ranks. As one ``HeartbeatRequest`` each, the coordinator
reads a dozen fields of a message per rank (a Python attribute read each);
as a digest, the replica, its incarnation and its job are read once, and
the ranks' values come as packed columns (benchmarks/ping_cost.py).

A ping goes in a digest only if a digest says all of it: a rank above 0,
with progress, outside a marked section (whose name and timeout a digest
has no column for), that has not left and asks for no answer. Every other
ping goes whole. The relay encodes a batch this way only for a coordinator
that said on its Pings call that it reads digests (initial metadata
``RANK_DIGESTS``); an older one gets every ping whole.
"""

from __future__ import annotations

from collections.abc import Iterable

from fthsdp.protos.v1 import coordinator_pb2 as pb

RANK_DIGESTS = "fthsdp-rank-digests"
"""The Pings call's initial metadata key by which a coordinator says it reads ``PingBatch.digests``."""


def digestible(ping: pb.HeartbeatRequest) -> bool:
    """Whether a digest says everything the coordinator reads of ``ping``."""
    return (ping.shard_rank > 0 and ping.HasField("progress") and ping.progress.phase != pb.PHASE_SECTION
            and not ping.left and not ping.ack and not ping.local_only)


def encode(pings: Iterable[pb.HeartbeatRequest]) -> tuple[list[pb.RankDigest], list[pb.HeartbeatRequest]]:
    """``pings`` as digests, one per (job, replica, incarnation), and the pings that must go whole."""
    digests: dict[tuple[str, str, str], pb.RankDigest] = {}
    whole: list[pb.HeartbeatRequest] = []
    for ping in pings:
        if not digestible(ping):
            whole.append(ping)
            continue
        key = (ping.job, ping.replica_id, ping.incarnation)
        digest = digests.get(key)
        if digest is None:
            digest = digests[key] = pb.RankDigest(job=ping.job, replica_id=ping.replica_id,
                                                  incarnation=ping.incarnation)
        elif ping.shard_rank in digest.ranks:
            whole.append(ping)  # never twice in one digest (a rank's pings are kept one per batch anyway)
            continue
        progress = ping.progress
        digest.ranks.append(ping.shard_rank)
        digest.phases.append(progress.phase)
        digest.phase_ages_s.append(progress.phase_age_s)
        digest.steps.append(progress.step)
        digest.step_times_s.append(progress.step_time_s)
        digest.compute_times_s.append(progress.compute_time_s)
    return list(digests.values()), whole


def decode(digest: pb.RankDigest) -> list[pb.HeartbeatRequest]:
    """The pings a digest stands for (what the coordinator reads of them; for tests and for a reader of old
    pings)."""
    return [
        pb.HeartbeatRequest(job=digest.job, replica_id=digest.replica_id, incarnation=digest.incarnation,
                            shard_rank=rank, step=step,
                            progress=pb.Progress(phase=phase, phase_age_s=age, step=step, step_time_s=step_time,
                                                 compute_time_s=compute_time))
        for rank, phase, age, step, step_time, compute_time in zip(
            digest.ranks, digest.phases, digest.phase_ages_s, digest.steps, digest.step_times_s,
            digest.compute_times_s, strict=True)
    ]
