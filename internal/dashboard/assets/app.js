// Sluice rack slot dashboard. Live over server-sent events read with fetch
// (EventSource cannot send an Authorization header); no framework, nothing
// loaded from elsewhere.
"use strict";

const $ = (sel, el = document) => el.querySelector(sel);
const num = (v) => Number(v || 0); // protojson writes int64 as strings

const state = {
  token: sessionStorage.getItem("sluice-token") || "",
  canAct: false,
  domains: new Map(), // id → panel elements
  rows: [],           // the last snapshot's tenant rows
  sortKey: null,      // client-side sort of the rows shown
  sortDir: "desc",
  abort: null,
};

function headers(extra) {
  const h = Object.assign({}, extra);
  if (state.token) h["Authorization"] = "Bearer " + state.token;
  return h;
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

// ---- formatting -----------------------------------------------------------

function si(v, unit) {
  const units = ["", "k", "M", "G", "T", "P", "E"];
  let i = 0;
  while (Math.abs(v) >= 1000 && i < units.length - 1) { v /= 1000; i++; }
  return (v >= 100 || i === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + units[i] + unit;
}
function bytes(v) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return v.toFixed(v >= 100 || i === 0 ? 0 : 1) + " " + units[i];
}
function rate(v) { return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2); }
function pct(v) { return (v * 100).toFixed(0) + "%"; }
// utc renders a time as HH:MM:SS UTC: every time on the page is UTC, as the
// logs, the alerts and sluicectl are. timeEl puts it in a <time> element
// that holds the whole instant.
function utc(t) { return new Date(t).toISOString().slice(11, 19) + " UTC"; }
function timeEl(t) {
  const iso = new Date(t).toISOString();
  return el("time", { datetime: iso, title: iso, text: utc(t) });
}
// seconds renders a latency.
function seconds(v) {
  if (v >= 1) return v.toFixed(v >= 10 ? 0 : 2) + " s";
  if (v >= 1e-3) return (v * 1e3).toFixed(v >= 1e-2 ? 0 : 1) + " ms";
  return (v * 1e6).toFixed(0) + " µs";
}
// reasons renders refusal reasons and their rates.
function reasons(rs) {
  const out = [];
  for (const r of rs || []) {
    if (out.length) out.push(", ");
    out.push(el("span", { class: "reason", "data-reason": r.reason }, r.reason + " ", el("b", { text: rate(r.perSecond) + "/s" })));
  }
  return out;
}
// shortRevision is a VCS revision cut to 12 characters, as git abbreviates.
function shortRevision(r) {
  const m = /^([0-9a-f]{12})[0-9a-f]*(-modified)?$/.exec(r || "");
  return m ? m[1] + (m[2] ? " (modified)" : "") : r || "unknown";
}

function usd(micros) { return "$" + (micros / 1e6).toLocaleString(undefined, { maximumFractionDigits: 2 }); }
function level(v) { return v >= 0.95 ? "full" : v >= 0.8 ? "high" : "ok"; }

// ---- the domains ----------------------------------------------------------

function slot(g) {
  const s = el("div", {
    class: "slot", "data-gpu": g.slot, "data-health": g.healthy ? "healthy" : "unhealthy",
    "data-nvlink": g.nvlinkState, text: String(g.index),
  });
  s.title = [g.slot, g.name, g.uuid, "NVLinks: " + g.activeNvlinks + " (" + g.nvlinkState + ")",
    g.healthy ? "healthy" : "unhealthy" + (g.problem ? ": " + g.problem : "")].filter(Boolean).join("\n");
  return s;
}

function meter(label) {
  const bar = el("i");
  const value = el("span", { text: "–" });
  return { row: [el("span", { text: label }), el("div", { class: "meter" }, bar), value], bar, value };
}

