"""The wheel: one top-level package, fthsdp, with its example (the demo's
payload), the .proto files and the message stubs; and, installed into a
fresh virtual environment away from the checkout, ``fthsdp demo`` runs."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "README.md", "fthsdp")
"""What the wheel is built from, copied first: a build in the checkout would
leave build/ and an egg-info behind, and pack whatever stale files build/
still held."""
TORCH = "torch==2.13.0"
"""Pinned: the oldest supported torch, whose registry build is the CPU one. The
Makefile's default (2.14.1) is a 4 GB CUDA build, and an unpinned torch
could resolve one too."""


def _setuptools_ok() -> bool:
    """The build backend pyproject.toml asks for, in this interpreter (pip's
    --no-build-isolation uses it rather than fetching one)."""
    try:
        return int(importlib.metadata.version("setuptools").split(".")[0]) >= 77
    except importlib.metadata.PackageNotFoundError:
        return False


def _run(argv: list[str | Path], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not _setuptools_ok():
        pytest.skip("building the wheel offline needs setuptools>=77 here (pip install 'setuptools>=77')")
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    p = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
              "-w", base / "dist", src], timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    (built,) = (base / "dist").glob("fthsdp-*.whl")
    return built


@pytest.mark.timeout(300)
def test_the_wheel_holds_the_package_and_only_it(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert z.read(top_level).decode().split() == ["fthsdp"]
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"fthsdp"}, tops
    for stray in ("coordinator", "agent", "protos", "tests", "examples", "benchmarks"):
        assert not any(n.startswith(f"{stray}/") for n in names), stray
    for needed in ("fthsdp/examples/__init__.py", "fthsdp/examples/gpt/__init__.py",
                   "fthsdp/examples/gpt/train.py", "fthsdp/examples/gpt/model.py", "fthsdp/examples/gpt/data.py",
                   "fthsdp/protos/v1/coordinator.proto", "fthsdp/protos/v1/catchup.proto",
                   "fthsdp/protos/v1/coordinator_pb2.pyi", "fthsdp/protos/v1/catchup_pb2.pyi",
                   "fthsdp/demo/scenario.py", "fthsdp/cli/main.py"):
        assert needed in names, needed
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)


def _clean_env(venv: Path) -> dict[str, str]:
    """This environment, less whatever would put the checkout or this
    virtual environment on the new one's path."""
    drop = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONUSERBASE")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("FTHSDP_")}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env["PYTHONNOUSERSITE"] = "1"
    env["PIP_NO_INPUT"] = "1"
    # Offline, a package missing from the local indexes fails fast rather than
    # after pip's retries of an unreachable PyPI.
    env.setdefault("PIP_RETRIES", "0")
    env["PIP_DEFAULT_TIMEOUT"] = "15"
    return env


def _pip_install(python: Path, env: dict[str, str], cwd: Path, *what: str) -> None:
    p = _run([python, "-m", "pip", "install", "-q", *what], timeout=1200, env=env, cwd=cwd)
    if p.returncode != 0:
        pytest.skip(f"pip install {' '.join(what)} does not work here (offline?): "
                    + (p.stderr or p.stdout).strip()[-800:])


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_the_installed_wheel_runs_the_demo_outside_the_checkout(wheel, tmp_path):
    venv = tmp_path / "venv"
    made = _run([sys.executable, "-m", "venv", venv], timeout=300, cwd=tmp_path)
    if made.returncode != 0:
        pytest.skip(f"no virtual environment here (python -m venv: {(made.stderr or made.stdout).strip()[-400:]})")
    python = venv / "bin" / "python"
    env = _clean_env(venv)
    empty = tmp_path / "run"
    empty.mkdir()
    _pip_install(python, env, empty, TORCH)
    _pip_install(python, env, empty, f"{wheel}[demo]")

    p = _run([python, "-c", "import fthsdp; from fthsdp import Manager; print(fthsdp.__file__)"],
             timeout=300, env=env, cwd=empty)
    assert p.returncode == 0, p.stderr
    # Installed, the demo's children find fthsdp without a PYTHONPATH.
    check = "from fthsdp.demo.children import child_environment as e; print('PYTHONPATH' in e({}, 'x'))"
    assert _run([python, "-c", check], timeout=300, env=env, cwd=empty).stdout.strip() == "False"
    installed = Path(p.stdout.strip()).resolve()
    assert installed.is_relative_to(venv.resolve()) and not installed.is_relative_to(ROOT), installed

    out = tmp_path / "out"
    p = _run([venv / "bin" / "fthsdp", "demo", "--no-live", "--replicas", "2", "--steps", "30", "--fail-step", "8",
              "--out", out], timeout=1800, env=env, cwd=empty)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and summary["error"] is None, summary["error"]
    assert summary["all_reached_final_step"] and summary["final_steps"] == {"r0": 30, "r1": 30}
    f = summary["failure"]
    assert f["replica"] == "r1" and f["restarted"] and f["caught_up"], f
    assert (out / "demo.png").stat().st_size > 0
    assert "Traceback" not in p.stdout + p.stderr
    assert list(empty.iterdir()) == [], "the demo wrote into its working directory, not only --out"
