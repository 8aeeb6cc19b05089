"""A replica's standing outlives its incarnations; ``register`` makes a fresh
incarnation (fthsdp/coordinator/job/replica_entry.py).

Table-driven from the dataclasses' own fields, so that a field added to
either part later is covered without touching this test: what it must do
across a re-registration follows from the part it is in.
"""

from __future__ import annotations

import dataclasses

import pytest

from fthsdp.coordinator.decisions.quorum_types import Rules
from fthsdp.coordinator.job.replica_entry import Incarnation, ReplicaEntry, Standing
from fthsdp.coordinator.job.state import JobState

REQUEST = dict(address="h:1", world_size=2, step=0, quorum_id=0, now=10.0, catch_up_addresses=("h:1:9",),
               restart_count=3, wait_for_replicas=2, agent_ids=("agent",), incarnation="key-2",
               catch_up_fingerprints=("fp",))
"""The registration compared: a replica's second one, and another's first."""

FIRST = {**REQUEST, "now": 1.0, "restart_count": 2, "incarnation": "key-1", "address": "h:0"}
"""The replica's registration before it."""


def _stale(value):
    """A value unlike ``value`` (what the field holds now), to tell whether it is carried over."""
    match value:
        case bool():
            return not value
        case int() | float():
            return value + 7
        case str():
            return value + "-stale"
        case tuple():
            return (*value, 7)
        case dict():
            return {**value, 7: "stale"}
        case set():
            return {*value, 7}
        case None:
            return 7.0
    raise AssertionError(f"no stale value for {value!r}: add one to _stale")


def _reregistered(part: str, name: str):
    """Replica "a" registered, ``part.name`` set to a stale value, then
    registered again; "b" registered for the first time with the same
    request. Returns a's entry, b's, and the stale value."""
    job = JobState("j", Rules(min_replicas=1))
    job.register("a", **FIRST)
    before = getattr(job.replicas["a"], part)
    stale = _stale(getattr(before, name))
    setattr(before, name, stale)
    job.register("a", **REQUEST)
    job.register("b", **REQUEST)
    return job.replicas["a"], job.replicas["b"], stale


def test_an_entry_is_its_standing_and_its_incarnation():
    """Anything kept of a replica is in one of the two parts, and so in one of the tables below."""
    assert [f.name for f in dataclasses.fields(ReplicaEntry)] == ["replica_id", "incarnation", "standing"]


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(Incarnation)])
def test_a_registration_starts_each_incarnation_field_afresh(name):
    a, b, stale = _reregistered("incarnation", name)
    got = getattr(a.incarnation, name)
    assert got != stale
    if name == "session_id":
        assert got is not None and b.incarnation.session_id is not None  # a new session, of its own
    else:
        assert got == getattr(b.incarnation, name)  # as if registered for the first time


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(Standing)])
def test_each_standing_field_survives_a_registration(name):
    a, b, stale = _reregistered("standing", name)
    assert getattr(a.standing, name) == stale
    assert getattr(b.standing, name) == getattr(Standing(), name)  # seen for the first time: a fresh standing


def test_a_registration_replaces_the_incarnation_whole():
    """Nothing of the old incarnation is shared with the new one (its checksums, its ranks' pings)."""
    job = JobState("j", Rules(min_replicas=1))
    job.register("a", **FIRST)
    old = job.replicas["a"].incarnation
    job.register("a", **REQUEST)
    new = job.replicas["a"].incarnation
    assert new is not old
    assert all(getattr(new, f.name) is not getattr(old, f.name) for f in dataclasses.fields(Incarnation)
               if isinstance(getattr(old, f.name), dict | set))
