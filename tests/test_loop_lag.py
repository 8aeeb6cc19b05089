"""The coordinator's event-loop lag: the worst over a window, and what it adds to the heartbeat timeout (pure)."""

from __future__ import annotations

import asyncio

import pytest

from fthsdp.coordinator.engine.loop_lag import LagWindow, backlog, lag_allowance, probe


@pytest.mark.parametrize(
    "samples, now, expected",
    [
        ([], 0.0, 0.0),  # nothing seen: no lag
        ([(0.0, 0.01), (1.0, 0.02)], 1.0, 0.02),
        ([(0.0, 1.5), (1.0, 0.02), (2.0, 0.3)], 2.0, 1.5),  # the worst, not the latest
        ([(0.0, 1.5), (1.0, 0.02), (2.0, 0.3)], 10.5, 0.3),  # the 1.5 s stall left the 10 s window
        ([(0.0, 1.5), (1.0, 0.02), (2.0, 0.3)], 12.5, 0.0),  # everything left it
        ([(0.0, -0.001)], 0.0, 0.0),  # woken early (clock granularity): no lag
    ],
)
def test_worst_lag_in_the_window(samples, now, expected):
    window = LagWindow(10.0)
    for t, lag in samples:
        window.record(t, lag)
    assert window.worst(now) == expected


def test_a_smaller_later_lag_survives_the_larger_one_expiring():
    window = LagWindow(5.0)
    window.record(0.0, 2.0)
    window.record(3.0, 1.0)
    window.record(4.0, 0.5)
    assert window.worst(4.0) == 2.0
    assert window.worst(5.5) == 1.0  # the 2.0 at t=0 expired; the 1.0 at t=3 had been kept
    assert window.worst(8.5) == 0.5


@pytest.mark.parametrize(
    "worst, allowance",
    [(0.0, 0.0), (0.2, 0.0), (0.25, 0.25), (0.26, 0.5), (1.23, 1.25), (4.0, 4.0)],
)
def test_allowance_moves_in_steps(worst, allowance):
    assert lag_allowance(worst) == allowance


def test_a_window_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        LagWindow(0)


def test_probe_sees_a_blocked_loop():
    """A callback that holds the loop for 0.3 s shows up as at least that much lag."""
    window = LagWindow(60.0)

    async def main() -> float:
        task = asyncio.create_task(probe(window))
        await asyncio.sleep(0.12)  # the probe is asleep, waiting on the loop
        busy_until = asyncio.get_running_loop().time() + 0.3
        while asyncio.get_running_loop().time() < busy_until:
            pass  # the loop is blocked: nothing else runs
        deadline = asyncio.get_running_loop().time() + 5
        while window.worst(asyncio.get_running_loop().time()) < 0.2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        task.cancel()
        return window.worst(asyncio.get_running_loop().time())

    assert asyncio.run(main()) >= 0.2


@pytest.mark.parametrize(
    "ages, interval, expected",
    [
        ([0.5] * 20, 1.0, 0.0),  # everyone heard of within the interval: no backlog
        ([0.2, 0.9] * 10, 1.0, 0.0),
        ([6.0] * 20, 1.0, 5.0),  # everyone five seconds late: the coordinator's own delay
        ([0.5] * 19 + [30.0], 1.0, 0.0),  # one replica silent: its silence is its own
        ([0.5] * 11 + [30.0] * 9, 1.0, 0.0),  # nine of twenty silent: still theirs (the lower median)
        ([0.5] * 3 + [30.0] * 3, 1.0, 0.0),  # too few replicas to tell
        ([], 1.0, 0.0),
    ],
)
def test_backlog_is_the_typical_replica_lateness(ages, interval, expected):
    assert backlog(ages, interval) == expected


@pytest.mark.parametrize(
    "records, now, expected",
    [
        ([], 9.0, 0.0),  # nothing probes yet (a runtime not started, a fake clock): no lag
        ([(0.0, 0.0)], 0.04, 0.0),  # the prober is due in 0.05 s: not late
        ([(0.0, 0.0)], 5.05, 5.0),  # no record for 5.05 s: a stall, still going or just over
        ([(0.0, 0.0), (5.05, 5.0)], 5.1, 5.0),  # the prober caught up and recorded the stall itself
        ([(0.0, 2.0), (0.5, 0.0)], 1.0, 2.0),  # an earlier, larger lag still in the window
    ],
)
def test_a_prober_that_has_not_run_is_lag(records, now, expected):
    window = LagWindow(10.0, every=0.05)
    for t, lag in records:
        window.record(t, lag)
    assert window.worst(now) == pytest.approx(expected)


def test_a_window_without_a_period_counts_only_what_was_recorded():
    window = LagWindow(10.0)
    window.record(0.0, 0.0)
    assert window.worst(5.0) == 0.0
