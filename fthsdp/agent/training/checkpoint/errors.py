"""The checkpoint's errors, in a module of their own: the code that catches
them (a joiner, ``--resume``) loads without torch.distributed.checkpoint,
which costs a training process about half a second at start (DTensor and
sympy come with it), and is loaded only when a checkpoint is written or read."""

from __future__ import annotations

from fthsdp.core.errors import FthsdpError


class CheckpointError(FthsdpError):
    """A checkpoint that is incomplete, corrupt, or of another job or model."""


class PartlyLoaded(CheckpointError):
    """A checkpoint refused after some of it was loaded into the state (a
    corrupt block found while DCP read, in place; the loaded state's checksum
    not the recorded one): the state is neither the one before nor the
    checkpoint's, and is to be replaced whole before it trains."""


__all__ = ["CheckpointError", "PartlyLoaded"]
