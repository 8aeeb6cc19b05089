"""One cross-replica group per process, reconfigured in place per quorum (torch >= 2.14), with real processes.

Each quorum meets on a store of its own, as FTAR's quorums meet on their
first member's: the group is built once, on a store that forwards to the
quorum's (fthsdp/agent/training/transport/reconfigure.py).
"""

from __future__ import annotations

import datetime
import json
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from fthsdp.agent.training.transport import choose, reconfigure
from fthsdp.core.errors import ConfigError
from tests.harness.processes import ROOT, _env

needs_reconfigure = pytest.mark.skipif(
    not reconfigure.supported(),
    reason=f"torch {torch.__version__} has no process-group reconfigure (torch >= 2.14); "
           "the group per quorum (tests/test_transport.py) is the path here")


class Member:
    def __init__(self) -> None:
        self.p = subprocess.Popen([sys.executable, "-m", "tests.reconfigure_worker"], cwd=ROOT, env=_env(),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def send(self, **cmd: object) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()

    def answer(self) -> dict:
        assert self.p.stdout is not None
        text = self.p.stdout.readline()
        assert text, f"member exited with {self.p.wait(timeout=30)}"
        return json.loads(text)

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=30)


@pytest.fixture
def members():
    made: list[Member] = []

    def make(n: int) -> list[Member]:
        new = [Member() for _ in range(n)]
        made.extend(new)
        return new

    yield make
    for m in made:
        m.close()


def store() -> dist.TCPStore:
    """A quorum's rendezvous store (its first member's, in the job)."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=30))


def meet(quorum: int, members: list[Member], grows: bool = False) -> list[dict]:
    s = store()
    for rank, m in enumerate(members):
        m.send(op="quorum", id=quorum, rank=rank, size=len(members), port=s.port, grows=grows)
    answers = [m.answer() for m in members]
    for rank, a in enumerate(answers):
        assert (a["quorum"], a["rank"], a["size"]) == (quorum, rank, len(members))
    return answers


def summed(members: list[Member]) -> list[float]:
    for rank, m in enumerate(members):
        m.send(op="sum", value=rank + 1)
    return [m.answer()["sum"] for m in members]


@needs_reconfigure
def test_one_group_object_through_a_kill_a_join_and_a_leave(members):
    a, b, c = members(3)
    first = meet(1, [a, b, c])
    assert summed([a, b, c]) == [6.0] * 3
    # Killed while the survivors' next all-reduce runs: they leave it (FTAR abandons it for the next quorum).
    a.send(op="start", count=2)
    b.send(op="start", count=2)
    assert a.answer() == b.answer() == {"started": 2}
    c.p.send_signal(signal.SIGKILL)
    c.p.wait(timeout=30)
    for m in (a, b):
        m.send(op="idle")
    assert a.answer() == b.answer() == {"running": 0}  # failed: the dead peer's connections reset
    second = meet(2, [a, b])
    assert summed([a, b]) == [3.0, 3.0]
    (d,) = members(1)  # a fresh process joins
    third = meet(3, [a, b, d], grows=True)
    assert summed([a, b, d]) == [6.0] * 3
    fourth = meet(4, [d, b])  # a leaves; b is now rank 1
    assert summed([d, b]) == [3.0, 3.0]
    # The same group object on the survivors through three quorum changes.
    for i in (0, 1):
        assert first[i]["group"] == second[i]["group"] == third[i]["group"], (first, second, third)
        assert first[i]["number"] == second[i]["number"] == third[i]["number"] == 0
    assert fourth[1]["group"] == first[1]["group"] and fourth[0]["group"] == third[2]["group"]


@needs_reconfigure
def test_a_hung_peers_collectives_do_not_hold_up_the_next_quorum(members):
    """A hung (stopped) peer's collectives hold the group's threads until its
    timeout (30 s here); the next quorum meets in another group of the pool
    and sums at once, well before."""
    a, b, c = members(3)
    meet(1, [a, b, c])
    c.p.send_signal(signal.SIGSTOP)
    try:
        for m in (a, b):
            m.send(op="start", count=3)  # more than gloo's two threads
        assert a.answer() == b.answer() == {"started": 3}
        began = time.monotonic()
        second = meet(2, [a, b])
        for rank, m in enumerate((a, b)):
            m.send(op="sum", value=rank + 1)
        sums = [m.answer() for m in (a, b)]
        took = time.monotonic() - began
    finally:
        c.p.send_signal(signal.SIGCONT)
    assert [s["sum"] for s in sums] == [3.0, 3.0]
    assert [s["number"] for s in second] == [1, 1]  # another group of the pool
    assert took < 20, f"the next quorum waited {took:.1f}s for the hung peer's collectives (their timeout is 30 s)"


@needs_reconfigure
def test_a_quorum_id_is_never_reconfigured_twice():
    transport = choose("gloo", torch.device("cpu"), groups="reconfigure")
    s = dist.HashStore()
    pending = transport.prepare(dist.PrefixStore("q5", s), 0, 1, 5, datetime.timedelta(seconds=5))
    assert pending.join().size() == 1
    with pytest.raises(RuntimeError, match="must never repeat"):
        transport.prepare(dist.PrefixStore("q5b", s), 0, 1, 5, datetime.timedelta(seconds=5))


def test_the_groups_choice_is_checked_and_said_once(monkeypatch, caplog):
    with pytest.raises(ConfigError, match="--cross-replica-groups must be one of"):
        choose("gloo", torch.device("cpu"), groups="sometimes")
    monkeypatch.setattr(reconfigure, "supported", lambda: False)
    with pytest.raises(ConfigError, match="needs torch >= 2.14"):
        choose("gloo", torch.device("cpu"), groups="reconfigure")
    caplog.set_level("INFO", logger="fthsdp.agent.transport")
    assert choose("auto", torch.device("cpu")).in_place is False  # auto: per quorum without reconfigure
    monkeypatch.setattr(reconfigure, "supported", lambda: True)
    assert choose("auto", torch.device("cpu")).in_place is True
    assert choose("gloo", torch.device("cpu"), groups="per-quorum").in_place is False
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 3 and "a new group per quorum" in said[0] and "reconfigured in place" in said[1], said
