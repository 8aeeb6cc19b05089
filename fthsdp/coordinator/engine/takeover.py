"""A coordinator taking a job over: its ledger read, its epoch bumped, its table seeded.

When a coordinator starts to lead (a start, a restart, a failover), it reads
the job's ledger as one snapshot (fthsdp/coordinator/ledger/writer.py),
bumps the epoch, and seeds the job's table from it: the stored quorum, the
replica records, the committed step, a restore under way. Every replica it
finds is presumed alive for a grace to reconnect, and every member's lease
presumed held as long as a predecessor could have granted it. The settings
it uses are the job's rules, as the decisions read them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from fthsdp.coordinator.decisions import lease
from fthsdp.coordinator.engine import checkpoints, job_store
from fthsdp.coordinator.engine.served_job import ServedJob
from fthsdp.coordinator.job.replica_entry import grant_reconnect_grace
from fthsdp.coordinator.ledger.codec import quorum_to_pb

log = logging.getLogger("fthsdp.coordinator")


async def take_over(job: ServedJob, leader: str, clock: Callable[[], float], wall: Callable[[], float]) -> None:
    """Load ``job`` from the store for this coordinator (``leader``) to serve."""
    await asyncio.to_thread(job.ledger.load)
    job.epoch = await job_store.bump_epoch(job, leader, wall)
    quorum, revision = job.ledger.current.quorum, job.ledger.revisions.get(job.keys.quorum, 0)
    records = job_store.records(job)
    committed_step = job.committed.load(quorum)
    now = clock()
    # The longest lease a predecessor could have granted: at the pace its senders (every replica
    # it recorded, by its ranks) asked for (fthsdp/coordinator/decisions/lease.py presumed).
    senders = sum(rec.world_size or 1 for rec, _ in records.values())
    pace = job.pacer.update(senders, now)
    job.state.lease_s = lease.granted(job.state.rules.member_lease, pace.interval)
    job.state.load(quorum, revision, records, now, committed_step)
    # A restore under way goes on: its first quorum still waits for the members (restore_wait.py).
    job.state.restore = checkpoints.under_way(job.checkpoints, job.committed, quorum)
    _grant_grace(job, now, pace.timeout)
    job.set_quorum(quorum_to_pb(quorum))
    if quorum is not None:
        job.remember(quorum)
    log.info(
        "job %s: epoch %d, quorum %s, committed step %d, %d known replicas (store %s)",
        job.state.name,
        job.epoch,
        f"{quorum.id} {list(quorum.member_ids)}" if quorum else "none",
        committed_step,
        len(records),
        job.ledger.store.description,
    )
    if job.state.finished is not None:
        log.info("job %s: finished at step %d (stored); no quorum forms until an operator reopens it",
                 job.state.name, job.state.finished.step)


def _grant_grace(job: ServedJob, now: float, timeout: float) -> None:
    """Every replica from the store gets a grace to reconnect before it
    is judged (fthsdp/coordinator/decisions/liveness.py ``lost_at``): a restart or a failover
    silenced them all, and after a long outage their clients take a while
    to reconnect. It is what the rules would give silent members in any
    case: their heartbeat timeout (``timeout``, as paced for as many
    senders as the store lists: at thousands of hosts it is longer than the
    configured one), then the split-brain guard's join_timeout. While they
    keep coming back the grace lasts longer (fthsdp/coordinator/decisions/liveness.py). The hosts of
    their groups get the same grace, once (``HostTable.hold``)."""
    grace = timeout + job.state.rules.join_timeout
    count = grant_reconnect_grace(job.state.replicas, now + grace)
    job.hosts.hold(now + grace)  # and their hosts the same (fthsdp/coordinator/hosts/table.py)
    if count:
        log.info("job %s: %d replicas from the store; each has %gs to reconnect before it is judged "
                 "(sooner once every other member is back; longer while replicas keep coming back)",
                 job.state.name, count, grace)
