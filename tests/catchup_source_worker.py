"""A catch-up source in a process of its own, for tests/test_catchup_group.py.

It holds a small trained model behind a CatchUpServer that also pushes over
a two-rank gloo group, takes a snapshot whenever one is asked for, and
prints one JSON line: its address and the state's checksum. ``--fault``
breaks the group push on purpose, to show the joiner going on over HTTP:

* ``corrupt``: the group carries chunk 1 with one byte flipped;
* ``stop``: the source leaves the group after chunk 1;
* ``http-only``: the source serves no push at all.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading

import torch

from fthsdp.agent.training.catchup_group import GroupChannel, GroupTransferError, PushRequest
from fthsdp.agent.training.catchup_server import CatchUpServer
from fthsdp.agent.training.catchup_source import CatchUpSource
from fthsdp.agent.training.checksum import state_checksum
from fthsdp.agent.training.grad_log import GradientLog
from fthsdp.agent.training.snapshot import capture_state
from fthsdp.agent.training.transport.gloo import GlooTransport
from fthsdp.protos.v1 import catchup_pb2 as cpb


def model_and_optimizer(seed: int, width: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.BatchNorm1d(width), torch.nn.Linear(width, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


class FaultyChannel(GroupChannel):
    def __init__(self, fault: str, *args) -> None:
        super().__init__(*args)
        self.fault = fault

    def push(self, data: torch.Tensor, chunk_bytes: int, request: PushRequest, pace=lambda sent: None) -> int:
        if self.fault == "corrupt":
            data = data.clone()
            data[chunk_bytes + 3] ^= 0xFF
        if self.fault == "stop":
            data = data[: 2 * chunk_bytes]  # two chunks, then the group is dropped
            super().push(data, chunk_bytes, request, pace)
            raise GroupTransferError("stopped on purpose")
        return super().push(data, chunk_bytes, request, pace)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--fault", choices=("none", "corrupt", "stop", "http-only"), default="none")
    args = parser.parse_args()
    model, opt = model_and_optimizer(0, args.width)
    model(torch.randn(8, args.width)).sum().backward()
    opt.step()
    log = GradientLog()
    log.append(cpb.LogEntry(step=0, hyperparams_json="[]"), torch.zeros(4), 1, 1)
    source = CatchUpSource("r0", 0, 42, log, chunk_bytes=args.chunk)
    channel = None if args.fault == "http-only" else FaultyChannel(args.fault, GlooTransport(), "127.0.0.1", 10.0)
    server = CatchUpServer(source, channel=channel).start()
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
