"""A replica step leaves no exit handler behind once it has left.

``ReplicaStep`` registers one ``atexit`` handler (a script that ends by an
exception, never closing, still exits promptly past gloo's group destructors:
``QuorumGroups.release`` in fthsdp/agent/training/ftar/groups.py); ``leave()``
releases the groups itself and unregisters it, so that neither handlers nor
the steps they hold pile up in a process that runs several Managers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fthsdp.agent.training.manager import Manager, ManagerConfig
from fthsdp.agent.training.step import replica_step
from fthsdp.coordinator.config import CoordinatorConfig
from tests.harness.inprocess import InProcessCoordinator


class ExitHandlers:
    """``atexit`` as replica_step.py sees it: what is registered and not yet unregistered."""

    def __init__(self) -> None:
        self.registered: list[Callable[[], object]] = []
        self.ever = 0

    def register(self, handler: Callable[[], object]) -> Callable[[], object]:
        self.registered.append(handler)
        self.ever += 1
        return handler

    def unregister(self, handler: Callable[[], object]) -> None:
        self.registered = [h for h in self.registered if h != handler]


def test_a_closed_replica_step_leaves_no_exit_handler(tmp_path, monkeypatch):
    handlers = ExitHandlers()
    monkeypatch.setattr(replica_step, "atexit", handlers)
    for n in range(2):  # a process that runs one Manager after another, each in a job of its own
        coordinator = InProcessCoordinator(CoordinatorConfig(bind="127.0.0.1:0"))
        try:
            model = torch.nn.Linear(4, 2)
            config = ManagerConfig((coordinator.address,), f"r{n}", timeout=20.0,
                                   outcome_file=str(tmp_path / f"outcome-{n}.json"))
            ft = Manager(model, torch.optim.SGD(model.parameters(), lr=0.1), config)
            ft.start(admission_timeout=30.0)
            assert len(handlers.registered) == 1  # while it trains: the exit path is covered
            model(torch.ones(2, 4)).sum().backward()
            ft.allreduce_gradients()
            assert ft.commit() and ft.step == 1
            ft.close()
            assert handlers.registered == []
        finally:
            coordinator.close()
    assert handlers.ever == 2
