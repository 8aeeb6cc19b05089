"""A rank that calls the API wrongly gets a clear error, not a hang."""

from __future__ import annotations

import pytest
import torch

from fthsdp.agent.training.manager import Manager, ManagerConfig
from fthsdp.agent.training.state.train_state import check_dense, check_gradient, gradient_sample
from fthsdp.core.errors import ApiMisuse, ConfigError
from tests.harness.processes import CoordinatorProcess, WorkerProcess


def offline_manager() -> Manager:
    model = torch.nn.Linear(4, 4)
    # Never started: the order checks come before any network call.
    return Manager(model, torch.optim.SGD(model.parameters(), lr=0.1), ManagerConfig(("127.0.0.1:1",), "r0"))


def test_commit_before_allreduce():
    with pytest.raises(ApiMisuse, match="commit\\(\\) before allreduce_gradients"):
        offline_manager().commit()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.5])
def test_gradients_left_as_the_allreduce_left_them_pass_even_overflowed(value):
    """An fp16 step whose scaled gradients overflowed (a GradScaler skips it)
    is no misuse: the check compares bits, and NaN's bits equal themselves."""
    ft = offline_manager()
    weight = next(ft.model.parameters())
    weight.grad = torch.full_like(weight, value)
    sample = gradient_sample(weight)
    check_gradient(weight, sample)
    weight.grad.mul_(0.5)  # as clipping would
    if value == value and value != float("inf"):
        with pytest.raises(ApiMisuse, match="gradients changed"):
            check_gradient(weight, sample)


def test_sparse_gradients_are_named():
    emb = torch.nn.Embedding(10, 4, sparse=True)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(ApiMisuse, match="sparse gradient"):
        check_dense([emb.weight.grad])
    check_dense([torch.zeros(3)])


def test_allreduce_twice_in_a_step():
    model = torch.nn.Linear(4, 4)
    ft = Manager(model, torch.optim.SGD(model.parameters(), lr=0.1), ManagerConfig.from_env({}))  # standalone
    ft.start()
    model(torch.ones(2, 4)).sum().backward()
    ft.allreduce_gradients()
    with pytest.raises(ApiMisuse, match="called twice"):
        ft.allreduce_gradients()
    assert ft.commit() and ft.step == 1
    ft.close()


def test_allreduce_before_start():
    with pytest.raises(ApiMisuse, match="before start"):
        offline_manager().allreduce_gradients()


def test_missing_replica_id_is_a_config_error():
    with pytest.raises(ConfigError, match="FTHSDP_REPLICA_ID"):
        ManagerConfig.from_env({"FTHSDP_COORDINATOR": "h:1"})
    # Neither (a script started on its own): one standalone replica, no error.
    assert ManagerConfig.from_env({}).standalone
    # One without the other is a mistake, never a guess at a coordinator on this host.
    with pytest.raises(ConfigError, match="FTHSDP_COORDINATOR is not set but FTHSDP_REPLICA_ID is"):
        ManagerConfig.from_env({"FTHSDP_REPLICA_ID": "r"})
    with pytest.raises(ConfigError, match="bad FTHSDP_"):
        ManagerConfig.from_env({"FTHSDP_REPLICA_ID": "r", "FTHSDP_COORDINATOR": "h:1", "FTHSDP_REPLICA_RANK": "x"})


@pytest.mark.parametrize(
    "second, words",
    [
        (("--hidden", "48"), "gradients of different sizes"),
        (("--names", "renamed"), "disagree on the model"),
    ],
)
def test_mismatched_replicas_fail_fast_with_a_clear_error(tmp_path, second, words):
    c = CoordinatorProcess(tmp_path, "--min-replicas", "2").start()
    try:
        a = WorkerProcess(tmp_path, c.address, "r0", 0, "--wait-for", "2", "--hidden", "32").start()
        b = WorkerProcess(tmp_path, c.address, "r1", 1, "--wait-for", "2", "--hidden", "32", *second).start()
        for w in (a, b):
            assert w.proc.wait(timeout=60) != 0
            assert words in w.log_path.read_text()
    finally:
        c.stop()
