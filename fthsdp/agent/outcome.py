"""How a training process ended, told to its node agent.

An exit code says success or failure; it cannot say *which* success: a
replica drained by `fthsdp drain` (the coordinator's request, which the
agent never saw), one whose script finished, one that arrived after its job
had finished. So each rank writes one small JSON file as it stops, at the
path its agent put in ``FTHSDP_OUTCOME_FILE`` (as torchelastic's agent reads
``TORCHELASTIC_ERROR_FILE``), and the agent names the ending in its
SUCCEEDED transition: ``succeeded (drained)``. Plain JSON, never pickle.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

ENV = "FTHSDP_OUTCOME_FILE"
MAX_BYTES = 4096

log = logging.getLogger("fthsdp.agent.outcome")


@dataclasses.dataclass(frozen=True)
class Outcome:
    ending: str
    """An ``fthsdp.agent.training.session.lifecycle.Ending`` value: finished, drained, job finished, evicted, failed."""
    detail: str = ""


def write(path: str, ending: str, detail: str) -> None:
    """Write the outcome where the agent reads it (atomically; a failure is
    logged, never raised: the process is on its way out)."""
    if not path:
        return
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    try:
        tmp.write_text(json.dumps({"ending": ending, "detail": detail[:1000]}))
        os.replace(tmp, target)
    except OSError as e:
        log.warning("could not write the outcome for the agent to %s: %s", path, e)


def read(path: str | Path) -> Outcome | None:
    """The outcome a rank wrote, or None (it wrote none, or not one we can read)."""
    try:
        raw = Path(path).read_bytes()[:MAX_BYTES]
        obj = json.loads(raw)
        return Outcome(str(obj["ending"]), str(obj.get("detail", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def left_for_good(found: Outcome | None) -> bool:
    """Whether a rank that wrote ``found`` had left its job for good before
    it exited: drained, so its replica must not come back whatever its exit
    code says. The rank writes its outcome last, once the coordinator knows it
    left and its groups are let go; a crash after that, in the script's tail
    or in the interpreter's teardown (a native thread taking the GIL while
    Python finalizes aborts the process), changes nothing the job holds."""
    return found is not None and found.ending == "drained"


def describe(outcomes: Sequence[Outcome | None]) -> str:
    """The words for a group whose every rank exited 0: the ending they
    agree on ("drained"; "job finished at step 500"), or "" when they wrote none."""
    endings = [o for o in outcomes if o is not None]
    for name in ("drained", "job finished"):
        found = next((o for o in endings if o.ending == name), None)
        if found is not None:
            return found.detail if name == "job finished" and found.detail else name
    return endings[0].ending if endings else ""
