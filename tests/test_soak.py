"""The randomized fault soak (tests/soak.py): a short run in the default
suite, a long one in the slow suite whose table goes in benchmarks/README.md."""

from __future__ import annotations

import os

import pytest

from tests.processes import CoordinatorProcess
from tests.soak import dump, run_soak, table


def soak(tmp_path, replicas: int, seconds: float, seed: int, model: str = "plain") -> dict:
    c = CoordinatorProcess(tmp_path, "--heartbeat-interval", "200ms", "--heartbeat-timeout", "1s",
                           "--join-timeout", "2s", "--min-replicas", "1").start()
    try:
        result = run_soak(tmp_path, c.address, replicas, seconds, steps_after=10, seed=seed, model=model)
    finally:
        c.stop()
    dump(result, tmp_path / "soak.json")
    print("\n" + table(result))
    assert not result["split_steps"], f"steps committed with different states: {result['split_steps']}"
    assert not result["missing_steps"], f"committed steps missing: {result['missing_steps']}"
    assert not result["started_over"], f"incarnations that started over: {result['started_over']}"
    assert result["state_lost_step"] == 0
    assert result["kills"] > 0
    return result


@pytest.mark.timeout(400)
def test_soak_short(tmp_path):
    soak(tmp_path, replicas=3, seconds=25, seed=1)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_soak_long(tmp_path):
    soak(tmp_path, replicas=4, seconds=180, seed=int(os.environ.get("FTHSDP_SOAK_SEED", "2")),
         model=os.environ.get("FTHSDP_SOAK_MODEL", "plain"))
