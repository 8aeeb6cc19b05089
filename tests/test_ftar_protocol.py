"""FTAR's way out of a split step, forced deterministically (see the worker)."""

from __future__ import annotations

import json
import subprocess
import sys

from fthsdp.testing.local_etcd import free_port
from tests.harness.processes import ROOT, _env


def test_replica_behind_commits_the_sum_the_others_committed():
    port = free_port()
    procs = [
        subprocess.Popen([sys.executable, "-m", "tests.ftar_protocol_worker", str(r), str(port)],
                         cwd=ROOT, env=_env(), stdout=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    r0, r1 = (json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1]) for p in procs)
    # r1 did not finish step 4 itself: it takes r0's sum, with r0's count of contributors
    assert r1["step4"] == [[7.0] * 4, 3, 1]
    # then both do step 5 together
    assert r0["step5"] == r1["step5"] == [[3.0] * 4, 2, 2]
