"""Watching replica processes train, catch up, hang and fail: what the
coordinator says of them, and the checks that their states agree step by step."""

from __future__ import annotations

from tests.harness.waiting import wait_until


def status_of(client, replica_id: str):
    status = client.status()
    replica = {r.replica_id: r for r in status.replicas}.get(replica_id)
    return status, replica


def members(client) -> set[str]:
    return {m.replica_id for m in client.status().quorum.members}


def assert_same_state_after_rejoin(joiner, peer, min_steps: int = 20) -> None:
    """The joiner's state checksum equals the peer's at every common step after it rejoined."""
    first = joiner.read_until(lambda line: "step" in line)["step"]
    joiner.read_until(lambda line: line.get("step", 0) >= first + min_steps)
    peer.read_until(lambda line: line.get("step", 0) >= first + min_steps)
    steps = [s for s in range(first, first + min_steps) if s in peer.steps and s in joiner.steps]
    assert len(steps) >= min_steps // 2, f"too few common steps: {steps}"
    for s in steps:
        assert joiner.steps[s]["checksum"] == peer.steps[s]["checksum"], f"{joiner.replica_id} differs at step {s}"


SLOW = {"FTHSDP_CATCH_UP_MAX_RATE": str(2 << 20)}  # 6 MB of state: a transfer of about 3 s


def wait_transfer_started(client, replica_id: str) -> str:
    """Wait until the joiner reports snapshot bytes received; return its source."""
    found = []

    def started() -> bool:
        _, r = status_of(client, replica_id)
        if r is not None and r.catch_up_bytes > 0 and r.catch_up_source:
            found.append(r.catch_up_source)
            return True
        return False

    wait_until(started, 30, interval=0.01, message=f"{replica_id}'s snapshot transfer under way")
    return found[0]


def assert_one_state_per_step(*workers) -> None:
    """Every step printed by several replicas (or incarnations) has one checksum."""
    seen: dict[int, dict[str, str]] = {}
    for w in workers:
        for step, line in w.steps.items():
            if line.get("checksum"):
                seen.setdefault(step, {})[w.log_path.name] = line["checksum"]
    split = {s: c for s, c in seen.items() if len(set(c.values())) > 1}
    assert not split, f"steps committed with different states: {dict(list(split.items())[:3])}"


HANG_FLOOR = 3.0


TIGHT = ("--hang-floor", f"{HANG_FLOOR:g}s", "--hang-multiple", "3")


LONG_FTAR = {"FTHSDP_FTAR_TIMEOUT": "60"}  # far beyond the verdict: the survivors must not need it


def train_on_and_stop(groups, more=5):
    last = groups[0].read_until(lambda line: "step" in line)["step"]
    for g in groups:
        g.read_until(lambda line: line.get("step", 0) >= last + more, timeout=60)
    for g in groups:
        g.stop()
        g.collect_after_exit()
    assert_one_state_per_step(*groups)
    steps = sorted(groups[0].steps)  # the first never failed: it committed every step
    assert steps == list(range(steps[0], steps[-1] + 1)), "a committed step is missing"