function drawTopology(topo) {
  const root = $("#domains");
  root.replaceChildren();
  state.domains.clear();
  for (const d of topo.domains) {
    const panel = el("article", { class: "domain", "data-domain": d.id, "data-shape": d.shape, "data-kind": d.kind });
    const title = el("div", { class: "title" },
      el("b", { text: d.id }), el("span", { class: "kind", text: d.kind + (d.gpuModel ? " · " + d.gpuModel : "") }),
      el("span", { class: "badge", text: "DRAINING" }));
    const mark = el("div", { class: "drain-mark" });
    const prefill = meter("prefill"), decode = meter("decode"), kv = meter("KV");
    const meters = el("div", { class: "meters" }, ...prefill.row, ...decode.row, ...kv.row);
    const facts = el("div", { class: "facts" });
    const reason = el("input", { placeholder: "drain reason", maxlength: "1024" });
    const drain = el("button", { "data-action": "drain", text: "Drain" });
    const undrain = el("button", { "data-action": "undrain", text: "Undrain" });
    drain.addEventListener("click", () => act(d.id, "drain", reason.value));
    undrain.addEventListener("click", () => act(d.id, "undrain", ""));
    const actions = el("div", { class: "actions" }, reason, drain, undrain);
    actions.hidden = !state.canAct;

    let shape;
    if (d.shape === "rack") {
      shape = el("div", { class: "rack" });
      d.nodes.forEach((n, i) => {
        // A GB200 NVL72 has its NVSwitch trays between compute trays 10 and 11.
        if (d.nodes.length === 18 && i === 10) shape.append(el("div", { class: "switches", text: "NVSwitch trays" }));
        shape.append(el("div", { class: "tray", "data-node": n.name }, el("span", { class: "name", text: n.name }), ...n.gpus.map(slot)));
      });
    } else {
      shape = el("div", { class: "board" });
      for (const n of d.nodes) for (const g of n.gpus) shape.append(slot(g));
    }
    panel.append(title, mark, meters, facts, actions, shape);
    root.append(panel);
    state.domains.set(d.id, { panel, mark, prefill, decode, kv, facts, actions, drain, undrain });
  }
}

function setMeter(m, v, text) {
  m.bar.style.width = pct(v);
  m.bar.dataset.level = level(v);
  m.value.textContent = text || pct(v);
}

function fact(label, value) {
  return el("span", {}, label + " ", el("b", { text: value }));
}

function updateDomains(snap) {
  for (const v of snap.domains) {
    const d = v.domain;
    const p = state.domains.get(d.id);
    if (!p) continue; // a topology event brings it
    p.panel.dataset.draining = d.draining ? "true" : "false";
    p.panel.dataset.feedback = feedbackState(d);
    const mark = [];
    if (d.draining) {
      mark.push(d.drainReason || "drained");
      if (v.drainedBy) mark.push(" — by " + v.drainedBy, ...(v.drainedAt ? [" at ", timeEl(v.drainedAt)] : []));
    }
    p.mark.replaceChildren(...mark);
    setMeter(p.prefill, v.prefillUse);
    setMeter(p.decode, v.decodeUse);
    setMeter(p.kv, v.kvUse);
    p.prefill.row[0].title = "soft capacity " + si(num(d.prefillRate), "FLOP/s");
    p.decode.row[0].title = "soft capacity " + si(num(d.decodeRate), "B/s");
    p.kv.row[0].title = bytes(num(d.kvInUse)) + " of " + bytes(num(d.kvLimit));
    p.facts.replaceChildren(
      fact("leases", String(num(d.inFlight))),
      fact("health", Number(d.healthWeight).toFixed(2)),
      fact("prefill", si(num(d.prefillRate), "FLOP/s")),
      fact("decode", si(num(d.decodeRate), "B/s")),
      fact("KV", bytes(num(d.kvInUse)) + " / " + bytes(num(d.kvLimit))),
      fact("capacity", d.draining ? "drained: no new placements" : v.warmup ? "warming " + Math.round(100 * v.warmup.fraction) + "% (" + Math.round(v.warmup.leftSeconds) + "s left)" : "full"),
      fact("feedback", feedbackText(d)),
    );
    p.actions.hidden = !state.canAct;
    p.drain.disabled = d.draining;
    p.undrain.disabled = !d.draining;
  }
}

// feedbackState is what the capacity loop does with a domain, for its
// panel's border: "saturated" (its engines are past a threshold: only
// floor traffic is placed), "cut" (its capacity below the model's), "".
function feedbackState(d) {
  if (d.engineSaturated) return "saturated";
  if (d.capacityFactor && d.capacityFactor < 1) return "cut";
  return "";
}

// feedbackText is the capacity loop's fact: the correction of the model
// and what the engines last said.
function feedbackText(d) {
  const f = d.capacityFactor ? Number(d.capacityFactor) : 1;
  let s = f === 1 ? "model" : f.toFixed(2) + "× the model";
  if (d.engineMetricsStale) s += ", engines stale";
  else if (d.engineMetricsAge) s += ", engines " + (d.engineSaturated ? "SATURATED " : "") + "(" + Math.round(num(d.engineQueue || 0)) + " waiting, KV " + Math.round(100 * (d.engineKvUsage || 0)) + "%)";
  if (d.floorsShort) s += ", FLOORS SHORT";
  return s;
}

async function act(domain, what, reason) {
  try {
    const resp = await fetch("/api/v1/domains/" + encodeURIComponent(domain) + "/" + what, {
      method: "POST", headers: headers({ "Content-Type": "application/json" }),
      body: what === "drain" ? JSON.stringify({ reason }) : "{}",
    });
    if (!resp.ok) {
      const body = await resp.json().catch(() => ({ message: resp.statusText }));
      showError(what + " " + domain + ": " + body.message);
    }
  } catch (e) {
    showError(what + " " + domain + ": " + e);
  }
}

