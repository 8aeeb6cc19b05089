"""examples/nanogpt: with no failures, N replicas of its train.py under fthsdp
end with the parameters torch's DistributedDataParallel reaches with world
size N running the same loop; the README's diff is the one train.py makes;
the batch source's state carries a replica's place in its shard."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from tests.harness.ddp import start_ddp_oracle
from tests.harness.processes import ROOT, CoordinatorProcess, WorkerProcess, _env

EXAMPLE = ROOT / "examples" / "nanogpt"
N, STEPS = 2, 10
# Every flag that shapes training, passed to train.py and to the DDP oracle alike
# (warmup ends and the cosine runs within the steps; clipping is active at this lr).
TRAINING = [
    "--max-iters", str(STEPS), "--gradient-accumulation-steps", "2", "--batch-size", "4", "--block-size", "32",
    "--n-layer", "2", "--n-head", "4", "--n-embd", "32", "--learning-rate", "3e-3", "--weight-decay", "0.1",
    "--beta1", "0.9", "--beta2", "0.99", "--grad-clip", "1.0", "--warmup-iters", "3", "--lr-decay-iters", "8",
    "--min-lr", "3e-4", "--seed", "7",
]


def _fthsdp_replicas(tmp_path, coordinator: str, dtype: str) -> list[WorkerProcess]:
    workers = []
    for r in range(N):
        w = WorkerProcess(tmp_path, coordinator, f"r{r}", r, env={"FTHSDP_NUM_REPLICAS": str(N)})
        w.argv = [sys.executable, str(EXAMPLE / "train.py"), "--dtype", dtype, *TRAINING,
                  "--eval-iters", "1", "--log-every", "1", "--out-dir", str(tmp_path / f"ft{r}")]
        workers.append(w.start())
    return workers


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", pytest.param("float16", marks=pytest.mark.slow)])
def test_same_parameters_as_ddp(tmp_path, dtype):
    oracle = start_ddp_oracle(tmp_path, N, "--dtype", dtype, *TRAINING, worker="tests.nanogpt_ddp_worker", log=True)
    coordinator = CoordinatorProcess(tmp_path, "--min-replicas", str(N)).start()
    try:
        workers = _fthsdp_replicas(tmp_path, coordinator.address, dtype)
        done = [w.finish(timeout=60) for w in workers]
    finally:
        coordinator.stop()
    for p in oracle:
        assert p.wait(timeout=60) == 0, (tmp_path / "ddp0.log").read_text()[-2000:]
    assert [d["done"] for d in done] == [STEPS] * N
    # the replicas report the same checksum at every step (FTHSDP_CHECKSUM_EVERY=1)
    for step in range(1, STEPS + 1):
        lines = [w.steps[step] for w in workers]
        assert len({line["checksum"] for line in lines}) == 1, lines
    expected = torch.load(tmp_path / "ddp0.pt", weights_only=True)["model"]
    first = torch.load(tmp_path / "ft0" / "ckpt.pt", weights_only=True)["model"]
    for r in range(N):
        got = torch.load(tmp_path / f"ft{r}" / "ckpt.pt", weights_only=True)["model"]
        assert got.keys() == expected.keys()
        for name, value in expected.items():
            # Equal up to float32 rounding: DDP divides before summing, FTAR after (with 2 replicas,
            # exactly equal). Under autocast both round the forward pass the same way.
            torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=f"replica {r}, {name}")
        assert all(torch.equal(got[k], first[k]) for k in first)  # the replicas are bit-identical among themselves
    assert not torch.equal(first["lm_head.weight"], _initial_lm_head()), "training changed nothing"


def _initial_lm_head() -> torch.Tensor:
    sys.path.insert(0, str(EXAMPLE))
    try:
        from data import CharData, corpus
        from model import GPT, GPTConfig
    finally:
        sys.path.remove(str(EXAMPLE))
    torch.manual_seed(7)
    return GPT(GPTConfig(vocab_size=CharData(corpus()).vocab_size, block_size=32, n_layer=2, n_head=4,
                         n_embd=32)).lm_head.weight.detach()


def _readme_diff() -> list[str]:
    text = (EXAMPLE / "README.md").read_text()
    blocks = re.findall(r"```diff\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "the README has one diff block"
    return blocks[0].splitlines()


def test_readme_diff_is_the_one_train_py_makes():
    """The fthsdp side of every hunk (context and "+" lines) appears in train.py, in order."""
    diff = _readme_diff()
    source = (EXAMPLE / "train.py").read_text().splitlines()
    added = [line[1:] for line in diff if line.startswith("+") and not line.startswith("+++")]
    assert 0 < len([line for line in added if line.strip()]) <= 30, f"{len(added)} added lines are not a handful"
    for line in added:
        assert line in source, f"a '+' line of the README's diff is not in train.py: {line!r}"
    hunks, current = [], None
    for line in diff:
        if line.startswith("@@"):
            current = []
            hunks.append(current)
        elif current is not None and not line.startswith(("-", "---", "+++")):
            current.append(line[1:])
    at = 0
    for hunk in hunks:
        for line in hunk:  # each line of the new side, after the previous one
            assert line in source[at:], f"not in train.py in the diff's order: {line!r}"
            at = source.index(line, at) + 1


def test_train_py_help():
    out = subprocess.run([sys.executable, str(EXAMPLE / "train.py"), "--help"], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for flag in ("--max-iters", "--gradient-accumulation-steps", "--dtype", "--fail-at-step", "--fail-how"):
        assert flag in out.stdout


def test_batch_source_state_and_shards():
    sys.path.insert(0, str(EXAMPLE))
    try:
        from data import BatchSource
    finally:
        sys.path.remove(str(EXAMPLE))
    tokens = torch.arange(400)  # token = its position: a window's first token is its start
    sources = [BatchSource(tokens, 4, 16, seed=3).shard(r, 2) for r in range(2)]
    per_epoch = sources[0].batches_per_epoch
    assert per_epoch == sources[1].batches_per_epoch == 2
    starts = [int(x[0]) for s in sources for _ in range(per_epoch) for x in s.next()[0]]
    assert len(set(starts)) == len(starts) == 2 * per_epoch * 4  # the replicas' parts of an epoch do not overlap
    assert sources[0].state_dict() == sources[1].state_dict() == {"epoch": 0, "position": per_epoch}
    x, y = sources[1].next()  # the next epoch: another permutation and shift
    assert sources[1].state_dict() == {"epoch": 1, "position": 1}
    assert torch.equal(y[:, :-1], x[:, 1:])
    # replica 1 restored from replica 0's state goes on as replica 1 would have
    resumed = BatchSource(tokens, 4, 16, seed=3).shard(1, 2)
    sources[0].next()
    resumed.load_state_dict(sources[0].state_dict())
    for _ in range(5):
        a, b = resumed.next(), sources[1].next()
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_a_killed_replica_recovers_bit_identically(tmp_path):
    """Three replicas of the example under `fthsdp agent` (fp16 autocast and
    the GradScaler, clipping, warmup + cosine lr, accumulation); one SIGKILLs
    itself at step 25, its agent restarts it, it catches up from a peer, and
    every step that several replicas logged has one state checksum. 200
    steps: the members go on while it restarts, and a cold start costs 40-60
    of their steps on a fast machine; it must still train 30 with them."""
    import json

    c = CoordinatorProcess(tmp_path, "--min-replicas", "2", "--heartbeat-interval", "200ms",
                           "--heartbeat-timeout", "1s", "--join-timeout", "2s").start()
    agents = []
    try:
        for i in range(3):
            fail = ["--fail-at-step", "25"] if i == 2 else []
            argv = [sys.executable, "-m", "fthsdp", "agent", "--coordinator", c.address, "--replica-id", f"r{i}",
                    "--replica-rank", str(i), "--num-replicas", "3", "--restart-backoff", "100ms", "--",
                    sys.executable, "examples/nanogpt/train.py", "--max-iters", "200", "--dtype", "float16",
                    "--log-every", "1", "--eval-interval", "1000", *fail]
            env = {**_env(), "FTHSDP_CHECKSUM_EVERY": "1", "OMP_NUM_THREADS": "1"}
            agents.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                           stderr=open(tmp_path / f"agent-r{i}.log", "wb"), text=True))
        outputs = [a.communicate(timeout=240)[0] for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
        c.stop()
    assert [a.returncode for a in agents] == [0, 0, 0], (tmp_path / "agent-r2.log").read_text()[-2000:]
    by_step: dict[int, set[str]] = {}
    starts = []
    for out in outputs:
        for raw in out.splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if "start_step" in line:
                starts.append(line["start_step"])
            if "step" in line and line.get("checksum"):
                by_step.setdefault(line["step"], set()).add(line["checksum"])
    assert max(starts) > 25, f"the restarted replica did not catch up: start steps {starts}"
    assert all(len(c) == 1 for c in by_step.values()), {s: c for s, c in by_step.items() if len(c) > 1}
    assert len([s for s in by_step if s > max(starts)]) >= 30
