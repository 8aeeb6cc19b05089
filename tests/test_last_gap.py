"""A joiner's last gap (fthsdp/agent/training/catchup/last_gap.py), in-process on fakes.

What FTAR asks of a joiner inside its first step (close the gap, read the
members' inputs, replay to their step) is answered from the catch-up
source's log; a source lost meanwhile is replaced by the next one the
coordinator names, and only a joiner left with no source has lost the state.
"""

from __future__ import annotations

import pytest

from fthsdp.agent.training.catchup.client import CatchUpError
from fthsdp.agent.training.catchup.last_gap import MAX_SOURCES, LastGap
from fthsdp.core.errors import FtarError, StateNotHeld
from fthsdp.protos.v1 import catchup_pb2 as cpb


class Source:
    """A catch-up source's log of steps 0..``head`` - 1; lost once a joiner asks past ``lost_at``."""

    def __init__(self, name: str, head: int, lost_at: int | None = None, inputs_at: int | None = None) -> None:
        self.name, self.head, self.lost_at = name, head, lost_at
        self.inputs_at = head if inputs_at is None else inputs_at

    def check(self, step: int) -> None:
        if self.lost_at is not None and step >= self.lost_at:
            raise CatchUpError(f"{self.name} lost")

    def log(self, step: int, wait: float = 0.0, max_bytes: int = 0):
        self.check(step)
        return [(cpb.LogEntry(step=step, hyperparams_json=f'{{"from":"{self.name}"}}'), None)], self.head, True

    def inputs(self) -> cpb.LogEntry:
        self.check(self.inputs_at)
        return cpb.LogEntry(step=self.inputs_at, hyperparams_json=f'{{"from":"{self.name}"}}')


class State:
    def __init__(self) -> None:
        self.inputs: list[cpb.LogEntry] = []

    def apply_inputs(self, entry: cpb.LogEntry) -> None:
        self.inputs.append(entry)


class Replayer:
    """Replays one step per log entry, from whichever source it is given."""

    def __init__(self, step: int) -> None:
        self.step, self.state, self.sources = step, State(), []

    def replay_until(self, client: Source, target: int, timeout: float) -> None:
        while self.step < target:
            client.log(self.step)
            self.sources.append(client.name)
            self.step += 1

    def replay_available(self, client: Source) -> None:
        if self.step < client.head:
            client.log(self.step)
            self.step += 1


class Served:
    def __init__(self) -> None:
        self.published: list[int] = []

    def publish_inputs(self, entry: cpb.LogEntry) -> None:
        self.published.append(entry.step)


def gap(step: int, *sources: Source | None) -> tuple[LastGap, Replayer, Served]:
    """A joiner at ``step``, on the first source; each switch names the next (None: none comes)."""
    replayer, served = Replayer(step), Served()
    return LastGap(replayer, served, 5.0, "r2", sources=Sources(sources), moved=lambda: None), replayer, served  # type: ignore[arg-type]


class Sources:
    """The coordinator names the next source each time one is lost (None: none comes)."""

    def __init__(self, sources) -> None:
        self.queue = list(sources)
        self.current = self.queue.pop(0)

    def gap_client(self):
        return self.current

    def switch_source(self):
        self.current = self.queue.pop(0) if self.queue else None
        return self.current


def test_closing_the_gap_replays_to_the_step_before_the_members_and_takes_its_inputs():
    last, replayer, served = gap(5, Source("r0", head=8))
    assert last.close_gap(5, 8) == 7
    assert replayer.step == 7 and replayer.sources == ["r0", "r0"]
    assert [e.step for e in replayer.state.inputs] == [7] and served.published == [7]
    assert last.taken is not None and last.taken.step == 7


def test_a_source_lost_while_closing_the_gap_is_replaced_by_the_next():
    last, replayer, _ = gap(5, Source("r0", head=8, lost_at=6), Source("r1", head=8))
    assert last.close_gap(5, 8) == 7
    assert replayer.sources == ["r0", "r1"], "went on from the next source where the first was lost"
    assert '"r1"' in replayer.state.inputs[-1].hyperparams_json


def test_a_joiner_left_with_no_source_has_lost_the_state():
    last, replayer, _ = gap(5, Source("r0", head=8, lost_at=6), None)
    with pytest.raises(StateNotHeld, match=r"replica r2 \(at step 6\) lost its catch-up source before it reached "
                                           r"the members' step 8"):
        last.close_gap(5, 8)


def test_sources_lost_one_after_another_are_tried_a_bounded_number_of_times():
    lost = [Source(f"r{i}", head=8, lost_at=5) for i in range(MAX_SOURCES + 1)]
    last, _, _ = gap(5, *lost)
    with pytest.raises(StateNotHeld):
        last.close_gap(5, 8)


def test_the_members_step_is_entered_with_their_inputs_after_the_replay_to_it():
    last, replayer, served = gap(3, Source("r0", head=6))
    last.enter_step(6)
    assert replayer.step == 3 and not replayer.state.inputs, "nothing moves before the members' all-reduce runs"
    assert last.replay_to(6) == 6
    assert [e.step for e in replayer.state.inputs] == [6] and served.published == [6]


def test_a_source_that_stopped_before_the_members_step_is_replaced():
    last, _, _ = gap(3, Source("r0", head=5, inputs_at=5), Source("r1", head=6))
    last.enter_step(6)
    assert last.replay_to(6) == 6
    assert '"r1"' in last.taken.hyperparams_json


@pytest.mark.parametrize("call, says", [
    (lambda last: last.enter_step(6), "ahead of the quorum's 6"),  # a source past the members' step
    (lambda last: last.replay_to(2), "at step 3, ahead of the quorum's 2"),
])
def test_a_joiner_ahead_of_the_members_is_an_error(call, says):
    last, _, _ = gap(3, Source("r0", head=9, inputs_at=7))
    with pytest.raises(FtarError, match=says):
        call(last)


def test_a_joiner_without_a_source_cannot_close_a_gap():
    last, _, _ = gap(3, None)
    with pytest.raises(FtarError, match="has no catch-up source"):
        last.close_gap(3, 6)


def test_closing_a_gap_from_another_step_than_the_states_is_an_internal_error():
    last, _, _ = gap(3, Source("r0", head=6))
    with pytest.raises(FtarError, match="internal"):
        last.close_gap(4, 6)


def test_waiting_for_the_members_follows_the_log_one_step_at_a_time():
    last, replayer, _ = gap(3, Source("r0", head=5))
    last.while_waiting()
    assert replayer.step == 4
    last.while_waiting()
    last.while_waiting()  # nothing more committed: nothing moves
    assert replayer.step == 5


def test_waiting_with_a_lost_source_goes_on_waiting():
    last, replayer, _ = gap(3, Source("r0", head=5, lost_at=3))
    last.while_waiting()  # the loss shows when FTAR next asks for the gap
    assert replayer.step == 3
