// The mcp-gateway console: reads /status, /status/catalog and /status/events, then
// follows /status/stream (SSE, every 2 s; polling if the stream fails).
// Everything a server or client said is set as text (textContent), never as HTML:
// tool descriptions and error messages come from servers and may be hostile.
"use strict";

const KEY = "mcp-gateway-token";
const SVG = "http://www.w3.org/2000/svg";
let catalog = [];
let events = [];
let lastSeq = 0;

// `?token=` once: kept in this tab's sessionStorage, and taken out of the address bar.
const params = new URLSearchParams(location.search);
if (params.has("token")) {
  sessionStorage.setItem(KEY, params.get("token"));
  params.delete("token");
  const rest = params.toString();
  history.replaceState(null, "", location.pathname + (rest ? "?" + rest : ""));
}

function headers() {
  const t = sessionStorage.getItem(KEY);
  return t ? { Authorization: "Bearer " + t } : {};
}

class Refused extends Error {}

async function getJSON(path) {
  const r = await fetch(path, { headers: headers(), cache: "no-store" });
  if (r.status === 401 || r.status === 403) {
    let why = r.status === 401 ? "a token is needed" : "this token is not an admin's";
    try { why = (await r.json()).error.message; } catch (_) { /* keep the short one */ }
    throw new Refused(why);
  }
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}

// Control characters (but tab and newline) and format characters (Unicode Cf: bidi
// overrides and isolates, zero-width ones, the BOM...) shown as \u{...}: a name that
// reverses itself or hides a part must look like what it is.
const HIDDEN = /[\p{Cc}\p{Cf}]/gu;
function shown(text) {
  return String(text).replace(HIDDEN, c => (c === "\t" || c === "\n" ? c : "\\u{" + c.codePointAt(0).toString(16) + "}"));
}

// el("td", {class: "num"}, "text", child...): text children become text nodes, shown.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "data") for (const [dk, dv] of Object.entries(v)) e.dataset[dk] = dv;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(shown(c)));
  }
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

