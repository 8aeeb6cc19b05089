"""The eviction watch of a rank of a multi-rank replica group.

When the coordinator takes the group out of the quorum (another rank died,
on this node or another), this rank's state is lost with the group's, and
every rank must end so that every node's agent restarts the group. The
watch tells the training thread: its next API call raises ``Evicted``, and
the script ends as it does for any error. But the rank may instead be
blocked in an FSDP collective with the dead rank, which gloo would only time
out much later (its ``abort()`` does not unblock it): if the training thread
does not reach an API call within ``EVICTION_GRACE`` seconds, the watch ends
the process itself, the one thing that frees it. A drain (a planned exit at
a step boundary) is never treated as an eviction.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

from fthsdp.agent.training.quorum_view import QuorumView

EVICTION_GRACE = 2.0
"""Seconds the training thread has to reach an API call once the group is out."""
EXIT_EVICTED = 75


class EvictionWatch:
    def __init__(self, view: QuorumView, shard_rank: int, stopped: Callable[[], bool],
                 draining: threading.Event) -> None:
        self.view = view
        self.shard_rank = shard_rank
        self.stopped = stopped
        self.draining = draining
        self.evicted = ""
        """Why this group was taken out ("" while it is a member): read by the training thread."""
        self.acknowledged = threading.Event()
        """Set by the training thread when it raised ``Evicted``."""
        threading.Thread(target=self._run, name="fthsdp-eviction-watch", daemon=True).start()

    def _out(self) -> bool:
        quorum = self.view.quorum
        return quorum is not None and not self.view.includes_me(quorum) and not self.draining.is_set()

    def _run(self) -> None:
        with self.view.cond:
            while not self.stopped():
                if self._out():
                    quorum = self.view.quorum
                    assert quorum is not None  # _out() saw it, under the same lock
                    self.evicted = (f"replica {self.view.replica_id} was taken out of quorum {quorum.id}"
                                    f"{self.view.out_because()}")
                    break
                self.view.cond.wait(1.0)
        if not self.evicted:
            return
        if self.acknowledged.wait(EVICTION_GRACE) or self.stopped() or self.draining.is_set():
            return
        print(
            f"fthsdp: {self.evicted}; rank {self.shard_rank} is blocked outside the fthsdp API (in a collective "
            f"with a dead rank?) and exits so that its agent restarts the group",
            file=sys.stderr,
            flush=True,
        )
        os._exit(EXIT_EVICTED)  # a thread cannot unblock gloo; ending the process is what frees this rank
