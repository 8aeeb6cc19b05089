"""What fthsdp attaches to the script's process and optimizer, and gives back.

Two hooks, installed by ``Manager.start()`` and removed when the replica stops
(``close()``, a drain, an eviction), so that a script that goes on after
``close()`` gets its process back as it was:

* SIGTERM asks for a drain (how `fthsdp agent` drains its ranks) instead of
  killing the process mid-step; the script's own handler comes back after.
* An optimizer step pre-hook refuses ``optimizer.step()`` outside the update
  passed to the Manager: a replica that catches up replays only that update,
  so a step taken elsewhere would not be replayed (fthsdp/agent/training/state/train_state.py).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from fthsdp.agent.training.catchup.replay import Replayer
from fthsdp.agent.training.session.lifecycle import Lifecycle
from fthsdp.agent.training.state.train_state import step_outside_update

_SignalHandler = Callable[[int, FrameType | None], Any] | int | None
"""What ``signal.signal`` returns: a function, SIG_DFL/SIG_IGN, or None (set outside Python)."""


class ScriptHooks:
    def __init__(self, optimizer: torch.optim.Optimizer, replayer: Replayer, lifecycle: Lifecycle) -> None:
        self._optimizer = optimizer
        self._replayer = replayer
        self._lifecycle = lifecycle
        self._sigterm: _SignalHandler | None = None
        """The script's SIGTERM handler replaced by ``install`` (None: not replaced)."""
        self._step_hook: RemovableHandle | None = None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            previous = signal.signal(signal.SIGTERM, lambda *_: self._lifecycle.request_drain("SIGTERM"))
            self._sigterm = signal.SIG_DFL if previous is None else previous  # None: set outside Python
        self._step_hook = self._optimizer.register_step_pre_hook(self._guard_step)

    def remove(self) -> None:
        """Idempotent."""
        if self._step_hook is not None:
            self._step_hook.remove()
            self._step_hook = None
        if self._sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None

    def _guard_step(self, optimizer, args, kwargs) -> None:
        if not self._replayer.in_update and not self._lifecycle.stopped:
            raise step_outside_update()