// A sparkline of one or more series (nulls break the line), scaled to their common max.
function spark(series, label) {
  const W = 180, H = 40, pad = 3;
  const s = svg("svg", { class: "spark", viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
  s.append(svg("title", {}));
  s.firstChild.textContent = label;
  const all = series.flatMap(x => x.values).filter(v => v !== null && v !== undefined);
  const max = Math.max(1e-9, ...all);
  for (const { values, cls } of series) {
    const n = values.length;
    let pts = [];
    const flush = () => {
      if (pts.length === 1) {
        // A lone point (the first seconds of a series): a dot.
        const [x, y] = pts[0].split(",");
        s.append(svg("circle", { class: cls, cx: Math.min(Number(x), W - 2), cy: y, r: 2 }));
      } else if (pts.length) s.append(svg("polyline", { class: cls, points: pts.join(" ") }));
      pts = [];
    };
    values.forEach((v, i) => {
      if (v === null || v === undefined) { flush(); return; }
      const x = n > 1 ? (i / (n - 1)) * W : 0;
      const y = H - pad - (v / max) * (H - 2 * pad);
      pts.push(x.toFixed(1) + "," + y.toFixed(1));
    });
    flush();
  }
  return s;
}

const fmt = {
  n: v => (v === null || v === undefined ? "–" : String(v)),
  rate: v => (v >= 10 ? v.toFixed(0) : v.toFixed(1)),
  pct: v => (v * 100).toFixed(v > 0 && v < 0.01 ? 2 : 1) + " %",
  ms: v => (v === null || v === undefined ? "–" : v < 1 ? (v * 1000).toFixed(0) + " µs" : v < 1000 ? v.toFixed(1) + " ms" : (v / 1000).toFixed(2) + " s"),
  time: ms => new Date(ms).toLocaleTimeString(),
  up: s => (s === null || s === undefined ? "–" : s < 120 ? s + " s" : s < 7200 ? Math.floor(s / 60) + " min" : Math.floor(s / 3600) + " h"),
};

function fact(label, value, cls) {
  return el("div", { class: cls }, el("span", {}, label), el("b", {}, value));
}

function seenOf(seen, total) {
  return seen === total || total === undefined ? String(seen) : `${seen} of ${total}`;
}

function renderServer(s) {
  const ser = s.series || { calls: [], errors: [], p50Ms: [], p99Ms: [], step: 10 };
  const step = ser.step || 10;
  const perSec = ser.calls.map(c => c / step);
  const errPerSec = ser.errors.map(c => c / step);
  return el("article", { class: "server", data: { server: s.name, state: s.state } },
    el("h3", {}, el("span", { class: "name" }, s.name), el("span", { class: "state " + s.state }, s.state)),
    s.reason ? el("div", { class: "reason" }, s.reason) : null,
    el("div", { class: "facts" },
      fact("transport", s.transport),
      fact("era", s.era || "–"),
      fact("calls/s", fmt.rate(s.callsPerSecond || 0)),
      fact("calls (15 min)", s.calls, "calls"),
      fact("error rate", fmt.pct(s.errorRate || 0), s.errorRate > 0 ? "bad" : ""),
      fact("p50", fmt.ms(s.p50Ms)),
      fact("p99", fmt.ms(s.p99Ms)),
      fact("in flight", s.inFlight),
      fact("restarts", s.restarts, s.restarts > 0 ? "warn" : ""),
      // "2 of 9": clients see fewer than the server lists (its allow/deny, collisions).
      fact("tools", seenOf(s.tools, s.toolsTotal)),
      fact("prompts", seenOf(s.prompts, s.promptsTotal)),
      fact("resources", seenOf(s.resources, s.resourcesTotal)),
      fact("uptime", fmt.up(s.uptimeSeconds)),
      fact("pid", fmt.n(s.pid))),
    el("div", { class: "charts" },
      el("div", { class: "chart" }, el("span", {}, "calls/s and errors/s, 15 min"),
        spark([{ values: perSec, cls: "calls" }, { values: errPerSec, cls: "errors" }], "calls per second")),
      el("div", { class: "chart" }, el("span", {}, "p50 and p99 latency, 15 min"),
        spark([{ values: ser.p50Ms, cls: "p50" }, { values: ser.p99Ms, cls: "p99" }], "latency p50 and p99"))),
    s.lastError && !s.reason ? el("p", { class: "muted" }, "last error: ", s.lastError) : null);
}

function renderStatus(st) {
  document.getElementById("version").textContent = st.gateway ? st.gateway.version : "";
  const servers = st.servers || [];
  const ready = servers.filter(s => s.state === "ready").length;
  document.getElementById("summary").textContent = shown(
    `endpoint ${st.gateway ? st.gateway.path : ""} · ${ready} of ${servers.length} servers ready · ${st.sessions} session(s) · up ${fmt.up(st.gateway ? st.gateway.uptimeSeconds : null)}`);
  document.getElementById("servers").replaceChildren(...servers.map(renderServer));
  const rows = (st.clients || []).map(c => el("tr", { data: { client: c.name } },
    el("td", {}, c.name),
    el("td", { class: "num" }, c.sessions),
    el("td", { class: "num" }, fmt.rate(c.callsPerSecond || 0)),
    el("td", { class: "num" }, c.calls),
    el("td", { class: "num" }, c.errors),
    el("td", {}, (c.rateLimited || []).map(l => `${l.limit}: ${l.count}`).join("; ") || "–"),
    el("td", {}, c.lastError ? `${fmt.time(c.lastError.at)} ${c.lastError.text}` : "–")));
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 7, class: "muted" }, "no client sessions yet")));
  document.querySelector("#clients tbody").replaceChildren(...rows);
  if (st.gateway && st.gateway.lastEvent > lastSeq) loadEvents();
}

function seenBy(item) {
  const parts = [];
  if (item.profiles && item.profiles.length) parts.push("profiles: " + item.profiles.join(", "));
  if (item.clients === null || item.clients === undefined) parts.push("every client");
  else parts.push(item.clients.length ? "clients: " + item.clients.join(", ") : "no client");
  return parts.join(" · ");
}

// A tool's annotations (readOnlyHint, destructiveHint...), each as it was given: the
// server's word, not the gateway's.
function hints(a) {
  if (!a || typeof a !== "object" || Array.isArray(a)) return null;
  const parts = Object.entries(a).map(([k, v]) => `${k}: ${typeof v === "string" ? v : JSON.stringify(v)}`);
  return parts.length ? el("div", { class: "hints" }, parts.join(" · ")) : null;
}

function renderCatalog() {
  const q = document.getElementById("q").value.trim().toLowerCase();
  const hit = item => !q || [item.name, item.original, item.server, item.title, item.description,
    item.annotations && item.annotations.title]
    .some(v => typeof v === "string" && (v.toLowerCase().includes(q) || shown(v).toLowerCase().includes(q)));
  const matching = catalog.filter(hit);
  document.getElementById("catalog-count").textContent = `${matching.length} of ${catalog.length} shown`;
  const rows = [];
  for (const item of matching) {
    const detail = el("tr", { class: "detail", hidden: true },
      el("td", { colspan: 7 }, el("pre", { class: "schema" },
        JSON.stringify({ title: item.title, annotations: item.annotations, description: item.description, inputSchema: item.inputSchema, arguments: item.arguments, mimeType: item.mimeType },
          (k, v) => (v === null ? undefined : v), 2))));
    const toggle = el("button", { class: "link", type: "button" }, "schema");
    toggle.addEventListener("click", () => { detail.hidden = !detail.hidden; });
    const desc = typeof item.description === "string" ? item.description : "";
    rows.push(el("tr", { class: "item", data: { kind: item.kind, name: item.name } },
      el("td", {}, item.kind),
      el("td", {}, el("code", {}, item.name),
        typeof item.title === "string" ? el("div", { class: "title" }, "title: ", item.title) : null),
      el("td", {}, item.server || "–"),
      el("td", {}, item.original || "–"),
      el("td", { class: "desc" }, hints(item.annotations), desc.length > 200 ? desc.slice(0, 200) + "…" : desc),
      el("td", {}, seenBy(item)),
      el("td", {}, toggle)), detail);
  }
  document.querySelector("#catalog tbody").replaceChildren(...rows);
}

