"""One replica's rank with a reconfigured cross-replica group, for tests/test_reconfigure.py.

    python -m tests.reconfigure_worker

Reads one JSON command a line and answers each with one JSON line:

* ``{"op": "quorum", "id": Q, "rank": R, "size": N, "port": P, "grows": G}``: meet quorum
  Q's members on the store at port P (under the quorum's prefix, as FTAR
  does) through ``ReconfigureTransport.prepare`` and ``join``; answer which
  group object it is (``id``, its number in the pool) and its rank and size.
  ``grows``: the quorum only adds members to the last one (its group is preferred whatever runs in it).
* ``{"op": "sum", "value": V}``: an all-reduce of V, awaited by polling as FTAR does.
* ``{"op": "start", "count": K}``: start K all-reduces and leave them (a quorum whose peer is gone).
* ``{"op": "idle"}``: wait until the collectives it started have ended (failed, for a dead peer's).
"""

from __future__ import annotations

import datetime
import json
import sys
import time

import torch
import torch.distributed as dist

from fthsdp.agent.training.transport import choose
from tests.transport_worker import await_work


def main() -> None:
    transport = choose("gloo", torch.device("cpu"), groups="reconfigure")
    timeout = datetime.timedelta(seconds=30)
    group = None
    left = []  # collectives started and left: kept alive, as FTAR keeps an abandoned group
    for text in sys.stdin:
        cmd = json.loads(text)
        if cmd["op"] == "quorum":
            began = time.monotonic()
            store = dist.PrefixStore(f"q{cmd['id']}", dist.TCPStore("127.0.0.1", cmd["port"], is_master=False,
                                                                    timeout=timeout))
            group = transport.prepare(store, cmd["rank"], cmd["size"], cmd["id"], timeout,
                                       group if cmd.get("grows") else None).join()
            out = {"quorum": cmd["id"], "group": id(group), "number": group.number, "rank": group.rank(),
                   "size": group.size(), "ms": 1e3 * (time.monotonic() - began)}
        elif cmd["op"] == "sum":
            t = torch.full((1 << 16,), float(cmd["value"]))
            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp.SUM
            began = time.monotonic()
            await_work(group.allreduce([t], opts))
            out = {"sum": t[0].item(), "s": time.monotonic() - began}
        elif cmd["op"] == "start":
            for _ in range(cmd["count"]):
                opts = dist.AllreduceOptions()
                opts.reduceOp = dist.ReduceOp.SUM
                left.append(group.allreduce([torch.ones(1 << 16)], opts))
            out = {"started": cmd["count"]}
        elif cmd["op"] == "idle":
            began = time.monotonic()
            while group.running() and time.monotonic() - began < 60:
                time.sleep(0.005)
            out = {"running": group.running()}
        else:
            raise SystemExit(f"unknown command {cmd!r}")
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
