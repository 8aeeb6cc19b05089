"""The cross-replica transports held to one contract, with real processes.

gloo always; NCCL where two GPUs are visible (NCCL refuses two ranks on one
GPU). A group built through the transport sums, gathers and broadcasts
correctly with every wait a poll; after a member is killed, the survivor's
``abort()`` returns and it builds the next quorum's group with a new member
under a fresh prefix and goes on.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import types
from collections.abc import Iterator, MutableMapping

import pytest
import torch
import torch.distributed as dist

from fthsdp.agent.training.transport import choose
from fthsdp.agent.training.transport.nccl import ERROR_HANDLING
from fthsdp.core.errors import ConfigError
from tests.harness.processes import ROOT, _env

BACKENDS = ["gloo", pytest.param("nccl", marks=pytest.mark.skipif(
    not (dist.is_nccl_available() and torch.cuda.device_count() >= 2),
    reason="NCCL needs two GPUs here (this machine has none); it runs where two are visible"))]


@pytest.fixture
def store():
    s = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=60))
    yield s


def member(backend: str, rank: int, size: int, port: int, prefix: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.transport_worker", "--backend", backend, "--rank", str(rank), "--size",
         str(size), "--port", str(port), "--prefix", prefix, *extra],
        cwd=ROOT, env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def line(p: subprocess.Popen) -> dict:
    text = p.stdout.readline()
    assert text, f"member exited with {p.wait(timeout=30)}"
    return json.loads(text)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_group_sums_gathers_and_broadcasts(backend, store):
    members = [member(backend, r, 3, store.port, "q1") for r in range(3)]
    results = []
    for p in members:
        assert line(p) == {"built": True}
    for p in members:
        results.append(line(p))
        assert p.wait(timeout=60) == 0
    for r in results:
        assert r["sum"] == [6.0]  # 1 + 2 + 3 on every element, on every member
        assert r["rows"] == [[0, 7], [1, 7], [2, 7]]
        assert r["broadcast"] == [float(i) for i in range(8)]  # rank 0's values


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_survivor_aborts_the_old_group_and_goes_on_in_the_next(backend, store):
    survivor = member(backend, 0, 2, store.port, "q1", "--start-only")
    victim = member(backend, 1, 2, store.port, "q1", "--start-only")
    assert line(survivor) == {"built": True} and line(victim) == {"built": True}
    victim.kill()
    victim.wait(timeout=30)
    survivor.stdin.write("go\n")
    survivor.stdin.flush()
    aborted = line(survivor)
    assert aborted["aborted_in"] < 30  # abort() returned; how long it takes is the benchmark's business
    assert survivor.wait(timeout=60) == 0  # and the process was not ended by the peer's loss
    # The next quorum: a new group under a fresh prefix, with a new member.
    members = [member(backend, r, 2, store.port, "q2") for r in range(2)]
    for p in members:
        assert line(p) == {"built": True}
    for p in members:
        assert line(p)["sum"] == [3.0]
        assert p.wait(timeout=60) == 0


def test_bad_choices_are_one_clear_error():
    with pytest.raises(ConfigError, match="must be one of"):
        choose("mpi", torch.device("cpu"))
    with pytest.raises(ConfigError, match="needs the gradients on a GPU"):
        choose("nccl", torch.device("cpu"))
    assert choose("auto", torch.device("cpu")).name == "gloo"


class WritesRecorded(MutableMapping[str, str]):
    """``os.environ`` that records every write made through it (a read passes through)."""

    def __init__(self, real: MutableMapping[str, str]) -> None:
        self.real = real
        self.writes: list[tuple[str, str | None]] = []

    def __getitem__(self, key: str) -> str:
        return self.real[key]

    def __setitem__(self, key: str, value: str) -> None:
        self.writes.append((key, value))
        self.real[key] = value

    def __delitem__(self, key: str) -> None:
        self.writes.append((key, None))
        del self.real[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.real)

    def __len__(self) -> int:
        return len(self.real)


class FakeNccl:
    """``dist.ProcessGroupNCCL`` as the transport uses it (CPU builds have none): a
    group records the error handling torch would read in its constructor."""

    class Options:
        def __init__(self) -> None:
            self.config = types.SimpleNamespace(blocking=1)
            self._timeout = datetime.timedelta(minutes=10)

    def __init__(self, store: object, rank: int, size: int, options: FakeNccl.Options) -> None:
        self.error_handling = os.environ.get(ERROR_HANDLING)
        self.options = options
        self.connected: torch.device | None = None

    def eager_connect_single_device(self, device: torch.device) -> None:
        self.connected = device


def test_nccl_is_chosen_with_error_handling_off_once_and_a_build_never_writes_the_environment(monkeypatch):
    """The NCCL transport's one change to the process (``choose()``, in
    ``Manager.start()``): FTAR's groups are built with torch's error handling
    off while every build leaves ``os.environ`` alone (FTAR builds on helper
    threads, beside the script's own); a group the script built before (its
    FSDP world) keeps its own setting."""
    monkeypatch.setenv(ERROR_HANDLING, "3")  # the script's own choice, or torch's default
    monkeypatch.setattr(dist, "ProcessGroupNCCL", FakeNccl, raising=False)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    environ = WritesRecorded(os.environ)
    monkeypatch.setattr(os, "environ", environ)
    scripts = FakeNccl(None, 0, 2, FakeNccl.Options())  # built before Manager.start()
    device = torch.device("cuda", 0)

    transport = choose("nccl", device)
    assert environ.writes == [(ERROR_HANDLING, "0")]
    groups = [transport.build(dist.HashStore(), 0, 2, datetime.timedelta(seconds=5)) for _ in range(2)]
    choose("auto", device)  # a second Manager of the process finds it set
    assert environ.writes == [(ERROR_HANDLING, "0")]
    for group in groups:
        assert isinstance(group, FakeNccl)
        assert group.error_handling == "0" and group.options.config.blocking == 0
        assert group.options._timeout == datetime.timedelta(seconds=5) and group.connected == device
    assert scripts.error_handling == "3"
