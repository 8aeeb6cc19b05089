"""What the demo shows while it runs: a live table (rich) or plain log lines.

Both only read the ``Recorder``; the live table redraws at a fixed rate, the
plain log prints each event, and each replica's progress every few steps.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, TextIO

from fthsdp.demo.record import RankStart, Recorder, StepLine

if TYPE_CHECKING:
    from rich.live import Live

PROGRESS_EVERY = 10
"""--no-live prints a replica's step and loss every this many steps."""


class PlainLog:
    """``--no-live``: one line per event and per PROGRESS_EVERY steps of each replica."""

    def __init__(self, rec: Recorder, steps: int, out: TextIO = sys.stdout) -> None:
        self.rec = rec
        self.steps = steps
        self.out = out
        self._lock = threading.Lock()  # lines come from several threads: never two on one line

    def __enter__(self) -> PlainLog:
        self.rec.listeners.append(self._on_record)
        return self

    def __exit__(self, *exc) -> None:
        self.rec.listeners.remove(self._on_record)

    def _say(self, text: str) -> None:
        with self._lock:
            self.out.write(f"[{time.monotonic() - self.rec.started:6.1f}s] {text}\n")
            self.out.flush()

    def _on_record(self, kind: str, item) -> None:
        if kind == "event":
            self._say(item)
        elif kind == "step" and (item.step % PROGRESS_EVERY == 0 or item.step == self.steps):
            line: StepLine = item
            self._say(f"{line.replica} step {line.step:4d}  loss {line.loss:.4f}  quorum {line.quorum} "
                      f"({line.contributors} replicas)")
        elif kind == "start":
            start: RankStart = item
            self._say(f"{start.replica} training process {start.pid} {_start_text(start)}")


def _start_text(start: RankStart) -> str:
    cu = start.catch_up
    if not cu:
        return f"admitted at step {start.start_step}"
    return (f"caught up from {cu.get('source')} to step {start.start_step} "
            f"({cu.get('snapshot_bytes', 0) / 2**20:.1f} MiB snapshot of step {cu.get('snapshot_step')})")


class LiveView:
    """The live table: each replica's agent and coordinator state, step, loss,
    catch-up progress; the quorum id and members; the latest events."""

    def __init__(self, rec: Recorder, steps: int, victims: Collection[str]) -> None:
        self.rec = rec
        self.steps = steps
        self.victims = set(victims)
        """The replicas the failure hits (every one with --fail-mode kill-all), starred."""
        self._live: Live | None = None
        self._agent_states: dict[str, str] = {}

    def __enter__(self) -> LiveView:
        from rich.live import Live

        self._live = Live(get_renderable=self._render, refresh_per_second=4, redirect_stderr=False)
        self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def _render(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        snap = self.rec.snapshot()
        latest = snap["latest"]
        members = latest.members if latest else ()
        head = Text(f"fthsdp demo  {snap['elapsed']:6.1f}s   ", style="bold")
        if latest and latest.quorum_id:
            head.append(f"quorum {latest.quorum_id}: {', '.join(members)}", style="green")
        else:
            head.append("no quorum yet", style="yellow")

        table = Table(expand=False)
        for column in ("replica", "agent", "coordinator", "step", "loss", "quorum", "note"):
            table.add_column(column, justify="right" if column in ("step", "loss", "quorum") else "left")
        for replica in self.rec.replica_ids:
            view = latest.replicas.get(replica) if latest else None
            line = snap["last_steps"][replica]
            state = "member" if replica in members else (view.state if view else "-")
            style = {"member": "green", "catching-up": "yellow", "failed": "red"}.get(state, "")
            if view and view.agent_state:
                self._agent_states[replica] = view.agent_state  # a replica that left is listed no more
            agent = self._agent_states.get(replica, "-")
            if view and view.restart_count:
                agent += f" ({view.restart_count} restart{'s' if view.restart_count > 1 else ''})"
            note = ""
            if view and view.catch_up_source:
                note = f"from {view.catch_up_source}"
                if view.catch_up_total_bytes:
                    note += f" {view.catch_up_bytes / 2**20:.1f}/{view.catch_up_total_bytes / 2**20:.1f} MiB"
            if replica in snap["done"]:
                note = f"finished at step {snap['done'][replica]}"
            table.add_row(
                replica + (" *" if replica in self.victims else ""), agent, Text(state, style=style),
                # The coordinator's step runs ahead of the last printed one while a replica catches up.
                f"{max(line.step if line else 0, view.step if view else 0)}/{self.steps}",
                f"{line.loss:.4f}" if line else "-",
                str(line.quorum) if line else "-", note,
            )
        events = Text()
        for t, text in snap["events"]:
            events.append(f"{t - self.rec.started:6.1f}s  {text}\n")
        return Group(head, table, Text("* fails in this demo", style="dim"), events)
