"""fthsdp: fault-tolerant HSDP training for PyTorch.

The training API, for a script run by ``fthsdp agent``::

    import fthsdp

    ft = fthsdp.Manager.from_env(model, optimizer, update=update, state={...})
    ft.start()
    while not ft.stopped:
        ...                       # forward, backward
        ft.allreduce_gradients()
        ft.commit()
    ft.close()

Every error a training script may catch is here too, each saying whether a
restart of the replica can recover (``FthsdpError.restartable``).

The package's parts (docs/development.md, "Code map"): ``fthsdp.core`` (errors,
credentials, settings, names, logging: shared by everything),
``fthsdp.protos`` (the wire format), ``fthsdp.client`` (the coordinator's
client), ``fthsdp.coordinator`` (the lighthouse service),
``fthsdp.agent.node`` (the node agent: launch, supervise, restart) and
``fthsdp.agent.training`` (the library inside each rank), with the
``fthsdp`` command (``fthsdp.cli``) and its demo (``fthsdp.demo``) above them.

Importing ``fthsdp`` imports no torch: the training names load it when first
used, so the coordinator and the command line start without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fthsdp.core.errors import (
    ApiMisuse,
    CatchUpFailed,
    ConfigError,
    CoordinatorUnavailable,
    Evicted,
    FtarError,
    FtarTimeout,
    FthsdpError,
    StateNotHeld,
)

if TYPE_CHECKING:
    from fthsdp.agent.training.config import ManagerConfig
    from fthsdp.agent.training.manager import Manager
    from fthsdp.agent.training.session.participation import Participation

__version__ = "0.1.0"

_LAZY = {
    "Manager": "fthsdp.agent.training.manager",
    "ManagerConfig": "fthsdp.agent.training.config",
    "Participation": "fthsdp.agent.training.session.participation",
}

__all__ = [
    "ApiMisuse",
    "CatchUpFailed",
    "ConfigError",
    "CoordinatorUnavailable",
    "Evicted",
    "FtarError",
    "FtarTimeout",
    "FthsdpError",
    "Manager",
    "ManagerConfig",
    "Participation",
    "StateNotHeld",
]


def __getattr__(name: str) -> Any:
    """The training names, imported (with torch) when first used (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fthsdp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