function renderEvents() {
  document.getElementById("events").replaceChildren(...events.map(e =>
    el("li", { data: { kind: e.kind, seq: e.seq } },
      el("time", {}, fmt.time(e.at)),
      el("span", { class: "kind " + e.kind }, e.kind),
      e.server ? el("b", {}, e.server + " ") : null,
      e.text,
      e.count > 1 ? el("span", { class: "muted" }, ` (×${e.count})`) : null)));
  if (!events.length) document.getElementById("events").append(el("li", { class: "muted" }, "no events yet"));
}

// New events: the ring is read again whole (a burst that grew moved to its front with
// a new seq, and its old copy must go).
function addEvents(fresh) {
  if (fresh.length && fresh[0].seq > lastSeq) loadEvents();
}

let loadingEvents = false;
async function loadEvents() {
  if (loadingEvents) return;
  loadingEvents = true;
  try {
    // The whole ring: bursts that grew moved to the front with a new seq.
    const r = await getJSON("/status/events");
    events = r.events;
    const had = lastSeq;
    lastSeq = events.length ? events[0].seq : lastSeq;
    renderEvents();
    if (had && r.events.some(e => e.seq > had && (e.kind === "reload" || e.kind === "list_changed"))) loadCatalog();
  } finally {
    loadingEvents = false;
  }
}

async function loadCatalog() {
  const c = await getJSON("/status/catalog");
  catalog = c.items || [];
  renderCatalog();
}

function setLive(on, how) {
  const e = document.getElementById("live");
  e.textContent = on ? "● live (" + how + ")" : "○ reconnecting…";
  e.className = on ? "ok" : "warn";
}

// SSE over fetch (EventSource cannot send the Authorization header).
async function follow() {
  for (;;) {
    try {
      const r = await fetch("/status/stream", { headers: headers(), cache: "no-store" });
      if (r.status === 401 || r.status === 403) { showLogin("the token was refused"); return; }
      if (!r.ok || !r.body) throw new Error("HTTP " + r.status);
      setLive(true, "stream");
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let i;
        while ((i = buf.indexOf("\n\n")) >= 0) {
          const frame = buf.slice(0, i);
          buf = buf.slice(i + 2);
          let name = "message", data = "";
          for (const line of frame.split("\n")) {
            if (line.startsWith("event: ")) name = line.slice(7);
            else if (line.startsWith("data: ")) data += line.slice(6);
          }
          if (!data) continue;
          const v = JSON.parse(data);
          if (name === "status") renderStatus(v);
          else if (name === "events") addEvents(v);
        }
      }
    } catch (e) {
      console.warn("stream:", e);
    }
    setLive(false);
    // The stream ended (a restart, a proxy): poll once, then follow again.
    await new Promise(r => setTimeout(r, 2000));
    try { renderStatus(await getJSON("/status")); } catch (_) { /* next round */ }
  }
}

function showLogin(why) {
  document.getElementById("main").hidden = true;
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = why || "";
  document.getElementById("summary").textContent = "sign in";
}

async function start() {
  try {
    const [st, cat, ev] = await Promise.all([getJSON("/status"), getJSON("/status/catalog"), getJSON("/status/events")]);
    document.getElementById("login").hidden = true;
    document.getElementById("main").hidden = false;
    catalog = cat.items || [];
    events = ev.events || [];
    lastSeq = events.length ? events[0].seq : 0;
    renderStatus(st);
    renderCatalog();
    renderEvents();
    document.body.dataset.ready = "1";
    follow();
  } catch (e) {
    if (e instanceof Refused) showLogin(e.message);
    else document.getElementById("summary").textContent = "cannot read /status: " + e.message;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const q = document.getElementById("q");
  q.value = params.get("q") || "";
  q.addEventListener("input", () => {
    renderCatalog();
    const p = new URLSearchParams(location.search);
    if (q.value) p.set("q", q.value); else p.delete("q");
    const rest = p.toString();
    history.replaceState(null, "", location.pathname + (rest ? "?" + rest : ""));
  });
  document.getElementById("login").addEventListener("submit", ev => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, document.getElementById("token").value.trim());
    document.getElementById("token").value = "";
    start();
  });
  start();
});