// ---- the tenants ----------------------------------------------------------

function rowValues(r) {
  const t = r.tenant;
  const floor = num(t.floorTokens);
  return {
    name: t.name, tier: t.tier, weight: num(t.weight),
    admitted: r.admittedPerSecond, degraded: r.degradedPerSecond, refused: r.refusedPerSecond,
    reasonList: r.refusalReasons || [], reasons: (r.refusalReasons || []).length ? r.refusalReasons[0].perSecond : 0,
    queued: num(t.queued), inFlight: num(t.inFlight),
    achieved: r.achievedTokensPerSecond, floor,
    debt: Math.max(0, -num(t.tokenLevel)), credit: num(t.credit),
    breaker: t.breakerOpen ? "open" : "closed", breakerUntil: t.breakerUntil,
    budget: r.budgetLeftMicros === undefined ? Infinity : num(r.budgetLeftMicros),
  };
}

function drawTenants() {
  const rows = state.rows.map(rowValues);
  if (state.sortKey) {
    const k = state.sortKey, dir = state.sortDir === "asc" ? 1 : -1;
    rows.sort((a, b) => (a[k] < b[k] ? -1 : a[k] > b[k] ? 1 : 0) * dir || (a.name < b.name ? -1 : 1));
  }
  const body = $("#tenants tbody");
  body.replaceChildren(...rows.map((v) => {
    const floorShare = v.floor > 0 ? Math.min(v.achieved / v.floor, 1) : 0;
    const bar = el("i");
    bar.style.width = pct(floorShare);
    bar.dataset.level = "ok";
    const tr = el("tr", { "data-tenant": v.name, "data-breaker": v.breaker },
      el("td", { class: "name", text: v.name }),
      el("td", { class: "tier", text: v.tier }),
      el("td", { class: "weight num", text: String(v.weight) }),
      el("td", { class: "admitted num", text: rate(v.admitted) }),
      el("td", { class: "degraded num", text: rate(v.degraded) }),
      el("td", { class: "refused num", text: rate(v.refused) }),
      el("td", { class: "reasons" }, ...(v.reasonList.length ? reasons(v.reasonList) : ["–"])),
      el("td", { class: "queued num", text: String(v.queued) }),
      el("td", { class: "in-flight num", text: String(v.inFlight) }),
      el("td", { class: "floor num" }, si(v.achieved, "") + (v.floor > 0 ? " / " + si(v.floor, "") : " / no floor"),
        ...(v.floor > 0 ? [el("div", { class: "meter" }, bar)] : [])),
      el("td", { class: "credit num", text: v.credit > 0 ? si(v.debt, "") + " owed of " + si(v.credit, "") : "none" }),
      el("td", { class: "breaker" }, ...(v.breaker === "open" ? ["OPEN until ", timeEl(v.breakerUntil)] : ["closed"])),
      el("td", { class: "budget num", text: v.budget === Infinity ? "no cap" : usd(v.budget) }),
    );
    if (v.refused === 0) tr.querySelector("td.refused").setAttribute("data-zero", "");
    return tr;
  }));
}

function updateTenants(snap) {
  const t = snap.tenants;
  state.rows = t.rows;
  $("#tenant-count").textContent = t.rows.length + " shown of " + t.matched + " matching, " + t.total + " configured, " + t.active + " with traffic";
  drawTenants();
}

// ---- the stream -----------------------------------------------------------

function showError(msg) {
  const f = $("#error");
  f.textContent = msg;
  f.hidden = !msg;
}

