"""The coordinator's HTTP routes (``--metrics-port``): metrics, status page, JSON API, drain.

``GET /``                              the status page (fthsdp/coordinator/serving/status_page.py), refreshing itself
``GET /api/status[?job=J&limit=N]``    the page's data as JSON (read-only)
``GET /metrics``                       Prometheus metrics (fthsdp/coordinator/engine/metrics.py)
``POST /api/replicas/ID/drain[?job=J]`` ask replica ID to leave the quorum at its next step boundary

Reading is open, like the gRPC health service: a status page must work for
whoever can reach the port. Changing anything needs ``Authorization: Bearer
TOKEN`` with the token of ``--admin-token-file`` if the coordinator has one,
else the one of ``--token-file`` (fthsdp/core/auth.py); without either the
admin actions are off altogether, because an open POST on a port that a
browser can reach could be triggered by any web page the operator visits (a
bearer header cannot be forged cross-site, a form post can).
"""

from __future__ import annotations

import hmac
import json
import re
import time
from collections.abc import Iterable

from fthsdp.coordinator.config import CoordinatorConfig
from fthsdp.coordinator.decisions.status_view import injection_line, status_dict
from fthsdp.coordinator.engine.runtime import CoordinatorRuntime
from fthsdp.coordinator.serving.http_server import Request, Response
from fthsdp.coordinator.serving.progress_view import progress_view
from fthsdp.coordinator.serving.status_page import PAGE
from fthsdp.core.credentials import read_token_file
from fthsdp.core.errors import FthsdpError, InvalidRequest, NotFound, NotLeader, StoreError
from fthsdp.core.names import split_host_port
from fthsdp.protos.v1 import coordinator_pb2 as pb

DRAIN_PATH = re.compile(r"^/api/replicas/([^/]+)/drain$")
HISTORY_SHOWN = 50
"""Newest quorum changes in /api/status (the runtime keeps more)."""
EVENTS_SHOWN = 30
"""Newest events (quorum changes and injected faults) in /api/status's ``events``."""
JSON = "application/json"


def _json(status: int, value: object, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, (json.dumps(value) + "\n").encode(), JSON, headers)


