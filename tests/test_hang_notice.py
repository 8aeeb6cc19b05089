"""A rank's stack dump when the coordinator takes its replica out
(fthsdp/agent/training/session/hang_notice.py): in one write, so that a JSON
record the agent writes to the same stderr at the same moment stays whole."""

from __future__ import annotations

import os

from fthsdp.agent.training.session.hang_notice import HangNotices
from fthsdp.protos.v1 import coordinator_pb2 as pb


def verdict(restart_count: int = 0) -> pb.WatchEvent:
    return pb.WatchEvent(hang=pb.HangNotice(reason="no heartbeat for 2s", restart_count=restart_count, step=7))


def test_the_stacks_go_to_stderr_in_one_write_with_their_heading(capfd, monkeypatch):
    writes: list[bytes] = []
    real_write = os.write

    def spy(fd: int, data: bytes) -> int:
        writes.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", spy)
    notices = HangNotices("r1", 0, restart_count=0)
    notices(verdict())
    notices(verdict())  # once per incarnation
    monkeypatch.undo()
    dumps = [w for w in writes if b"Stacks of every thread" in w]
    assert len(dumps) == 1, writes
    dump = dumps[0].decode()
    assert dump.startswith("fthsdp: replica r1 rank 0 taken out by the coordinator: no heartbeat for 2s.")
    assert "most recent call first" in dump and "test_hang_notice.py" in dump, dump
    assert dump.endswith("\n")
    assert "Stacks of every thread" in capfd.readouterr().err


def test_a_verdict_for_an_earlier_incarnation_dumps_nothing(capfd):
    HangNotices("r1", 0, restart_count=2)(verdict(restart_count=1))
    assert "Stacks" not in capfd.readouterr().err
