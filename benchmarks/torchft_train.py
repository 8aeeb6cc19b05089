"""The example GPT (fthsdp.examples.gpt) under torchft 0.2.0, for benchmarks/torchft_compare.py only.

Runs in the benchmark's own environment (benchmarks/.torchft-venv, with
torchft installed), never in fthsdp's: the example's model.py and data.py
(torch alone) are imported from their folder, not through the fthsdp
package. Prints one JSON line per step with the step torchft committed (or
not) and the time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fthsdp" / "examples" / "gpt"))

from data import Dataset, corpus  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()
    torch.set_num_threads(1)
    replica = int(os.environ.get("REPLICA_GROUP_ID", "0"))
    data = Dataset(corpus(), 128)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=data.vocab_size))
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def state_dict():
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"bench_{replica}",
        timeout=timedelta(seconds=10),
    )
    ddp = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, inner)
    print(json.dumps({"pid": os.getpid()}), flush=True)
    while manager.current_step() < args.steps:
        optimizer.zero_grad()
        x, y = data.batch(manager.current_step(), replica, 8)
        _, loss = ddp(x, y)
        loss.backward()
        before = manager.current_step()
        optimizer.step()  # commits (and counts the step) only if every replica's all-reduce succeeded
        committed = manager.current_step() > before
        print(json.dumps({"step": manager.current_step(), "committed": committed, "t": time.monotonic()}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
