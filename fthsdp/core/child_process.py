"""Children that die with their parent (the agent's ranks, the demo's
processes, a test's etcd)."""

from __future__ import annotations

import shutil
import sys


def die_with_parent_prefix() -> list[str]:
    """A command prefix making the kernel SIGKILL the child when its parent
    dies, even by SIGKILL, so that a killed agent, demo or test run leaves no
    stray rank or etcd behind.

    Deliberately not a preexec_fn calling prctl(): a preexec_fn makes Python
    fork() instead of vfork(), which runs gRPC's pthread_atfork handlers, and
    those deadlock once gRPC has threads running (seen here: the test process
    hung inside fork()). Linux ties the signal to the *thread* that started
    the child, so start servers from the main thread (fixtures do).
    """
    if not sys.platform.startswith("linux"):
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL"] if setpriv else []
