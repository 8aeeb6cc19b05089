"""The status page's HTML: one self-contained document (inline CSS and JS, no
external assets, since the machines it runs on often have no internet) that
fetches /api/status every second and renders it with DOM calls (textContent
only, so a replica id or a reason can never inject markup)."""

PAGE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>fthsdp coordinator</title>
<style>
  :root { --ok: #1a7f37; --bad: #cf222e; --warn: #9a6700; --muted: #57606a; --line: #d0d7de; }
  body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1f2328;
         background: #f6f8fa; }
  header { background: #24292f; color: #fff; padding: 10px 20px; display: flex; gap: 16px; align-items: baseline;
           flex-wrap: wrap; }
  header h1 { font-size: 18px; margin: 0; }
  header .sub { color: #d0d7de; }
  main { padding: 16px 20px; max-width: 1400px; }
  .banner { padding: 8px 12px; border-radius: 6px; margin-bottom: 12px; }
  .banner.follower { background: #fff8c5; border: 1px solid #d4a72c; }
  .banner.error { background: #ffebe9; border: 1px solid var(--bad); }
  .banner.lost { background: var(--bad); color: #fff; font-size: 16px; font-weight: 600; }
  .banner.finished { background: #ddf4ff; border: 1px solid #54aeff; font-size: 16px; font-weight: 600; }
  .banner.lost code { font-size: 14px; background: rgba(255,255,255,.2); padding: 1px 4px; border-radius: 3px; }
  .cards { display: flex; gap: 12px; flex-wrap: wrap; margin-bottom: 12px; }
  .card { background: #fff; border: 1px solid var(--line); border-radius: 6px; padding: 8px 14px; min-width: 120px; }
  .card .label { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
  .card .value { font-size: 20px; font-weight: 600; }
  .card.mismatch { border-color: var(--bad); background: #ffebe9; }
  .card.mismatch .value { color: var(--bad); }
  .card.agree .value { color: var(--ok); }
  section { background: #fff; border: 1px solid var(--line); border-radius: 6px; margin-bottom: 14px; }
  section h2 { font-size: 15px; margin: 0; padding: 8px 12px; border-bottom: 1px solid var(--line); }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: 5px 12px; border-bottom: 1px solid #eaeef2; vertical-align: top; }
  th { color: var(--muted); font-weight: 600; font-size: 12px; }
  td.num { font-variant-numeric: tabular-nums; }
  tr.mismatch td, tr.hung td { background: #ffebe9; }
  tr.hung-reason td { border-top: 0; padding-top: 0; }
  .state { padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600; color: #fff;
           background: var(--muted); }
  .state.healthy { background: var(--ok); } .state.failed { background: var(--bad); }
  .state.catching-up, .state.joining { background: var(--warn); } .state.draining { background: #8250df; }
  .bar { display: inline-block; width: 90px; height: 8px; background: #eaeef2; border-radius: 4px;
         vertical-align: middle; margin-right: 6px; }
  .bar > span { display: block; height: 100%; background: var(--warn); border-radius: 4px; }
  .muted { color: var(--muted); }
  .bad { color: var(--bad); font-weight: 600; }
  .admin { padding: 8px 12px; display: flex; gap: 8px; align-items: center; flex-wrap: wrap; }
  button { font: inherit; padding: 2px 10px; cursor: pointer; }
  code { font-size: 12px; }
  .events { list-style: none; margin: 0; padding: 6px 12px; }
  .events li { padding: 2px 0; border-bottom: 1px solid #eaeef2; }
  .events li.fault_injected { color: var(--warn); font-weight: 600; }
</style>
</head>
<body>
<header><h1>fthsdp coordinator</h1><span class="sub" id="where"></span><span class="sub" id="updated"></span></header>
<main>
  <div id="banner"></div>
  <div class="cards" id="cards"></div>
  <div class="muted" id="decision" style="margin-bottom:12px"></div>
  <section><h2 id="replicas-title">Replicas</h2>
    <table><thead><tr><th>replica</th><th>state</th><th>member</th><th>step</th><th>phase</th><th>step time</th>
      <th>straggler</th><th>heartbeat</th><th>agent</th><th>catch-up</th><th>checksum</th><th>address</th><th></th></tr></thead>
    <tbody id="replicas"></tbody></table>
  </section>
  <section id="groups-section" hidden><h2>Replica groups of several hosts</h2>
    <table><thead><tr><th>group</th><th>round</th><th>hosts by node rank</th><th>waiting for</th></tr></thead>
    <tbody id="groups"></tbody></table><div class="admin muted" id="spares"></div></section>
  <section><h2>Quorum history</h2>
    <table><thead><tr><th>quorum</th><th>time</th><th>size</th><th>joined</th><th>left</th><th>reason</th></tr></thead>
    <tbody id="history"></tbody></table>
  </section>
  <section><h2>Recent events</h2><ul class="events" id="events"></ul></section>
  <section><h2>Admin</h2>
    <div class="admin" id="admin"><span id="admin-why" class="muted"></span>
      <label id="token-box" hidden>token <input id="token" type="password" size="28" autocomplete="off"></label>
      <span id="admin-result"></span></div>
  </section>
</main>
<script>
"use strict";
const REFRESH_MS = 1000, REPLICAS_SHOWN = 500, REPLICA_COLUMNS = 13;
const params = new URLSearchParams(location.search);
let latest = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else if (k === "text") node.textContent = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}
function replace(id, ...children) { document.getElementById(id).replaceChildren(...children); }
function mib(bytes) { return (bytes / 1048576).toFixed(bytes < 10485760 ? 1 : 0) + " MiB"; }
function ago(seconds) {
  return seconds == null ? "-" : seconds < 60 ? seconds.toFixed(1) + " s ago" : Math.round(seconds / 60) + " min ago";
}
function secs(s, digits) { return s == null ? "-" : s.toFixed(s < 10 ? digits || 2 : 1) + " s"; }
function clock(unix) { return unix ? new Date(unix * 1000).toLocaleTimeString() : "-"; }

function card(label, value, cls) {
  return el("div", {class: "card " + (cls || "")}, el("div", {class: "label", text: label}),
    el("div", {class: "value", text: value}));
}

function render(s) {
  latest = s;
  const where = document.getElementById("where");
  where.replaceChildren("job " + s.job + " · leader " + (s.leader || "none") +
    (s.epoch ? " (epoch " + s.epoch + ")" : ""));
  if (s.jobs.length > 1) {  // one coordinator can serve several jobs: a link to each
    where.append(" · jobs:");
    for (const job of s.jobs) where.append(" ", el("a", {href: "?job=" + encodeURIComponent(job), "data-job": job,
      text: job, style: "color:#fff"}));
  }
  const banners = [];
  if (s.follower) {
    const banner = el("div", {class: "banner follower"},
      "This coordinator follows " + (s.leader || "nobody yet") + ". ");
    if (s.leader_page) banner.append(el("a", {href: s.leader_page + location.search,
      text: "Open the leader's status page"}));
    banners.push(banner);
  }
  if (s.state_lost_step) {  // the job waits for an operator: the first thing on the page
    banners.push(el("div", {class: "banner lost", id: "state-lost", "data-step": s.state_lost_step},
      "STATE LOST at step " + s.state_lost_step + ": " + s.state_lost_reason +
      ". No quorum is formed until a replica holding it returns; ",
      el("code", {text: "fthsdp give-up-state --job " + s.job + " --step " + s.state_lost_step}),
      " starts over."));
  }
  if (s.finished) {  // nothing trains until an operator reopens the job
    banners.push(el("div", {class: "banner finished", id: "finished", "data-step": s.finished.step},
      "FINISHED at step " + s.finished.step + ": every member of the last quorum left finished. No quorum forms; ",
      el("code", {text: "fthsdp reopen-job --job " + s.job + " --step " + s.finished.step}), " reopens it."));
  }
  replace("banner", ...banners);
  const q = s.quorum, members = new Set(q.members), cs = s.checksums;
  const counts = Object.entries(s.counts || {}).map(([k, v]) => v + " " + k).join(", ") || "none";
  const verdict = cs.verdict === "mismatch" ? "MISMATCH" : cs.verdict === "agree" ? "agree" : "not compared yet";
  replace("cards",
    card("quorum", q.id ? "#" + q.id : "-"),
    card("members", q.members.length),
    card("quorum step", q.id ? q.step : "-"),
    card("committed step", s.committed_step || 0, s.state_lost_step ? "mismatch" : ""),
    card("replicas", counts),
    card("hang limit", secs(s.hang_limit_s, 1)),
    card("median step", secs(s.median_step_time_s)),
    el("div", {class: "card " + cs.verdict, id: "checksums", "data-verdict": cs.verdict},
      el("div", {class: "label", text: "checksums" + (cs.compared_step != null ? " @ step " + cs.compared_step : "")}),
      el("div", {class: "value", text: verdict})));
  document.getElementById("decision").textContent = s.reason ? "decision: " + s.reason : "";
  document.getElementById("replicas-title").textContent = "Replicas" +
    (s.total_replicas > s.replicas.length
      ? " (showing " + s.replicas.length + " of " + s.total_replicas + ", trouble first)" : "");

  const rows = s.replicas.flatMap(r => {
    const mismatch = cs.mismatched[r.id];
    let catchUp = "-";
    if (r.catch_up_source) {
      catchUp = el("span");
      if (r.catch_up_total_bytes) {
        const pct = Math.floor(100 * r.catch_up_bytes / r.catch_up_total_bytes);
        catchUp.append(el("span", {class: "bar"}, el("span", {style: "width:" + pct + "%"})),
          pct + "% of " + mib(r.catch_up_total_bytes) + " ");
      }
      catchUp.append("from " + r.catch_up_source);
    }
    const checksum = r.state_checksum ? r.state_checksum.slice(0, 12) + " @" + r.checksum_step : "-";
    const action = s.admin.enabled && !s.follower && r.state !== "draining" && r.state !== "failed"
      ? el("button", {"data-drain": r.id, text: "drain"}) : "";
    const agent = r.agent_state ? r.agent_state + (r.restart_count ? " (" + r.restart_count + " restarts)" : "") : "-";
    const phase = r.phase ? r.phase + " " + secs(r.phase_age_s, 1) : "-";
    const row = el("tr", {"data-replica": r.id, "data-state": r.state,
                          class: (mismatch ? "mismatch " : "") + (r.hang_reason ? "hung" : "")},
      el("td", {}, el("code", {text: r.id}), r.cordoned ? el("span", {class: "muted", text: " cordoned"}) : ""),
      el("td", {}, el("span", {class: "state " + r.state, text: r.state})),
      el("td", {text: members.has(r.id) ? "yes" : "no"}),
      el("td", {class: "num", text: r.step}),
      el("td", {"data-phase": r.phase || "", text: phase}),
      el("td", {class: "num", text: secs(r.step_time_s)}),
      el("td", {class: "num", text: r.straggler_score ? r.straggler_score.toFixed(1) + "x" : "-"}),
      el("td", {class: "num", text: ago(r.heartbeat_age_s)}),
      el("td", {text: agent}),
      el("td", {}, catchUp),
      el("td", {}, el("code", {text: checksum}),
        mismatch ? el("div", {class: "bad", text: "MISMATCH at step " + mismatch}) : ""),
      el("td", {}, el("code", {text: r.address})),
      el("td", {}, action));
    // Why it was taken out (hung, a straggler, a checksum mismatch) or given up is a sentence: a row of its own.
    const why = (cls, attr, text) => el("tr", {class: cls, [attr]: r.id},
      el("td", {colspan: REPLICA_COLUMNS, class: "bad", text: text}));
    const out = [row];
    if (r.hang_reason) out.push(why("hung hung-reason", "data-hang", "TAKEN OUT: " + r.hang_reason));
    if (r.unreachable) out.push(why("unreachable unreachable-reason", "data-unreachable",
      "KEPT OUT, WAITING: " + r.unreachable));
    if (r.mismatch_reason) out.push(why("mismatch mismatch-reason", "data-mismatch", "CHECKSUM MISMATCH" +
      (r.mismatch_strikes ? " (" + r.mismatch_strikes + " in a row after catching up)" : "") + ": " +
      r.mismatch_reason));
    if (r.agent_state === "gave-up" && r.agent_detail) out.push(why("hung gave-up", "data-gave-up",
      "GAVE UP (its agent does not restart it): " + r.agent_detail));
    return out;
  });
  replace("replicas", ...(rows.length ? rows : [el("tr", {}, el("td", {colspan: REPLICA_COLUMNS, class: "muted",
    text: s.follower ? "the leader serves the replicas" : "no replicas registered"}))]));

  // Groups of several hosts: their rendezvous rounds (fthsdp/coordinator/hosts/status.py).
  const groups = s.groups || [];
  document.getElementById("groups-section").hidden = !groups.length && !(s.spares || []).length;
  replace("groups", ...groups.map(g => el("tr", {"data-group": g.replica_id},
    el("td", {}, el("code", {text: g.replica_id})),
    el("td", {text: g.round + (g.complete ? " running" : " gathering")}),
    el("td", {text: g.hosts.map(h => (h.node_rank != null ? h.node_rank + ": " : "") + h.host_id + " (" + h.state +
      (h.state === "lost" ? " " + secs(h.lost_for_s, 0) + " ago" : "") + ")").join(", ")}),
    el("td", {class: g.complete ? "muted" : "bad", text: g.complete ? "-" : g.reason}))));
  document.getElementById("spares").textContent = "spare hosts waiting: " + ((s.spares || []).join(", ") || "none");

  replace("history", ...s.history.map(h => el("tr", {"data-quorum": h.id},
    el("td", {text: "#" + h.id}), el("td", {text: clock(h.time)}), el("td", {class: "num", text: h.size}),
    el("td", {text: h.joined.join(", ") || "-"}), el("td", {text: h.left.join(", ") || "-"}),
    el("td", {text: h.reason}))));

  // Quorum changes and injected faults (fthsdp inject), newest first.
  const events = (s.events || []).map(e => el("li",
    {class: e.kind, "data-event": e.kind, "data-event-replica": e.replica || ""},
    el("span", {class: "muted", text: clock(e.time) + "  "}), e.text));
  replace("events", ...(events.length ? events : [el("li", {class: "muted", text: "none yet"})]));

  document.getElementById("admin-why").textContent = s.admin.why;
  document.getElementById("token-box").hidden = !s.admin.enabled;
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
}

async function refresh() {
  try {
    const query = new URLSearchParams({limit: REPLICAS_SHOWN});
    if (params.get("job")) query.set("job", params.get("job"));
    const response = await fetch("/api/status?" + query, {cache: "no-store"});
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    render(body);
  } catch (e) {
    replace("banner", el("div", {class: "banner error", text: "cannot read the coordinator's status: " + e.message +
      (latest ? " (showing the last answer)" : "")}));
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

document.getElementById("token").value = sessionStorage.getItem("fthsdp-token") || "";
document.getElementById("replicas").addEventListener("click", async (event) => {
  const id = event.target.getAttribute && event.target.getAttribute("data-drain");
  if (!id || !confirm("Drain replica " + id + "? It leaves the quorum at its next step boundary.")) return;
  const token = document.getElementById("token").value.trim();
  sessionStorage.setItem("fthsdp-token", token);
  const job = params.get("job") ? "?job=" + encodeURIComponent(params.get("job")) : "";
  const response = await fetch("/api/replicas/" + encodeURIComponent(id) + "/drain" + job,
    {method: "POST", headers: token ? {Authorization: "Bearer " + token} : {}});
  const body = await response.json().catch(() => ({}));
  document.getElementById("admin-result").textContent =
    response.ok ? body.message : "refused: " + (body.error || response.status);
});
refresh();
</script>
</body>
</html>
"""
