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
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from fthsdp.agent.training.transport import choose
from fthsdp.core.errors import ConfigError
from tests.processes import ROOT, _env

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