def _error(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return _json(status, {"error": message}, headers)


def checksum_summary(replicas: list[dict]) -> dict:
    """Whether the replicas' states agree: 'mismatch' when the coordinator
    flagged a replica or two replicas report different checksums for the same
    step, 'agree' when at least two report the same step and none differ,
    'unknown' when no two reports can be compared yet."""
    flagged = {r["id"]: r["checksum_mismatch_step"] for r in replicas if r.get("checksum_mismatch_step")}
    by_step: dict[int, dict[str, list[str]]] = {}
    for r in replicas:
        if r.get("state_checksum"):
            by_step.setdefault(r["checksum_step"], {}).setdefault(r["state_checksum"], []).append(r["id"])
    comparable = {step: sums for step, sums in by_step.items() if sum(len(ids) for ids in sums.values()) >= 2}
    differing = {step: sums for step, sums in comparable.items() if len(sums) > 1}
    for step, sums in differing.items():
        majority = max(sums.values(), key=len)
        for ids in sums.values():
            if ids is not majority:
                for rid in ids:
                    flagged.setdefault(rid, step)
    compared = max(comparable, default=None)
    if flagged:
        verdict = "mismatch"
    elif compared is None:
        verdict = "unknown"
    else:
        verdict = "agree"
    return {"verdict": verdict, "compared_step": compared, "mismatched": dict(sorted(flagged.items()))}


def history_view(history: Iterable[dict], limit: int = HISTORY_SHOWN, cache: dict | None = None) -> list[dict]:
    """The newest ``limit`` quorum changes, newest first, each with who joined
    and who left since the quorum before it (unknown for the oldest one kept,
    unless it is the job's first).

    With 10,000 members a comparison costs about a millisecond, so ``cache``
    (a dict the caller keeps between calls) holds the ones already made; on
    return it holds only those still shown, so it stays small.
    """
    entries = list(history)
    shown: dict[tuple, dict] = {}
    for i in range(len(entries) - 1, max(0, len(entries) - limit) - 1, -1):
        entry, previous = entries[i], entries[i - 1] if i else None
        key = (entry["id"], entry["time"], previous["id"] if previous else None)
        view = cache.get(key) if cache is not None else None
        shown[key] = view or _change(entry, previous)
    if cache is not None:
        cache.clear()
        cache.update(shown)
    return list(shown.values())


def _change(entry: dict, previous: dict | None) -> dict:
    now = set(entry["members"])
    before = set(previous["members"]) if previous else set()
    known = previous is not None or entry["id"] == 1
    return {
        "id": entry["id"], "time": entry["time"], "reason": entry["reason"], "size": len(now),
        "joined": sorted(now - before) if known else [], "left": sorted(before - now),
    }


def recent_events(history: list[dict], injections: list[dict], limit: int = EVENTS_SHOWN) -> list[dict]:
    """The page's "recent events": quorum changes (``history_view``'s) and
    injected faults (``status_dict``'s), newest first, each with a sentence."""
    events = [{"time": h["time"], "kind": "quorum_change", "quorum_id": h["id"], "replica": None,
               "text": f"quorum #{h['id']}, {h['size']} members" + _moves(h) + f": {h['reason']}"} for h in history]
    events += [{"time": i["time"], "kind": "fault_injected", "quorum_id": None, "replica": i["replica"],
                "text": injection_line(i)} for i in injections]
    events.sort(key=lambda e: e["time"], reverse=True)  # stable: equal times keep quorum changes first
    return events[:limit]


def _moves(h: dict) -> str:
    moved = [f"{sign}{', '.join(ids)}" for sign, ids in (("+", h["joined"]), ("-", h["left"])) if ids]
    return f" ({'; '.join(moved)})" if moved else ""


def _trouble_first(replicas: list[dict], limit: int | None) -> list[dict]:
    """Replicas that need attention first, then by id; at most ``limit``."""
    ordered = sorted(replicas, key=lambda r: (r["state"] == "healthy", r["id"]))
    return ordered if limit is None else ordered[:limit]


class WebApp:
    def __init__(self, runtime: CoordinatorRuntime, config: CoordinatorConfig, token: str) -> None:
        self.runtime = runtime
        self.config = config
        # An admin token, where there is one, is the only one that may act (fthsdp/core/auth.py).
        self._admin_token = read_token_file(config.admin_token_file, "--admin-token-file")
        self._expected = f"Bearer {self._admin_token or token}".encode() if self._admin_token or token else b""
        self._history_views: dict[str, dict] = {}

    async def handle(self, request: Request) -> Response:
        path = request.path
        drain = DRAIN_PATH.match(path)
        if drain:
            if request.method != "POST":
                return _error(405, "drain is a POST", (("Allow", "POST"),))
            return await self._drain(request, drain.group(1))
        if path not in ("/", "/index.html", "/api/status", "/metrics"):
            return _error(404, "see / (status page), /api/status, /metrics")
        if request.method not in ("GET", "HEAD"):
            return _error(405, "read-only: only GET", (("Allow", "GET, HEAD"),))
        if path == "/metrics":
            return Response(200, self.runtime.metrics.render().encode(), "text/plain; version=0.0.4; charset=utf-8")
        if path == "/api/status":
            return await self._status(request)
        return Response(200, PAGE.encode(), "text/html; charset=utf-8",
                        (("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; "
                          "style-src 'unsafe-inline'"),))

    # ----- read ----------------------------------------------------------------------

    def _job_name(self, request: Request) -> str:
        name = request.query.get("job", "")
        return name or min(self.runtime.jobs)

    async def _status(self, request: Request) -> Response:
        limit_text = request.query.get("limit", "")
        if limit_text and not limit_text.isdigit():
            return _error(400, f"limit must be a non-negative integer, got {limit_text!r}")
        limit = int(limit_text) if limit_text else None
        name = self._job_name(request)
        try:
            if not self.runtime.leading:
                return _json(200, await self._follower_view(name))
            return _json(200, self._leader_view(name, limit))
        except (InvalidRequest, NotLeader, StoreError) as e:
            return _error(_http_status(e), str(e))

    def _leader_view(self, name: str, limit: int | None) -> dict:
        status = self.runtime.status(pb.StatusRequest(job=name))
        view = progress_view(status, status_dict(status))
        replicas = view["replicas"]
        counts: dict[str, int] = {}
        for r in replicas:
            counts[r["state"]] = counts.get(r["state"], 0) + 1
        view.update(
            jobs=list(status.jobs), leading=True, follower=False, leader_page=None, now=time.time(),
            counts=counts, total_replicas=len(replicas), replicas=_trouble_first(replicas, limit),
            checksums=checksum_summary(replicas),
            history=history_view(self.runtime.jobs[status.job].history,
                                 cache=self._history_views.setdefault(status.job, {})),
            admin=self._admin_state(),
        )
        view["events"] = recent_events(view["history"], view["injections"])
        return view

    async def _follower_view(self, name: str) -> dict:
        status = await self.runtime.follower_status(pb.StatusRequest(job=name))
        view = progress_view(status, status_dict(status))
        view.update(
            jobs=list(status.jobs), leading=False, follower=True, leader_page=self._leader_page(status.leader),
            now=time.time(), counts={}, total_replicas=0, checksums=checksum_summary([]), history=[], events=[],
            admin=self._admin_state(),
        )
        return view

    def _leader_page(self, leader: str) -> str | None:
        """The leader's status page, assuming it serves HTTP on the same port
        as this coordinator (coordinators of one deployment share their flags);
        unknown with --metrics-port 0, where each picks its own port."""
        if not leader or self.config.metrics_port <= 0:
            return None
        try:
            host, _ = split_host_port(leader)
        except ValueError:
            return None
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.config.metrics_port}/"

    def _admin_state(self) -> dict:
        if self._admin_token:
            return {"enabled": True, "why": "needs the coordinator's admin token (--admin-token-file)"}
        if self._expected:
            return {"enabled": True, "why": "needs the coordinator's bearer token (--token-file)"}
        return {"enabled": False,
                "why": "admin actions are off: the coordinator runs without --token-file or --admin-token-file"}

    # ----- admin ---------------------------------------------------------------------

    async def _drain(self, request: Request, replica_id: str) -> Response:
        refused = self._refuse(request)
        if refused is not None:
            return refused
        name = self._job_name(request)
        try:
            await self.runtime.set_flags(name, replica_id, drain=True)
        except FthsdpError as e:
            return _error(_http_status(e), str(e))
        return _json(200, {"job": name, "replica": replica_id, "drain": True,
                           "message": f"replica {replica_id} will leave the quorum at its next step boundary"})

    def _refuse(self, request: Request) -> Response | None:
        """The answer to an admin request that may not act, or None if it may."""
        if not self._expected:
            return _error(403, "admin actions are disabled: start the coordinator with --token-file or "
                          "--admin-token-file to enable them")
        given = request.headers.get("authorization", "")
        if not given:
            return _error(401, "missing bearer token (Authorization: Bearer TOKEN)", (("WWW-Authenticate", "Bearer"),))
        if not hmac.compare_digest(given.encode(), self._expected):
            return _error(401, "wrong bearer token", (("WWW-Authenticate", 'Bearer error="invalid_token"'),))
        return None


def _http_status(error: FthsdpError) -> int:
    if isinstance(error, NotFound):
        return 404
    if isinstance(error, InvalidRequest):
        return 400
    if isinstance(error, (NotLeader, StoreError)):
        return 503
    return 500
