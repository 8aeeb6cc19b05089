"""The typed error hierarchy of fthsdp.

Every error a user or a peer can cause is one of these, so the edges (the
command line and the gRPC servicer) can turn it into one clear line or one
gRPC status code instead of a traceback. Lower-level exceptions are chained
with ``raise ... from`` so the cause stays visible in debug logs.
"""

from __future__ import annotations


class FthsdpError(Exception):
    """Base class of every error fthsdp raises on purpose."""


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
