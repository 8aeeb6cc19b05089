"""The package's public API: ``import fthsdp`` and its names, the errors a
script may catch, and the training API's edges (a read-only step, the
SIGTERM handler given back, a script run outside `fthsdp agent`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import fthsdp
from fthsdp.core.errors import FthsdpError

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    """The test's environment without anything `fthsdp agent` would set."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FTHSDP_") and k not in ("RANK", "WORLD_SIZE")}


def test_every_public_name_imports_and_importing_fthsdp_loads_no_torch():
    code = ("import sys, fthsdp; assert 'torch' not in sys.modules, 'import fthsdp loaded torch'; "
            "from fthsdp import *; print(sorted(fthsdp.__all__))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for name in fthsdp.__all__:
        assert getattr(fthsdp, name) is not None
    assert fthsdp.Manager.__module__ == "fthsdp.agent.training.manager"


def test_the_training_api_loads_torch_distributed_checkpoint_only_for_checkpoints():
    """Every rank imports the Manager at start; DCP (with DTensor and sympy) costs it about half a second of CPU,
    so it loads where a checkpoint is written or read (fthsdp/agent/training/checkpoint/errors.py)."""
    code = ("import sys; from fthsdp import Manager; "
            "heavy = sorted(m for m in sys.modules if m.startswith(('torch.distributed.checkpoint', 'sympy'))); "
            "assert not heavy, heavy; "
            "import fthsdp.agent.training.checkpoint.saver, fthsdp.agent.training.checkpoint.restore; "
            "assert 'torch.distributed.checkpoint' in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.parametrize("name, restartable", [
    ("Evicted", True), ("FtarTimeout", True), ("CatchUpFailed", True),
    ("StateNotHeld", False), ("ApiMisuse", False), ("FtarError", False), ("ConfigError", False),
])
def test_every_error_a_script_may_catch_is_at_the_top_and_says_whether_a_restart_helps(name, restartable):
    error = getattr(fthsdp, name)
    assert issubclass(error, FthsdpError) and error is not FthsdpError
    assert error.restartable is restartable
    assert error.__doc__, f"{name} says nothing of itself"


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _batches(n: int):
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 6, generator=gen), torch.randn(16, 2, generator=gen)) for _ in range(n)]


def test_outside_the_agent_a_script_trains_as_plain_pytorch_with_its_sigterm_handler_given_back():
    model, optimizer = _model_and_optimizer()
    theirs = signal.getsignal(signal.SIGTERM)
    mine = lambda *_: None  # noqa: E731 - the script's own handler
    signal.signal(signal.SIGTERM, mine)
    try:
        ft = fthsdp.Manager.from_env(model, optimizer, env={})
        assert ft.config.standalone
        ft.start()
        assert not ft.stopped and ft.step == 0 and ft.participation() == fthsdp.Participation(0, 1)
        assert signal.getsignal(signal.SIGTERM) is not mine  # a drain while it trains
        for x, y in _batches(5):
            torch.nn.functional.mse_loss(model(x), y).backward()
            ft.allreduce_gradients()
            assert ft.commit() is True
        assert ft.step == 5
        with pytest.raises(AttributeError):
            ft.step = 2  # type: ignore[misc]
        ft.close()
        assert ft.stopped and ft.commit() is False
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, theirs)

    plain, plain_opt = _model_and_optimizer()
    for x, y in _batches(5):
        torch.nn.functional.mse_loss(plain(x), y).backward()
        plain_opt.step()
        plain_opt.zero_grad()
    for a, b in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(a, b)


def test_outside_the_agent_the_contract_is_still_checked():
    model, optimizer = _model_and_optimizer()
    ft = fthsdp.Manager.from_env(model, optimizer, env={})
    ft.start()
    try:
        with pytest.raises(fthsdp.ApiMisuse, match="before allreduce_gradients"):
            ft.commit()
        x, y = _batches(1)[0]
        torch.nn.functional.mse_loss(model(x), y).backward()
        with pytest.raises(fthsdp.ApiMisuse):
            optimizer.step()  # outside update: a joiner could not replay it
    finally:
        ft.close()


SCRIPT = textwrap.dedent("""
    import torch
    from fthsdp import Manager
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ft = Manager.from_env(model, optimizer)
    ft.start()
    while ft.step < 3 and not ft.stopped:
        model(torch.ones(2, 4)).sum().backward()
        ft.allreduce_gradients()
        ft.commit()
    ft.close()
    print("trained", ft.step)
""")


def test_a_script_run_on_its_own_says_so_in_one_line_and_exits_0(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "trained 3"
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "FTHSDP_REPLICA_ID is not set" in lines[0] and "standalone" in lines[0], out.stderr
