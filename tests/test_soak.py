"""The randomized fault soak (tests/harness/soak.py): a short run in the default
suite, a short control-plane one in the slow suite (both in CI), long ones
(marked ``soak``: too long for CI, about 13 minutes together) whose tables
go in benchmarks/README.md.
With control-plane faults (tests/harness/soak_control.py) the coordinators run under
a supervisor on a private etcd, which the faults stall and restart."""

from __future__ import annotations

import os

import pytest

from tests.harness.processes import CoordinatorProcess
from tests.harness.soak import control_table, dump, run_soak, table
from tests.harness.soak_control import ControlPlane

COORDINATOR_ARGS = ("--heartbeat-interval", "200ms", "--heartbeat-timeout", "1s", "--join-timeout", "2s",
                    "--min-replicas", "1")


def check(result: dict) -> None:
    assert not result["split_steps"], f"steps committed with different states: {result['split_steps']}"
    assert not result["missing_steps"], f"committed steps missing: {result['missing_steps']}"
    assert not result["started_over"], f"incarnations that started over: {result['started_over']}"
    assert result["state_lost_step"] == 0
    assert result["kills"] > 0


def soak(tmp_path, replicas: int, seconds: float, seed: int, model: str = "plain") -> dict:
    c = CoordinatorProcess(tmp_path, *COORDINATOR_ARGS).start()
    try:
        result = run_soak(tmp_path, c.address, replicas, seconds, steps_after=10, seed=seed, model=model)
    finally:
        c.stop()
    dump(result, tmp_path / "soak.json")
    print("\n" + table(result))
    check(result)
    return result


def control_soak(tmp_path, replicas: int, seconds: float, seed: int, coordinators: int,
                 every: tuple[float, float] = (10.0, 20.0)) -> dict:
    """The soak with control-plane faults: ``coordinators`` 1 (a supervisor
    restarts it) or 2 (a follower takes over, then the supervisor restarts
    the killed one as a follower)."""
    control = ControlPlane(tmp_path, coordinators, *COORDINATOR_ARGS, "--leader-ttl", "2s")
    try:
        control.wait_serving()
        result = run_soak(tmp_path, control.addresses, replicas, seconds, steps_after=10, seed=seed,
                          control=control, control_every=every)
    finally:
        control.close()
    dump(result, tmp_path / "soak.json")
    print("\n" + table(result) + "\n\n" + control_table(result))
    check(result)
    assert sum(result["control_faults"].values()) > 0
    return result


@pytest.mark.timeout(400)
def test_soak_short(tmp_path):
    soak(tmp_path, replicas=3, seconds=25, seed=1)


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.timeout(1200)
def test_soak_long(tmp_path):
    soak(tmp_path, replicas=4, seconds=180, seed=int(os.environ.get("FTHSDP_SOAK_SEED", "2")),
         model=os.environ.get("FTHSDP_SOAK_MODEL", "plain"))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_soak_control_plane_short(tmp_path):
    control_soak(tmp_path, replicas=3, seconds=30, seed=3, coordinators=1, every=(5.0, 8.0))


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("coordinators", [1, 2], ids=["supervised", "with-follower"])
def test_soak_control_plane_long(tmp_path, coordinators):
    control_soak(tmp_path, replicas=4, seconds=float(os.environ.get("FTHSDP_SOAK_SECONDS", "240")),
                 seed=int(os.environ.get("FTHSDP_SOAK_SEED", "2")), coordinators=coordinators)
