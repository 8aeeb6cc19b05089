"""The typed error hierarchy of fthsdp.

Every error a user or a peer can cause is one of these, so the edges (the
command line and the gRPC servicer) can turn it into one clear line or one
gRPC status code instead of a traceback. Lower-level exceptions are chained
with ``raise ... from`` so the cause stays visible in debug logs.
"""

from __future__ import annotations

from typing import ClassVar


class FthsdpError(Exception):
    """Base class of every error fthsdp raises on purpose."""

    restartable: ClassVar[bool] = False
    """Whether restarting the replica (what its agent does when the script
    exits non-zero) can recover: True for a failure of the replica's place
    in the job (it catches up from a peer once restarted); False where a
    restart would fail the same way until someone fixes the script, the
    configuration or the job's state."""


# ----- the training API: what a training script may catch ---------------------------------


class Evicted(FthsdpError):
    """The coordinator's newest quorum no longer includes this replica (it was
    presumed dead, hung, taken out as unreachable or found to disagree): its
    state must be caught up again, which a restart does."""

    restartable = True


class FtarTimeout(FthsdpError):
    """No collective finished and no newer quorum came within the timeout
    (``FTHSDP_FTAR_TIMEOUT``); a restart catches up from the members."""

    restartable = True


class CatchUpFailed(FthsdpError):
    """The replay does not reproduce the members' state (the message names the
    part that differs and the likely cause). A restart catches up again, but
    a loop that breaks the replay contract fails the same way: the agent
    gives up after two such failures in a row."""

    restartable = True


class StateNotHeld(FthsdpError):
    """This replica was admitted, but every member (or its catch-up source)
    was lost before it reached the members' state: it does not hold the
    job's committed state, so it must not train on as if it did. The job's
    state is lost; an operator gives it up (``fthsdp give-up-state``)."""


class ApiMisuse(FthsdpError):
    """The training script called the API out of order, or broke the replay
    contract (the message names the fix); a restart fails the same way."""


class FtarError(FthsdpError):
    """The replicas cannot agree on a step: their gradients differ in size,
    names or shapes, or they run different code (a misuse, not a failure)."""


# ----- configuration, requests and the store -------------------------------------------------


class ConfigError(FthsdpError):
    """Bad flag, environment variable or config file; the message names it."""


class InvalidRequest(FthsdpError):
    """A request that can never succeed as sent (gRPC INVALID_ARGUMENT)."""


class UnknownJob(InvalidRequest):
    """The request names a job this coordinator does not serve."""


class NotFound(FthsdpError):
    """The request names a replica the coordinator does not know (NOT_FOUND)."""


class StaleSession(FthsdpError):
    """A heartbeat or watch from a session that a newer registration replaced
    (gRPC FAILED_PRECONDITION): the sender is a zombie incarnation."""


class OutOfRange(FthsdpError):
    """A value past what the job has: a quorum never formed, a step nobody
    committed (gRPC FAILED_PRECONDITION): nothing changes."""


class StateNotLost(FthsdpError):
    """A give-up of a job's state that is not lost, or not at the step named
    (gRPC FAILED_PRECONDITION): nothing is given up."""


class JobNotFinished(FthsdpError):
    """A reopen of a job that is not finished, or not at the step named
    (gRPC FAILED_PRECONDITION): nothing is reopened."""


class StoreError(FthsdpError):
    """The state store failed."""


class StoreUnavailable(StoreError):
    """The state store cannot be reached right now; the operation may succeed later."""


class LostOwnership(StoreError):
    """A compare-and-swap on the job's state failed: another coordinator wrote it."""


class NotLeader(FthsdpError):
    """This coordinator follows another; the client should move on to the leader."""


class CoordinatorUnavailable(FthsdpError):
    """No coordinator in the address list answered."""


class RequestRejected(FthsdpError):
    """A coordinator answered with an error status; ``code`` is the gRPC status code."""

    def __init__(self, code, message: str) -> None:
        super().__init__(message)
        self.code = code
