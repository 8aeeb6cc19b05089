"""A replica without a model: membership only, with a simulated step counter.

It goes through the lifecycle a real replica does as far as the coordinator
can see: register, train (its step advances every ``--step-period`` while it
is a member), catch up from the source the coordinator names (it adopts the
source's step after ``--catch-up-time``, then says it is ready), drain. The
demo and the integration tests run it as a real OS process; it never touches
tensors, so it says nothing about training itself (that is the agent's job).

Each event from the coordinator is printed as one JSON line with the arrival
time on CLOCK_MONOTONIC (shared by every process on the machine), so a parent
process can measure push latency.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

from fthsdp.agent.training.session.membership import Membership
from fthsdp.agent.training.step.clock import StepClock
from fthsdp.core.credentials import read_token_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fthsdp.testing.simulated_replica",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", required=True, help="ADDR[,ADDR]")
    parser.add_argument("--job", default="")
    parser.add_argument("--replica-id", required=True)
    parser.add_argument("--address", default="127.0.0.1:1", help="advertised HOST:PORT (nothing listens on it)")
    parser.add_argument("--step", type=int, default=0, help="step of the state it starts with")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--step-period", type=float, default=0.0, help="seconds per simulated step; 0: never step")
    parser.add_argument("--catch-up-time", type=float, default=0.5, help="seconds a simulated catch-up takes")
    parser.add_argument("--token-file", default="", help="file holding the coordinator's bearer token")
    parser.add_argument("--checksum", default="", help="state checksum to report at every step it trains "
                        "(give one replica another value to simulate a diverged state); empty: none")
    args = parser.parse_args(argv)

    # progress in every heartbeat, as a real replica reports it (fthsdp/coordinator/decisions/hang.py)
    clock = StepClock()
    m = Membership(args.coordinator.split(","), args.job, args.replica_id, args.address, args.world_size, args.step,
                   token=read_token_file(args.token_file), member_list=True,  # it prints the members
                   progress=clock.progress)
    reporting = m.reporting
    printing = threading.Lock()
    changed = threading.Event()

    def on_event(event) -> None:
        members = [x.replica_id for x in event.quorum.members]
        if event.HasField("place"):
            # A real replica switches at its next step boundary; this one at once.
            reporting.publish(training_quorum_id=event.quorum.id, ready=False)
        line = {
            "t": time.monotonic(),
            "quorum_id": event.quorum.id,
            "members": members,
            "rank": event.place.rank if event.HasField("place") else None,
            "catch_up": event.catch_up.source_replica_id,
            "source_step": event.catch_up.source_step,
            "drain": event.drain_requested,
            "reason": event.reason,
        }
        with printing:
            print(json.dumps(line), flush=True)
        changed.set()

    m.add_listener(on_event)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    m.start()
    with printing:
        print(json.dumps({"registered": args.replica_id}), flush=True)

    catch_up_started: float | None = None
    while not stop.is_set():
        changed.clear()
        event = m.latest
        member = m.is_member()
        if event is not None and event.drain_requested and not member:
            break  # drained: the quorum no longer includes us
        if member and args.step_period > 0:
            step = m.report.step + 1
            reporting.publish(step=step)
            clock.begin(step)
            clock.arrive(step)  # no compute: it waits in the "all-reduce" until its next step
            if args.checksum:  # the last few steps, as a real replica reports them
                reporting.publish(recent_checksums={s: args.checksum for s in range(max(1, step - 7), step + 1)},
                                  state_checksum=args.checksum, checksum_step=step)
        elif event is not None and event.catch_up.source_replica_id and not m.report.ready:
            catch_up_started = catch_up_started or time.monotonic()
            if time.monotonic() - catch_up_started >= args.catch_up_time:
                reporting.publish(step=max(m.report.step, event.catch_up.source_step), ready=True)
                catch_up_started = None
        if member and args.step_period > 0:
            stop.wait(args.step_period)
        else:
            changed.wait(0.05)
    m.leave("drained" if (m.latest and m.latest.drain_requested) else "finished")
    return 0


if __name__ == "__main__":
    sys.exit(main())