function handleEvent(chunk) {
  let type = "message", data = "";
  for (const line of chunk.split("\n")) {
    if (line.startsWith("event:")) type = line.slice(6).trim();
    else if (line.startsWith("data:")) data += line.slice(5).trim();
  }
  if (!data) return;
  const msg = JSON.parse(data);
  if (type === "topology") {
    drawTopology(msg);
  } else if (type === "snapshot") {
    state.canAct = msg.session.canAct;
    $("#principal").textContent = msg.session.principal + (msg.session.canAct ? " · may drain" : " · read only");
    $("#t-domains").textContent = msg.totals.domains || 0;
    $("#t-draining").textContent = msg.totals.draining || 0;
    $("#t-leases").textContent = msg.leases;
    $("#t-queue").textContent = msg.queueLength;
    const ans = msg.answers || {};
    $("#t-admitted").textContent = Number(ans.admitted || 0).toFixed(1);
    $("#t-degraded").textContent = Number(ans.degraded || 0).toFixed(1);
    $("#t-refused").textContent = Number(ans.refused || 0).toFixed(1);
    const lat = msg.admitLatency || {};
    $("#t-p99").textContent = lat.count ? seconds(lat.p99Seconds) : "–";
    $("#t-p99").title = (lat.count || 0) + " Admit calls timed";
    const rs = msg.refusalReasons || [];
    $("#t-reason-list").replaceChildren(...(rs.length ? reasons(rs) : ["none"]));
    drawServer(msg.server || {});
    $("#updated").replaceChildren(timeEl(msg.at));
    drawBacklog(msg.backlog);
    const f = msg.creditFreeze;
    $("#t-freeze").hidden = !f;
    $("#t-freeze").replaceChildren(...(f ? ["burst credit frozen until ", timeEl(f.until), f.reason ? ": " + f.reason : ""] : []));
    updateDomains(msg);
    updateTenants(msg);
    document.body.dataset.updated = msg.at;
  }
}

// drawBacklog shows the deferred backlog in the fleet strip, hidden on a
// server without one.
function drawBacklog(b) {
  const el = $("#t-backlog");
  el.hidden = !b;
  if (!b) return;
  const parts = [bold(b.pending), " deferred pending · ", bold(b.claimed), " claimed"];
  if (b.pending > 0) {
    parts.push(" · oldest ", bold(seconds(b.oldestSeconds)));
    const ts = (b.tenants || []).filter((t) => t.pending > 0).map((t) => t.tenant + " " + t.pending);
    if (ts.length) parts.push(" (" + ts.join(", ") + ")");
  }
  el.replaceChildren(...parts);
}

// bold is a <b> holding text.
function bold(text) {
  const b = document.createElement("b");
  b.textContent = String(text);
  return b;
}

// drawServer fills the header's identity: replica, build, config.
function drawServer(sv) {
  $("#s-replica").textContent = sv.replica || "–";
  $("#s-build").textContent = (sv.version || "–") + " " + shortRevision(sv.revision);
  $("#s-build").title = "version " + sv.version + ", revision " + sv.revision;
  const c = sv.config;
  if (!c) {
    $("#s-config").replaceChildren("not reported");
    return;
  }
  $("#s-config").replaceChildren(c.source + (c.revision > 0 ? " rev " + c.revision : ""),
    ...(c.appliedAt ? [" applied ", timeEl(c.appliedAt)] : []));
}

async function stream(signal) {
  const params = new URLSearchParams({ q: $("#search").value, sort: $("#sort").value, n: $("#rows").value });
  const resp = await fetch("/api/v1/events?" + params, { headers: headers(), cache: "no-store", signal });
  if (resp.status === 401 || resp.status === 403) {
    $("#token-form").hidden = false;
    throw new Error(resp.status === 401 ? "sign in: this server needs a viewer token or client certificate" : "this principal may not view the dashboard");
  }
  if (!resp.ok) throw new Error("events: " + resp.status + " " + (await resp.text()));
  $("#live").dataset.state = "live";
  $("#live").textContent = "live";
  showError("");
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error("stream closed");
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      handleEvent(buf.slice(0, i));
      buf = buf.slice(i + 2);
    }
  }
}

async function run() {
  for (;;) {
    const ctl = new AbortController();
    state.abort = ctl;
    try {
      await stream(ctl.signal);
    } catch (e) {
      if (ctl.signal.aborted) continue; // the query changed: reconnect at once
      $("#live").dataset.state = "down";
      $("#live").textContent = "reconnecting";
      showError(String(e.message || e));
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
}

function restart() { if (state.abort) state.abort.abort(); }

document.addEventListener("DOMContentLoaded", () => {
  // The table's header row sticks under the page's header, whose height
  // follows the window's width (the fleet strip wraps).
  const header = $("header");
  new ResizeObserver(() => document.documentElement.style.setProperty("--header-h", header.offsetHeight + "px")).observe(header);
  let timer;
  $("#search").addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(restart, 250); });
  $("#sort").addEventListener("change", restart);
  $("#rows").addEventListener("change", restart);
  $("#token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.token = $("#token").value.trim();
    sessionStorage.setItem("sluice-token", state.token);
    $("#token-form").hidden = true;
    restart();
  });
  for (const th of document.querySelectorAll("#tenants th")) {
    th.addEventListener("click", () => {
      const k = th.dataset.key;
      state.sortDir = state.sortKey === k && state.sortDir === "desc" ? "asc" : "desc";
      state.sortKey = k;
      for (const o of document.querySelectorAll("#tenants th")) delete o.dataset.dir;
      th.dataset.dir = state.sortDir;
      drawTenants();
    });
  }
  run();
});
