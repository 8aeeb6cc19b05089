"""Why a replica's state diverged, and when its agent should stop trying.

Each checksum a replica reports comes with the inputs of the step that
produced that state (``StepChecksum.inputs``: the optimizer's numeric
hyperparameters per param group, fthsdp/agent/training/state/checksum.py). When the coordinator
flags a member whose checksum disagrees with the members'
(``fthsdp.coordinator.job.checksum_vote.find_diverged``), ``explain`` compares those inputs
with the members' at the same step and names what differs, e.g. "r2's lr at
step 158 was 0.00091, the members' 0.0009: ...". "At step N" means in the
step that produced the state at step N. A replica that caught up replays
the members' recorded inputs, so inputs that differ after it rejoined are
the loop's own: a learning rate computed from a counter of its own that
restarted at 0, say, where ft.step did not.

A rejoined replica whose loop diverges like this diverges again after every
catch-up. So the coordinator counts, per replica, the mismatch evictions in
a row after a catch-up (``strike``): at ``MISMATCH_LIMIT`` its verdict says
``give_up`` and the node agent ends as GAVE_UP ("gave up: <why>") instead of
restarting it again. A stretch without one resets the count (``resets``):
an agreeing checksum at least ``STRETCH_STEPS`` steps after the admission.

The count lives in the coordinator, not in the agent: the coordinator is
the one that sees both the verdicts and the stretches that agree, and it
outlives the agent (a replica rescheduled on another node comes back under
a new agent whose restart count starts at 0). It is kept in memory: a
coordinator restart forgets it, which costs at most one more catch-up.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping

MISMATCH_LIMIT = 2
"""Mismatch evictions in a row after catching up at which the agent gives up."""

STRETCH_STEPS = 100
"""An agreeing checksum this many steps past the admission resets the count."""

SHOWN = 3
"""Differing hyperparameters named in a message."""


def members_inputs(others: Mapping[str, str]) -> str:
    """The inputs most of the agreeing members reported ("" if none did)."""
    counts = Counter(v for v in others.values() if v)
    return counts.most_common(1)[0][0] if counts else ""


def _groups(text: str) -> list[dict] | None:
    try:
        groups = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        return None
    return groups


def _pair(a, b) -> tuple[str, str]:
    """Two numbers as text that tells them apart, as short as that allows."""
    for fmt in ("{:.4g}", "{:.8g}"):
        x, y = fmt.format(a), fmt.format(b)
        if x != y:
            return x, y
    return repr(a), repr(b)


def explain(replica_id: str, step: int, mine: str, theirs: str) -> str:
    """Why ``replica_id``'s state at ``step`` differs from the members':
    the step inputs that differ (``mine`` against ``theirs``, both
    ``StepChecksum.inputs``), or that they agree, or that none were sent."""
    a, b = _groups(mine), _groups(theirs)
    if a is None or b is None:
        return (f"{replica_id}'s state at step {step} differs from the members' "
                "(no step inputs were reported to compare)")
    if len(a) != len(b):
        return (f"{replica_id}'s optimizer at step {step} had {len(a)} param groups, the members' {len(b)}: "
                "the replicas do not train the same loop")
    diffs = []
    for index, (ga, gb) in enumerate(zip(a, b, strict=True)):
        for key in sorted(set(ga) | set(gb)):
            va, vb = ga.get(key), gb.get(key)
            if va != vb:
                diffs.append((index, key, va, vb))
    if not diffs:
        return (f"{replica_id}'s state at step {step} differs from the members' although the recorded inputs of "
                "that step agree (the optimizer's hyperparameters): the difference is in what is not recorded "
                "(the loop changing the model, the optimizer or unregistered state outside the update: "
                "docs/training-api.md, the replay contract) or a fault")
    parts: list[str] = []
    for index, key, va, vb in diffs[:SHOWN]:
        name = key if len(a) == 1 else f"{key} (param group {index})"
        if not parts:
            name += f" at step {step}"
        if va is None or vb is None:
            parts.append(f"{name} was {'unset' if va is None else va}, the members' {'unset' if vb is None else vb}")
        else:
            x, y = _pair(va, vb)
            parts.append(f"{name} was {x}, the members' {y}")
    more = f" and {len(diffs) - SHOWN} more" if len(diffs) > SHOWN else ""
    return (f"{replica_id}'s {'; '.join(parts)}{more}: the loop's own state differs from ft.step "
            "(after a catch-up the replica replays the members' inputs, so the loop sets these from something "
            "that restarted with the process: derive them from ft.step, or register it with Manager(state=...))")


def strike(strikes: int, caught_up: bool) -> tuple[int, bool]:
    """The count after a mismatch eviction, and whether the agent gives up.
    Only an incarnation that caught up counts: a member diverging on its own
    (a silent fault) restarts and catches up as after any failure."""
    if not caught_up:
        return strikes, False
    strikes += 1
    return strikes, strikes >= MISMATCH_LIMIT


def gave_up(reason: str, strikes: int) -> str:
    return (f"{reason}; taken out for a checksum mismatch {strikes} times in a row after catching up, so it is "
            "not restarted again (another catch-up would diverge the same way)")


def resets(admitted_step: int, agreed_steps) -> bool:
    """Whether a stretch without a mismatch ended the count: a checksum that
    agreed with another member's at least STRETCH_STEPS past the admission."""
    return any(s >= admitted_step + STRETCH_STEPS for s in agreed_steps)
