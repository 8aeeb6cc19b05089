"""Ranks that exited non-zero after leaving the job for good: no failure, said once.

A rank writes its outcome last (fthsdp/agent/outcome.py), once the
coordinator knows it left and its groups are let go. One whose outcome says
it left for good (drained) changes nothing the job holds when it then dies,
in the script's tail or in the interpreter's teardown: its agent neither
counts that exit as a failure nor restarts the rank, and says what it saw,
in a WARNING at the exit and in the SUCCEEDED detail.
"""

from __future__ import annotations

import logging

from fthsdp.agent import outcome
from fthsdp.agent.node.launch import Rank, describe_exit

log = logging.getLogger("fthsdp.agent")


class LateExits:
    """The local ranks of one start that exited non-zero after leaving for good, with their exit codes."""

    def __init__(self) -> None:
        self._codes: dict[int, int] = {}

    def reset(self) -> None:
        """A new start of the ranks: nothing seen yet."""
        self._codes = {}

    def __contains__(self, local_rank: int) -> bool:
        return local_rank in self._codes

    def after_leaving(self, rank: Rank, code: int, outcome_path: str) -> bool:
        """Whether ``rank``, which exited with ``code`` (not 0), had left the
        job for good first (``outcome.left_for_good``); said once per rank."""
        if rank.local_rank in self._codes:
            return True
        found = outcome.read(outcome_path)
        if found is None or not outcome.left_for_good(found):
            return False
        self._codes[rank.local_rank] = code
        log.warning("local rank %d (pid %d) exited with %s after it had left the job (%s): not a failure, "
                    "not restarted", rank.local_rank, rank.pid, describe_exit(code), found.ending)
        return True

    def how_ranks_ended(self, ended: str) -> str:
        """The SUCCEEDED detail: "every local rank exited 0 (drained)", or,
        where some exited otherwise after leaving, what they exited with."""
        if not self._codes:
            return "every local rank exited 0" + (f" ({ended})" if ended else "")
        late = ", ".join(f"local rank {r} then exited with {describe_exit(c)}" for r, c in sorted(self._codes.items()))
        return f"every local rank left ({ended or 'drained'}); {late}"
