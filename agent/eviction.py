"""The eviction watchdog of a rank of a multi-rank replica group."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

from agent.quorum_groups import QuorumTracker

EVICTION_GRACE = 2.0
"""Seconds an evicted rank of a multi-rank group waits (for a drain to finish) before exiting."""
EXIT_EVICTED = 75


def exit_when_evicted(tracker: QuorumTracker, shard_rank: int, stopped: Callable[[], bool],
                      draining: threading.Event) -> None:
    """Exit at once when the coordinator takes this replica group out (a
    thread of each rank of a multi-rank group, until ``stopped()``).

    Another rank of the group may have died, on this node or another,
    leaving this one blocked in an FSDP collective that gloo would only
    time out much later. Out of the quorum this incarnation's state is
    lost anyway: exiting lets every node's agent restart the whole group.
    A drain (a planned exit at a step boundary) is given a grace period.
    """
    with tracker.cond:
        while not stopped():
            quorum = tracker.quorum
            if quorum is not None and not tracker.includes_me(quorum) and not draining.is_set():
                tracker.cond.wait(EVICTION_GRACE)
                quorum = tracker.quorum
                if not stopped() and not draining.is_set() and not tracker.includes_me(quorum):
                    print(
                        f"fthsdp: replica {tracker.replica_id} was taken out of quorum {quorum.id}; "
                        f"rank {shard_rank} exits so that its agent restarts the group",
                        file=sys.stderr,
                        flush=True,
                    )
                    os._exit(EXIT_EVICTED)
            tracker.cond.wait(1.0)
