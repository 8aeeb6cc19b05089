"""The store a replica group's ranks meet at, hosted for the node agent.

``python -m fthsdp.agent.store_host``: a small child of a node agent in a
group of several hosts (the agent itself imports no torch). At each line
``open`` on stdin it closes the store it holds and opens a fresh
``torch.distributed.TCPStore`` on a free port, and answers the port on
stdout; stdin closing ends it. The agent joins each rendezvous round with a
fresh store, and the coordinator gives the store of the host of node rank 0
to the whole group for that round: the ranks reach it as clients with
torchrun's agent-store contract (TORCHELASTIC_USE_AGENT_STORE, keys under
the round's number), so a rank of an earlier round never meets a later one.
"""

from __future__ import annotations

import datetime
import gc
import sys


def main() -> int:
    from torch.distributed import TCPStore  # here, not at import: the agent's tests import nothing of torch

    store = None
    for line in sys.stdin:
        if line.strip() != "open":
            print(f"error unknown command {line.strip()!r}", flush=True)
            continue
        store = None
        gc.collect()  # the old store's server closes with its last reference
        store = TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=300))
        print(f"port {store.port}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
