"""A replica's membership, run as a real OS process by the integration tests.

It registers, heartbeats and watches through agent.membership exactly as an
agent does, adopts each quorum that includes it (as a training replica would
at its next step boundary), and prints every event it receives as one JSON
line with the monotonic time of arrival (CLOCK_MONOTONIC is shared by every
process on the machine, so the test can measure push latency).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

from agent.membership import Membership


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--job", default="")
    parser.add_argument("--replica-id", required=True)
    parser.add_argument("--address", default="127.0.0.1:1")
    parser.add_argument("--step", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    args = parser.parse_args()

    membership = Membership(
        args.coordinator.split(","), args.job, args.replica_id, args.address, args.world_size, args.step
    )
    lock = threading.Lock()

    def on_event(event) -> None:
        members = [m.replica_id for m in event.quorum.members]
        if args.replica_id in members:
            membership.training_quorum_id = event.quorum.id
        line = {
            "t": time.monotonic(),
            "quorum_id": event.quorum.id,
            "members": members,
            "catch_up": event.catch_up.source_replica_id,
            "drain": event.drain_requested,
            "reason": event.reason,
        }
        with lock:
            print(json.dumps(line), flush=True)

    membership.on_event = on_event
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    membership.start()
    print(json.dumps({"registered": args.replica_id}), flush=True)
    done.wait()
    membership.leave("finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
