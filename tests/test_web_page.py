"""The coordinator's status page as a browser shows it: rendered by a
headless Chromium (Debian's `chromium`, installed by `make etcd`), from a
real coordinator with simulated-replica processes or a runtime in this
process. The JSON API behind it: tests/test_web.py."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import struct
from html.parser import HTMLParser
from pathlib import Path

from fthsdp.coordinator.serving.http_server import Request, Response
from fthsdp.coordinator.serving.web import WebApp
from tests.harness.processes import CoordinatorProcess, ReplicaProcess
from tests.harness.runtimes import hung_runtime
from tests.harness.waiting import wait_until
from tests.harness.web import FAST, chromium, dump_dom, members, page_url, run_chromium, states, status, steps

# ----- a real coordinator -----------------------------------------------------------







class _Rows(HTMLParser):
    """Replica rows, the checksums card and the history rows of a dumped DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.replicas: dict[str, dict[str, str]] = {}
        self.checksums = ""
        self.quorums: list[str] = []
        self.drain_buttons: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and "data-replica" in a:
            self.replicas[a["data-replica"]] = a
        if a.get("id") == "checksums":
            self.checksums = a.get("data-verdict", "")
        if tag == "tr" and "data-quorum" in a:
            self.quorums.append(a["data-quorum"])
        if tag == "button" and "data-drain" in a:
            self.drain_buttons.append(a["data-drain"])


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_the_page_renders_replicas_quorum_and_a_checksum_mismatch(tmp_path, processes, token_file):
    binary = chromium()
    c = processes(CoordinatorProcess(tmp_path, *FAST, "--token-file", token_file).start())
    base = page_url(c)
    for i, checksum in enumerate(("aaaa1111", "aaaa1111", "bbbb2222")):  # r2's state differs
        processes(ReplicaProcess(tmp_path, c.address, f"r{i}", "--step-period", "0.05", "--checksum", checksum,
                                 "--token-file", token_file).start())
    wait_until(lambda: status(base)["checksums"]["mismatched"].get("r2") and members(status(base)) == ["r0", "r1"],
               30, message="r2 flagged for its checksum and out of the quorum")
    before = status(base)

    dom = run_chromium(binary, tmp_path / "profile", "--dump-dom", base).stdout
    after = status(base)
    rows = _Rows()
    rows.feed(dom)
    assert sorted(rows.replicas) == ["r0", "r1", "r2"], dom[-2000:]
    for rid, attrs in rows.replicas.items():
        assert attrs["data-state"] in {states(before)[rid], states(after)[rid]}, (rid, attrs)
    assert rows.replicas["r0"]["data-state"] == "healthy"
    assert "mismatch" in rows.replicas["r2"].get("class", "") and "mismatch" not in rows.replicas["r0"].get("class", "")
    assert rows.checksums == "mismatch"
    assert rows.quorums and rows.quorums[0] in {str(before["history"][0]["id"]), str(after["history"][0]["id"])}
    assert {"r0", "r1"} <= set(rows.drain_buttons)  # admin is on: the coordinator has a token
    assert f"#{after['quorum']['id']}" in dom and "MISMATCH at step" in dom

    shot = tmp_path / "status-page.png"
    run_chromium(binary, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,900", base)
    assert shot.exists() and png_size(shot) == (1280, 900)
    assert shot.stat().st_size > 20_000, "an almost empty screenshot: the page did not render"
    if os.environ.get("FTHSDP_SCREENSHOT_DIR"):
        target = Path(os.environ["FTHSDP_SCREENSHOT_DIR"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, target / shot.name)


def test_the_page_shows_a_lost_state_first(tmp_path, processes):
    binary = chromium()
    # join-timeout 0: a killed replica closes its stream, which the split-brain guard would wait out.
    c = processes(CoordinatorProcess(tmp_path, *FAST, "--join-timeout", "0s").start())
    base = page_url(c)
    r0 = processes(ReplicaProcess(tmp_path, c.address, "r0", "--step-period", "0.01").start())
    wait_until(lambda: status(base)["committed_step"] >= 5, 20, message="r0 trained a few steps")
    r0.kill()
    processes(ReplicaProcess(tmp_path, c.address, "r0").start())  # a fresh process, at step 0
    wait_until(lambda: status(base)["state_lost_step"] and steps(status(base)) == {"r0": 0}, 20,
               message="the state lost, the fresh r0 registered")
    lost = status(base)
    assert lost["state_lost_reason"] == "no live replica holds it; r0 at step 0"

    dom = run_chromium(binary, tmp_path / "profile", "--dump-dom", base).stdout
    banner = _Banner()
    banner.feed(dom)
    assert banner.step == str(lost["state_lost_step"]), dom[-3000:]
    assert f"STATE LOST at step {lost['state_lost_step']}: no live replica holds it; r0 at step 0" in dom
    assert f"fthsdp give-up-state --job default --step {lost['state_lost_step']}" in dom


class _Banner(HTMLParser):
    """The step of the lost-state banner in a dumped DOM, if there is one."""

    def __init__(self) -> None:
        super().__init__()
        self.step = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id") == "state-lost":
            self.step = a.get("data-step", "")


# ----- a runtime in this process: hangs, a finished job, a replica given up -------------

class _Progress(HTMLParser):
    """Per replica of a dumped DOM: its phase cell and the taken-out row under it."""

    def __init__(self) -> None:
        super().__init__()
        self.row_class: dict[str, str] = {}
        self.phases: dict[str, str] = {}
        self.taken_out: dict[str, str] = {}
        self.cards: dict[str, str] = {}
        """The cards' values by label."""
        self._replica = self._label = ""
        self._text: dict | None = None
        self._card = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and "data-replica" in a:
            self._replica = a["data-replica"]
            self.row_class[self._replica] = a.get("class", "")
        if tag == "td" and "data-phase" in a:
            self.phases[self._replica] = a["data-phase"]
        if tag == "tr" and "data-hang" in a:
            self._text = self.taken_out
            self._replica = a["data-hang"]
        if tag == "div" and a.get("class") in ("label", "value"):
            self._card = a["class"]

    def handle_endtag(self, tag):
        if tag == "tr":
            self._text = None
        if tag == "div":
            self._card = ""

    def handle_data(self, data):
        if self._text is not None:
            self._text[self._replica] = self._text.get(self._replica, "") + data
        if self._card == "label":
            self._label = data
        elif self._card == "value":
            self.cards[self._label] = data


def test_the_page_shows_phases_the_hang_limit_and_why_a_replica_was_taken_out(tmp_path):
    runtime = hung_runtime()
    dom = dump_dom(WebApp(runtime, runtime.config, "").handle, tmp_path / "profile")
    page = _Progress()
    page.feed(dom)
    assert page.phases == {"r0": "all-reduce", "r1": "all-reduce", "r2": "computing"}, dom[-3000:]
    assert "hung" in page.row_class["r2"] and "hung" not in page.row_class["r0"]
    assert page.taken_out["r2"].startswith("TAKEN OUT: hung: no progress at step 7 (computing for 6.1s)")
    assert set(page.taken_out) == {"r2"}
    assert (page.cards["hang limit"], page.cards["median step"]) == ("2.0 s", "0.20 s")
    assert "3.5x" in dom and "computing 6.1 s" in dom


class _Verdicts(HTMLParser):
    """The page's banners and the reason rows under the replicas, by id."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[tuple[str, str], str] = {}
        self.finished = ""
        self._at: tuple[str, str] | None = None
        self._in_finished = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for attr in ("data-mismatch", "data-gave-up"):
            if tag == "tr" and attr in a:
                self._at = (attr, a[attr])
        if tag == "div" and a.get("id") == "finished":
            self._in_finished = True

    def handle_endtag(self, tag):
        if tag == "tr":
            self._at = None
        if tag == "div":
            self._in_finished = False

    def handle_data(self, data):
        if self._at is not None:
            self.rows[self._at] = self.rows.get(self._at, "") + data
        if self._in_finished:
            self.finished += data


def test_the_page_shows_a_finished_job_and_why_a_replica_was_given_up(tmp_path):
    """The status JSON of a real runtime, with what a finished job and a
    replica given up after two mismatches add: a banner naming the reopen
    command, and the reasons in rows of their own."""
    runtime = hung_runtime()
    app = WebApp(runtime, runtime.config, "")
    status = json.loads(asyncio.run(app.handle(Request("GET", "/api/status", {}, {}))).body)
    status["finished"] = {"step": 500, "time": 0.0, "quorum_id": 6}
    r2 = next(r for r in status["replicas"] if r["id"] == "r2")
    r2.update(agent_state="gave-up", agent_detail="gave up: r2's lr at step 160 was 0.0009, the members' 0.0002",
              mismatch_reason="r2's lr at step 160 was 0.0009, the members' 0.0002", mismatch_strikes=2)

    async def handle(request: Request):
        if request.path == "/api/status":
            return Response(200, json.dumps(status).encode(), "application/json")
        return await app.handle(request)

    page = _Verdicts()
    page.feed(dump_dom(handle, tmp_path / "profile"))
    assert page.finished.startswith("FINISHED at step 500")
    assert "fthsdp reopen-job --job default --step 500" in page.finished
    assert page.rows[("data-mismatch", "r2")] == (
        "CHECKSUM MISMATCH (2 in a row after catching up): r2's lr at step 160 was 0.0009, the members' 0.0002")
    assert page.rows[("data-gave-up", "r2")].startswith("GAVE UP (its agent does not restart it): gave up: r2's lr")
    assert {rid for _, rid in page.rows} == {"r2"}
