"""gloo ranks, one per network namespace, driven by stdin: the small program
tests/test_netns.py runs to see what a NetLab fault does to a gloo group.

    python -m tests.netns_gloo --ns NS0 --ns NS1 ... --host RANK0_DATA_IP --port P

Commands, one per line on stdin, each sent to every rank: ``group NAME``
builds a ProcessGroupGloo over the TCPStore; ``allreduce SECONDS`` runs one
all-reduce of (rank + 1)s and waits at most SECONDS; ``exit``. Each rank
answers every command with one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import sys
import time

from tests.harness.netns import DATA_IF, enter_netns


def _gloo_peer(rank: int, args: argparse.Namespace, commands) -> None:
    """One gloo rank driven by ``commands`` (lines): ``group NAME`` builds a
    ProcessGroupGloo over the TCPStore; ``allreduce SECONDS`` runs one
    all-reduce of (rank + 1)s and waits at most SECONDS. One JSON line per
    command on stdout, with the rank."""
    import datetime

    import torch
    import torch.distributed as dist

    def say(**fields) -> None:
        os.write(1, (json.dumps({"rank": rank, **fields}) + "\n").encode())  # one write: lines never interleave

    timeout = datetime.timedelta(seconds=args.timeout)
    store = dist.TCPStore(args.host, args.port, args.world, is_master=rank == 0, timeout=timeout,
                          wait_for_workers=False)
    say(store=f"{args.host}:{store.port}", pid=os.getpid())
    keep = []  # groups are never destroyed: gloo's destructor waits for a stuck collective
    pg = None
    for line in commands:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "group":
            t0 = time.monotonic()
            pg = dist.ProcessGroupGloo(dist.PrefixStore(cmd[1], store), rank, args.world, timeout)
            keep.append(pg)
            say(group=cmd[1], s=round(time.monotonic() - t0, 3))
        elif cmd[0] == "allreduce":
            t = torch.ones(1024) * (rank + 1)
            t0 = time.monotonic()
            work = pg.allreduce([t])
            while not work.is_completed() and time.monotonic() - t0 < float(cmd[1]):
                time.sleep(0.005)
            done = work.is_completed()
            say(allreduce=done, value=float(t[0]) if done else None, s=round(time.monotonic() - t0, 3))
        elif cmd[0] == "exit":
            break
    os._exit(0)


def _main(args: argparse.Namespace) -> None:
    """Import torch once, then fork one gloo rank per ``--ns`` (rank i enters
    namespace i, with GLOO_SOCKET_IFNAME set); each line on stdin goes to
    every rank. The ranks die with this process."""
    import importlib

    importlib.import_module("torch.distributed")  # imported once, before the forks

    pipes = []
    for rank, ns in enumerate(args.ns):
        r, w = os.pipe()
        if os.fork() == 0:
            try:
                os.close(w)
                for _, other in pipes:
                    other.close()
                ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
                enter_netns(ns)
                os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
                _gloo_peer(rank, args, os.fdopen(r))
            finally:
                os._exit(1)
        os.close(r)
        pipes.append((rank, os.fdopen(w, "w")))
    for line in sys.stdin:
        for _, pipe in pipes:
            with contextlib.suppress(BrokenPipeError):
                pipe.write(line)
                pipe.flush()
    for _, pipe in pipes:
        with contextlib.suppress(BrokenPipeError):
            pipe.close()
    for _ in pipes:
        with contextlib.suppress(ChildProcessError):
            os.wait()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.netns_gloo")
    p.add_argument("--ns", action="append", required=True, help="a namespace per rank, rank 0 first")
    p.add_argument("--host", required=True, help="rank 0's data address: the TCPStore")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ifname", default=DATA_IF)
    p.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    args.world = len(args.ns)
    _main(args)


if __name__ == "__main__":
    main()
