"""A catch-up source in a process of its own, for tests/test_catchup_group.py.

It holds a small trained model and a log of three steps behind a
CatchUpServer that also opens catch-up sessions over a two-rank gloo group,
takes a snapshot whenever one is asked for, and prints one JSON line: its
address, the state's checksum and the log's sums. ``--fault`` breaks the
group on purpose, to show the joiner going on over HTTP:

* ``corrupt``: the snapshot's chunk 1 arrives with one byte flipped;
* ``stop``: the source leaves the session after the snapshot's chunk 1;
* ``corrupt-log``: the log's first entry arrives with one byte flipped;
* ``http-only``: the source opens no session at all.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading

import torch

from fthsdp.agent.training.catchup.grad_log import GradientLog
from fthsdp.agent.training.catchup.group import GroupChannel, GroupTransferError, Session, SessionRequest
from fthsdp.agent.training.catchup.server import CatchUpServer
from fthsdp.agent.training.catchup.source import ServedState
from fthsdp.agent.training.state.checksum import state_checksum
from fthsdp.agent.training.state.snapshot import capture_state
from fthsdp.agent.training.transport.gloo import GlooTransport
from fthsdp.protos.v1 import catchup_pb2 as cpb

LOG_STEPS = 3


def model_and_optimizer(seed: int, width: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.BatchNorm1d(width), torch.nn.Linear(width, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def log_sums() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randn(1000, generator=g) for _ in range(LOG_STEPS)]


class FaultyChannel(GroupChannel):
    """Sessions whose sends break as ``fault`` says (the first send of a
    session is the snapshot's push, the next ones the log's)."""

    def __init__(self, fault: str, *args) -> None:
        super().__init__(*args)
        self.fault = fault

    def accept(self, request: SessionRequest) -> Session:
        session = super().accept(request)
        send, sends = session.send, [0]

        def faulty(pieces: list[torch.Tensor], pace=lambda sent: None) -> None:
            sends[0] += 1
            first = sends[0] == 1
            if self.fault == "corrupt" and first or self.fault == "corrupt-log" and not first:
                pieces = [p.clone() for p in pieces]
                pieces[1 if first else 0][3] ^= 0xFF
            if self.fault == "stop" and first:
                send(pieces[:2], pace)
                session.close()
                raise GroupTransferError("stopped on purpose")
            send(pieces, pace)

        session.send = faulty  # type: ignore[method-assign]
        return session


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--fault", choices=("none", "corrupt", "stop", "corrupt-log", "http-only"), default="none")
    parser.add_argument("--token", default="", help="the job token: requests need transfer tokens keyed by it")
    args = parser.parse_args()
    model, opt = model_and_optimizer(0, args.width)
    model(torch.randn(8, args.width)).sum().backward()
    opt.step()
    log = GradientLog()
    for step, total in enumerate(log_sums()):
        log.append(cpb.LogEntry(step=step, hyperparams_json="[]"), total, 1, 1)
    source = ServedState("r0", 0, 42, log, chunk_bytes=args.chunk)
    channel = None if args.fault == "http-only" else FaultyChannel(args.fault, GlooTransport(), "127.0.0.1", 10.0)
    server = CatchUpServer(source, token=args.token, channel=channel).start()
    stop = threading.Event()

    def train() -> None:  # the training thread: a snapshot at the next "step boundary" when asked
        while not stop.wait(0.001):
            if source.wanted:
                source.take(log.head, capture_state(model, opt))
                source.wait_copied(10)

    threading.Thread(target=train, daemon=True).start()
    print(json.dumps({"address": server.address, "checksum": state_checksum(model, opt)}), flush=True)
    sys.stdin.read()  # until the test closes our stdin
    stop.set()
    server.close()


if __name__ == "__main__":
    main()
