"""The coordinator's gauges, read from the job tables at scrape time, so
they are never stale (fthsdp/coordinator/engine/metrics.py gathers them into
prometheus_client gauge families, one per name across jobs)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from fthsdp.protos.v1 import coordinator_pb2 as pb


def job_gauges(jobs: Iterable, lag, now: float, wall: float = 0.0) -> Iterator[tuple[str, str, dict[str, str], float]]:
    """(name, help, labels, value) of every gauge: per job (the runtime's
    job entries), then the event loop's lag (fthsdp/coordinator/engine/loop_lag.py).
    ``wall``: the time now in unix seconds, for the checkpoint's age."""
    for job in jobs:
        name = job.state.name
        yield ("fthsdp_quorum_id", "The current quorum id, by job.", {"job": name},
               job.quorum_pb.id if job.quorum_pb else 0)
        yield ("fthsdp_epoch", "The job's takeover epoch (grows when a coordinator takes the job).", {"job": name},
               job.epoch)
        yield ("fthsdp_committed_step",
               "The newest step any quorum member reported: the state the job must not lose, by job.",
               {"job": name}, job.state.committed_step)
        yield ("fthsdp_state_lost_step", "The committed step that no live replica holds (no quorum until one returns "
               "or it is given up); 0: not lost, by job.", {"job": name}, job.state.state_lost_step)
        checkpoint = job.checkpoints.newest
        yield ("fthsdp_checkpoint_step", "The step of the job's newest complete checkpoint (0: none), by job.",
               {"job": name}, checkpoint.step if checkpoint else 0)
        yield ("fthsdp_checkpoint_age_seconds", "Seconds since the job's newest complete checkpoint was sealed "
               "(0: none), by job.", {"job": name},
               max(0.0, wall - checkpoint.sealed_unix_ms / 1000) if checkpoint and wall else 0.0)
        yield ("fthsdp_heartbeat_interval_seconds",
               "The heartbeat interval replicas are told (stretched past --heartbeat-budget), by job.",
               {"job": name}, job.pacer.current.interval)
        yield ("fthsdp_heartbeat_backlog_seconds",
               "How late the typical replica's heartbeats arrive (the median time since heard of, "
               "beyond one interval), by job.",
               {"job": name}, job.backlog)
        yield ("fthsdp_heartbeat_timeout_seconds",
               "The heartbeat timeout in force: stretched with the interval, plus the event loop's recent lag, by job.",
               {"job": name}, job.state.rules.heartbeat_timeout)
        counts = dict.fromkeys(pb.ReplicaState.keys()[1:], 0)
        watches, returned_at = 0, job.state.last_return()
        for entry in job.state.replicas.values():
            counts[pb.ReplicaState.Name(job.state.replica_state(entry, now, returned_at))] += 1
            watches += entry.incarnation.open_watches
        for state, n in counts.items():
            label = state.removeprefix("REPLICA_STATE_").lower().replace("_", "-")
            yield "fthsdp_replicas", "Known replicas by state, by job.", {"job": name, "state": label}, n
        yield "fthsdp_watch_streams", "Open Watch streams of replicas, by job.", {"job": name}, watches
        yield ("fthsdp_ping_streams", "Open Pings streams carrying the job's rank pings: one per host, or one per "
               "group where its host 0 sends its hosts' (fthsdp/agent/node/relay/tree.py), by job.",
               {"job": name}, job.ping_streams)
        yield ("fthsdp_host_streams", "Open Host streams of the job's hosts, and of them those whose heartbeats "
               "ride in ping batches, by job.", {"job": name, "beats": "own"}, job.hosts.streams - job.hosts.carried)
        yield ("fthsdp_host_streams", "Open Host streams of the job's hosts, and of them those whose heartbeats "
               "ride in ping batches, by job.", {"job": name, "beats": "in-batches"}, job.hosts.carried)
        yield from _progress_gauges(job.state)
    yield ("fthsdp_event_loop_lag_seconds",
           "The coordinator's worst event-loop lag over the last heartbeat timeout: how late it runs when overloaded.",
           {}, lag.worst(now))


def _progress_gauges(state) -> Iterator[tuple[str, str, dict[str, str], float]]:
    """The hang limit and median step time of a job (fthsdp/coordinator/decisions/hang.py), and
    each replica's step time and straggler score: one series per replica that
    reports its progress. Only replicas the job still knows, so that one that
    left takes its series with it rather than leave it stale."""
    name, book = state.name, state.progress
    yield ("fthsdp_hang_limit_seconds", "How long a member may make no progress while others wait for it "
           "(a multiple of the median step time, within --hang-floor and --hang-ceiling), by job.",
           {"job": name}, book.limit)
    yield ("fthsdp_median_step_seconds", "The median of the members' step times (0: none reported yet), by job.",
           {"job": name}, book.median_step)
    for rid in sorted(state.replicas):
        report = book.rank0(rid)
        if report is None:
            continue  # an older replica, or one that has not reported yet
        labels = {"job": name, "replica": rid}
        yield ("fthsdp_replica_step_seconds", "The median of a replica's recent step times as its rank 0 "
               "reports it (0: none yet), by job and replica.", labels, report.step_time)
        yield ("fthsdp_straggler_score", "A member's compute time over the other members' median "
               "(1: typical; 0: unknown), by job and replica.", labels, book.scores.get(rid, 0.0))
