"""Recovery for the loops people write, with real processes.

The loop of tests/ftar_worker.py ``--loop full`` is the one PyTorch's docs
describe: accumulation over micro-batches, autocast with a GradScaler,
``clip_grad_norm_``, AdamW with weight decay on 2-D parameters only, a
warmup + cosine ``LambdaLR`` stepped after ``optimizer.step()``, an EMA of the
weights and a stateful data position, all registered with the manager. A
replica killed mid-run restarts, replays the steps it missed through the same
update, and its state checksum (model, optimizer, every registered object)
equals the members' at every step after. A loop that breaks the replay
contract fails with an error that names what it broke.
"""

from __future__ import annotations

import pytest

from fthsdp.client import CoordinatorClient
from tests.harness.replicas import SLOW, assert_same_state_after_rejoin, members
from tests.harness.waiting import wait_until


def lose_and_restart(coordinator, worker, *loop_args: str):
    c = coordinator("--min-replicas", "2")
    workers = [worker(c, i, 3, *loop_args, env=SLOW) for i in range(3)]
    workers[0].read_until(lambda line: line.get("step", 0) >= 12)
    workers[2].kill()
    with CoordinatorClient([c.address]) as client:
        wait_until(lambda: members(client) == {"r0", "r1"}, 20, message="the killed replica taken out")
        joiner = worker(c, 2, 1, *loop_args, name="r2-restarted")
        return c, workers, joiner, client


@pytest.mark.parametrize("amp", ["fp16", pytest.param("bf16", marks=pytest.mark.slow)])
def test_full_loop_recovers_bit_identically(cluster, amp):
    coordinator, _, worker = cluster
    c, (r0, r1, _), joiner, _ = lose_and_restart(coordinator, worker, "--loop", "full", "--amp", amp)
    with CoordinatorClient([c.address]) as client:
        wait_until(lambda: members(client) == {"r0", "r1", "r2"}, 60, message="the restarted replica admitted")
    assert joiner.read_until(lambda line: "admitted" in line)["catch_up"] is not None
    assert_same_state_after_rejoin(joiner, r0)
    assert_same_state_after_rejoin(joiner, r1, min_steps=5)


def test_the_loop_from_torchs_other_building_blocks_recovers_bit_identically(cluster):
    """SGD with Nesterov momentum, SequentialLR (LinearLR, then
    CosineAnnealingLR), clip_grad_value_, swa_utils.AveragedModel as the
    EMA, on a model with batch norm. Its running statistics change in every
    forward pass, outside the update: the members keep the first
    contributor's (as DDP keeps rank 0's) and a joiner replays them from the
    log, so the states, buffers included, stay equal across members and
    after a rejoin."""
    coordinator, _, worker = cluster
    c, (r0, r1, _), joiner, _ = lose_and_restart(coordinator, worker, "--loop", "full", "--variant", "sgd",
                                                 "--names", "batchnorm")
    with CoordinatorClient([c.address]) as client:
        wait_until(lambda: members(client) == {"r0", "r1", "r2"}, 60, message="the restarted replica admitted")
    assert_same_state_after_rejoin(joiner, r0)
    assert_same_state_after_rejoin(joiner, r1, min_steps=5)


def test_ema_changed_outside_the_update_is_named(cluster):
    """A large registered object (the EMA) changed before the all-reduce is
    not recorded with each step: the joiner's replay differs, and the error
    says which part and why, at once."""
    coordinator, _, worker = cluster
    _, (r0, _, _), joiner, _ = lose_and_restart(coordinator, worker, "--loop", "full", "--misuse", "ema-outside")
    wait_until(lambda: joiner.proc.poll() is not None, 60, message="the joiner whose replay differs exits")
    text = joiner.log_path.read_text()
    assert "CatchUpFailed" in text and "'ema'" in text and "only inside update()" in text, text[-2000:]
    step = r0.read_until(lambda line: "step" in line)["step"]
    r0.read_until(lambda line: line.get("step", 0) >= step + 3, timeout=30)  # the members go on


@pytest.mark.parametrize(
    "misuse, says",
    [
        ("step-outside", "optimizer.step() ran outside the update"),
        ("clip-outside", "the gradients changed between allreduce_gradients() and commit()"),
    ],
)
def test_a_loop_that_breaks_the_contract_fails_at_its_first_step(cluster, misuse, says):
    coordinator, _, worker = cluster
    c = coordinator("--min-replicas", "1")
    w = worker(c, 0, 1, "--loop", "full", "--misuse", misuse)
    wait_until(lambda: w.proc.poll() is not None, 60, message="the misusing replica exits")
    text = w.log_path.read_text()
    assert "ApiMisuse" in text and says in text, text[-2000:]
    assert '"step"' not in "".join(w.history)  # no step was committed
