"""Warm standby ranks: a restart without the process start-up.

Restarting a replica costs mostly start-up: launching Python, ``import
torch`` (seconds on a small machine) and building the model, against well
under a second for the catch-up itself (torchft 0.2.0 measured here: 6.4-8 s
of its 7.5-8.2 s restart). With ``fthsdp agent --standby`` the agent starts
the rank command once more ahead of need, with the environment of the next
restart plus ``FTHSDP_STANDBY_FD``: that process runs the training script up
to ``Manager.from_env`` (torch imported, model and optimizer built) and waits
there, reading the descriptor. When a rank fails, the agent writes one line to
it and the standby carries on as the restarted rank at once, then the agent
starts the next standby. If the agent goes away or retires the standby, the
descriptor reaches end-of-file and the standby exits 0 without having
touched the job.

What the training script does before ``Manager.from_env`` runs in the
standby too, ahead of time (and a second copy of the model occupies memory,
on the GPU for a GPU model): hence opt-in.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

ENV = "FTHSDP_STANDBY_FD"
GO = b"go\n"


def wait_for_activation(env: Mapping[str, str], environ: MutableMapping[str, str] | None = None) -> None:
    """In a standby process, block until the agent activates it; otherwise
    return at once. A standby that is retired exits here with status 0."""
    fd_text = env.get(ENV)
    if not fd_text:
        return
    try:
        fd = int(fd_text)
        data = b""
        while not data.endswith(b"\n"):
            chunk = os.read(fd, 64)
            if not chunk:
                break
            data += chunk
        os.close(fd)
    except (ValueError, OSError):
        data = b""
    if data != GO:
        sys.stdout.flush()
        os._exit(0)  # retired (or the agent died): leave without a trace
    target = os.environ if environ is None else environ
    target.pop(ENV, None)  # children of the rank are not standbys
