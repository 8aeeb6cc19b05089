"""Checkpoints of FSDP2 replica groups: 2 replicas of 2 ranks each (`fthsdp agent --nproc 2`, gloo,
a real coordinator). Rank k of each replica writes its share of shard k; the merged checkpoint is the
model torch sees; a new job resumes from it on sharded ranks and trains on as DDP over all ranks would."""

from __future__ import annotations

import warnings

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.harness.ddp import start_ddp_oracle
from tests.harness.hsdp import HIDDEN, RANKS, REPLICAS, hsdp_agent
from tests.harness.processes import CoordinatorProcess

SAVED, MORE = 6, 9


def run(tmp_path, steps: int, tag: str, *agent_args: str) -> None:
    c = CoordinatorProcess(tmp_path, "--min-replicas", str(REPLICAS)).start()
    try:
        agents = [hsdp_agent(tmp_path, c.address, k, "--steps", str(steps), "--save",
                             str(tmp_path / f"{tag}{k}.pt"), agent_args=agent_args).start()
                  for k in range(REPLICAS)]
        for a in agents:
            a.finish(timeout=180)
    finally:
        c.stop()
    return agents


def test_sharded_groups_write_one_checkpoint_and_a_new_job_resumes_from_it(tmp_path):
    oracle = start_ddp_oracle(tmp_path, REPLICAS * RANKS, "--steps", str(MORE), "--hidden", HIDDEN)
    root = tmp_path / "ckpt"
    # One checkpoint, at the last step: with one every 3 steps a member whose step-3 share was
    # still being written (a loaded machine) skipped step 6 by design, and it was never sealed.
    checkpointing = ("--checkpoint-dir", str(root), "--checkpoint-every", str(SAVED))
    run(tmp_path, SAVED, "first", *checkpointing)
    folder = root / "default" / f"step-{SAVED:010d}"
    assert (folder / "checkpoint.json").exists()
    shares = sorted(p.name for p in folder.iterdir() if p.is_dir())
    assert shares == [f"share-{s}-rank-{r}" for s in range(REPLICAS) for r in range(RANKS)]
    out = tmp_path / "converted.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(str(folder), str(out))
    converted = torch.load(out, weights_only=True)["model"]
    final = torch.load(tmp_path / "first0.pt", weights_only=True)  # the full model at the end, step 6
    assert converted.keys() == final.keys()
    for name, value in final.items():
        assert torch.equal(converted[name], value), name

    agents = run(tmp_path, MORE, "resumed", *checkpointing, "--resume")
    assert min(agents[0].steps) == SAVED + 1  # went on from the checkpoint, not from step 0
    for p in oracle:
        assert p.wait(timeout=180) == 0
    expected = torch.load(tmp_path / "ddp0.pt", weights_only=True)
    for k in range(REPLICAS):
        got = torch.load(tmp_path / f"resumed{k}.pt", weights_only=True)
        for name, value in expected.items():
            torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=f"replica {k}, {name}")
