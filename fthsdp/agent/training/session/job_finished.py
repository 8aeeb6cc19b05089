"""A replica that arrives after its job finished.

Once every member of a job's last quorum left finished, the coordinator
forms no quorum and tells every watcher so (``WatchEvent.finished``, kept in
the store with the job's committed step: fthsdp/coordinator/engine/committed.py). A
replica that registers then, a restarted one, say, has nothing to train:
``Manager.start()`` (through the joiner, fthsdp/agent/training/catchup/joiner.py) raises
``JobFinished``; the manager logs its one line, stops, and the script's
``while not ft.stopped`` loop ends, so the process exits 0 and its node
agent ends as SUCCEEDED instead of restarting it. Only an operator reopens
a finished job (`fthsdp reopen-job`).
"""

from __future__ import annotations

from fthsdp.core.errors import FthsdpError
from fthsdp.protos.v1 import coordinator_pb2 as pb


class JobFinished(FthsdpError):
    """The job this replica belongs to finished: there is nothing to train."""

    def __init__(self, job: str, step: int) -> None:
        super().__init__(finished_line(job, step))
        self.job, self.step = job, step


def finished_line(job: str, step: int) -> str:
    """The one line a replica that arrives after the end prints."""
    return f"job {job} finished at step {step}"


def finished_step(event: pb.WatchEvent | None) -> int:
    """The step at which the job finished, per the coordinator's push (0: not finished)."""
    return event.finished.step if event is not None and event.HasField("finished") else 0
