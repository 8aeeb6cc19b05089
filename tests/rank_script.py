"""A stand-in rank for the agent tests: plain Python, no torch.

    python tests/rank_script.py OUT_DIR PLAN

Writes its launch environment as JSON to OUT_DIR/env-rank{RANK}-restart{N}.json
(after its SIGTERM handler is installed, so a test that sees the file may
signal it), then follows PLAN:

  exit0      exit 0 at once
  wait       wait for SIGTERM, write sigterm-rank{RANK}-restart{N}, exit 0
  fail       exit 3, always
  fail-once  exit 3 on the first start (restart count 0), exit 0 after
  kill1      first start: local rank 1 SIGKILLs itself once every rank of the
             group has written its file, the others wait as in 'wait';
             later starts: exit 0
  left-abort ENDING  write the outcome ENDING (fthsdp/agent/outcome.py, as a
             replica that left writes it), then abort (SIGABRT), as a native
             thread taking the GIL in the interpreter's teardown makes a
             process do; later starts: exit 0. With "wait" as a third word,
             first wait for SIGTERM (the agent's drain)

With "register" as the last word, each start first registers its replica
with the coordinator (FTHSDP_COORDINATOR) as a training process does, with
its agent's id (FTHSDP_AGENT_ID): the agent's reports about it then count.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fthsdp.agent import outcome  # noqa: E402  (plain Python: no torch)

CONTRACT = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT",
    "FTHSDP_COORDINATOR",
    "FTHSDP_JOB",
    "FTHSDP_REPLICA_ID",
    "FTHSDP_REPLICA_RANK",
    "FTHSDP_NUM_REPLICAS",
    "FTHSDP_RESTART_COUNT",
)
DEADLINE = 30.0  # never outlive a broken test by much


def main() -> int:
    out, plan = Path(sys.argv[1]), sys.argv[2]
    rank = os.environ["RANK"]
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    got_sigterm = []
    signal.signal(signal.SIGTERM, lambda signum, frame: got_sigterm.append(signum))

    env = {key: os.environ.get(key) for key in CONTRACT}
    env["pid"] = os.getpid()
    env["pgid"] = os.getpgid(0)
    tmp = out / f".env-rank{rank}-restart{restart}.tmp"
    tmp.write_text(json.dumps(env))
    tmp.rename(out / f"env-rank{rank}-restart{restart}.json")  # atomic: readers never see half a file

    if sys.argv[-1] == "register":
        register()
    if plan == "exit0" or (plan in ("fail-once", "kill1", "left-abort") and restart > 0):
        return 0
    if plan in ("fail", "fail-once"):
        return 3
    if plan == "kill1" and os.environ["LOCAL_RANK"] == "1":
        world = int(os.environ["WORLD_SIZE"])
        wait_for(lambda: all((out / f"env-rank{r}-restart{restart}.json").exists() for r in range(world)))
        os.kill(os.getpid(), signal.SIGKILL)
    if plan in ("wait", "kill1"):
        wait_for(lambda: got_sigterm)
        (out / f"sigterm-rank{rank}-restart{restart}").write_text("")
        return 0
    if plan == "left-abort":
        if sys.argv[4:] == ["wait"]:
            wait_for(lambda: got_sigterm)
        outcome.write(os.environ[outcome.ENV], sys.argv[3], "the quorum went on without it")
        os.abort()
    print(f"rank_script: unknown plan {plan!r}", file=sys.stderr)
    return 2


def register() -> None:
    from fthsdp.client import CoordinatorClient
    from fthsdp.protos.v1 import coordinator_pb2 as pb

    with CoordinatorClient(os.environ["FTHSDP_COORDINATOR"].split(",")) as client:
        client.call("Register", pb.RegisterRequest(
            job=os.environ["FTHSDP_JOB"], replica_id=os.environ["FTHSDP_REPLICA_ID"], address="127.0.0.1:1",
            world_size=1, restart_count=int(os.environ["FTHSDP_RESTART_COUNT"]),
            agent_ids=[os.environ.get("FTHSDP_AGENT_ID", "")]))


def wait_for(predicate) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        if time.monotonic() > deadline:
            sys.exit(f"rank_script: gave up waiting after {DEADLINE}s")
        time.sleep(0.01)


if __name__ == "__main__":
    sys.exit(main())
