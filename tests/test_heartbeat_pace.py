"""The heartbeat interval stretched to the coordinator's budget (pure, injected clock)."""

from __future__ import annotations

import pytest

from fthsdp.coordinator.decisions.heartbeat_pace import HeartbeatPacer, Pace


@pytest.mark.parametrize(
    "senders, budget, expected",
    [
        (100, 5000, Pace(1.0, 5.0)),  # under budget: as configured
        (5000, 5000, Pace(1.0, 5.0)),
        (10000, 5000, Pace(2.0, 10.0)),  # twice the budget: half the rate, timeout in proportion
        (25000, 5000, Pace(5.0, 25.0)),
        (10001, 5000, Pace(2.25, 11.25)),  # in quarter steps of the configured interval
        (11250, 5000, Pace(2.25, 11.25)),
        (10000, 0, Pace(1.0, 5.0)),  # no budget: no limit
    ],
)
def test_interval_fits_the_budget(senders, budget, expected):
    assert HeartbeatPacer(1.0, 5.0, budget).update(senders, now=0.0) == expected


def test_shrinking_keeps_the_old_timeout_for_one_old_interval():
    pacer = HeartbeatPacer(1.0, 5.0, 1000)
    assert pacer.update(4000, now=0.0) == Pace(4.0, 20.0)
    # Most replicas left: the interval shrinks at once, but a replica told
    # "every 4 s" may stay silent up to 4 s more before it hears of it.
    assert pacer.update(1000, now=10.0) == Pace(1.0, 20.0)
    assert pacer.update(1000, now=13.9) == Pace(1.0, 20.0)
    assert pacer.update(1000, now=14.0) == Pace(1.0, 5.0)


def test_growing_takes_the_longer_timeout_at_once():
    pacer = HeartbeatPacer(1.0, 5.0, 1000)
    pacer.update(1000, now=0.0)
    assert pacer.update(3000, now=1.0) == Pace(3.0, 15.0)


def test_the_interval_moves_in_steps_and_steps_down_with_room_to_spare():
    """Every change is pushed to every replica: replicas arriving or leaving
    one by one must not change it each time."""
    pacer = HeartbeatPacer(1.0, 5.0, 1000)
    told = {pacer.update(n, now=0.0).interval for n in range(1000, 4001)}
    assert told == {1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75, 4.0}
    assert pacer.update(3990, now=1.0).interval == 4.0  # needs 3.99 s: 3.75 s would not do
    assert pacer.update(3400, now=2.0).interval == 4.0  # 3.4 s needed: above 0.9 of 3.75, held
    assert pacer.update(3375, now=3.0).interval == 3.75  # 0.9 of 3.75: room to spare
