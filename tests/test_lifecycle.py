"""A replica's lifecycle (fthsdp/agent/training/session/lifecycle.py) and the outcome
its agent reads (fthsdp/agent/outcome.py): pure logic."""

from __future__ import annotations

import threading

import pytest

from fthsdp.agent import outcome
from fthsdp.agent.training.session.lifecycle import TRANSITIONS, Ending, Lifecycle, LifeStage, ending_for_eviction


@pytest.mark.parametrize("drain_requested, ending", [(True, Ending.DRAINED), (False, Ending.EVICTED)])
def test_an_eviction_is_a_drain_exactly_when_one_was_asked_for(drain_requested, ending):
    assert ending_for_eviction(drain_requested) is ending


@pytest.mark.parametrize("ending, success", [
    (Ending.FINISHED, True), (Ending.DRAINED, True), (Ending.JOB_FINISHED, True),
    (Ending.EVICTED, False), (Ending.FAILED, False),
])
def test_which_endings_exit_0(ending, success):
    assert ending.success is success


def test_every_stage_reaches_stopped_and_stopped_is_final():
    assert all(LifeStage.STOPPED in TRANSITIONS[s] for s in (LifeStage.STARTING, LifeStage.TRAINING))
    assert TRANSITIONS[LifeStage.STOPPED] == frozenset()


def test_the_first_ending_stands():
    life = Lifecycle()
    life.joined()
    assert life.stop(Ending.DRAINED, "drained after step 7")
    assert not life.stop(Ending.FINISHED)  # the script's close() after its drain
    assert (life.stage, life.ending, life.detail) == (LifeStage.STOPPED, Ending.DRAINED, "drained after step 7")


def test_a_replica_may_stop_before_it_ever_trained():
    life = Lifecycle()
    assert life.stop(Ending.JOB_FINISHED, "job default finished at step 500")
    assert life.stopped
    with pytest.raises(RuntimeError, match="not allowed"):
        life.joined()


def test_a_drain_asked_from_another_thread_is_seen_and_names_who_asked_first():
    life = Lifecycle()
    asker = threading.Thread(target=life.request_drain, args=("SIGTERM",))
    asker.start()
    asker.join()
    life.request_drain("the coordinator")
    assert life.drain_requested and life.drain_event.is_set() and life.drain_asked_by == "SIGTERM"
    assert life.stage is LifeStage.STARTING  # asking moves nothing: the training thread does


def test_the_outcome_file_round_trips(tmp_path):
    path = tmp_path / "rank0-restart0.json"
    outcome.write(str(path), "drained", "the quorum went on without it")
    assert outcome.read(path) == outcome.Outcome("drained", "the quorum went on without it")
    assert outcome.read(tmp_path / "missing.json") is None
    (tmp_path / "bad.json").write_text("{not json")
    assert outcome.read(tmp_path / "bad.json") is None
    outcome.write("", "drained", "")  # no file asked for: nothing written, nothing raised


@pytest.mark.parametrize("found, left", [
    (outcome.Outcome("drained", "the quorum went on without it"), True),
    (outcome.Outcome("drained"), True),
    (outcome.Outcome("evicted", "taken out"), False),  # taken out: it should come back and catch up
    (outcome.Outcome("failed"), False),
    (outcome.Outcome("finished"), False),  # its own end: a crash after it is still a crash
    (None, False),  # wrote nothing: it did not leave
])
def test_only_a_drained_rank_left_for_good(found, left):
    assert outcome.left_for_good(found) is left


@pytest.mark.parametrize("outcomes, words", [
    ([outcome.Outcome("drained", "x"), outcome.Outcome("drained", "y")], "drained"),
    ([outcome.Outcome("finished"), outcome.Outcome("drained", "the quorum went on without it")], "drained"),
    ([outcome.Outcome("job finished", "job default finished at step 500")], "job default finished at step 500"),
    ([outcome.Outcome("finished")], "finished"),
    ([None, None], ""),
])
def test_the_agent_names_the_groups_ending(outcomes, words):
    assert outcome.describe(outcomes) == words
