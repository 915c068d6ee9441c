// headroom's dashboard. Everything on the page comes from the REST API, asked with the token
// the person gave (kept in this tab's session storage); text goes into the page as text only.
"use strict";

const TOKEN_KEY = "headroom-token";
const state = {
  tab: "gpus", me: null, version: null, experiments: [],
  // What the person picked, kept across the redraws live updates make.
  runsExp: "", runsFilter: "", runsSort: "", runsDesc: false, runsAttempt: "", plotExp: "",
  resultsExp: "", resultsMetric: "", resultsParam: "", resultsMode: "max", resultsFlagged: false,
  usageSince: "30d", usageBy: "user",
};

// ---- the API ------------------------------------------------------------------------------

class AuthError extends Error {}

// The API's operations by their OpenAPI operationId, read once from /openapi.json (public):
// the page names no path of its own, so a route the server changes changes here too.
let operations = null;
async function operation(id) {
  if (!operations) {
    const r = await fetch("/openapi.json");
    if (!r.ok) throw new Error("the API's description could not be read: " + r.status);
    const doc = await r.json();
    operations = {};
    for (const [path, item] of Object.entries(doc.paths)) {
      for (const [method, op] of Object.entries(item)) operations[op.operationId] = { method: method.toUpperCase(), path };
    }
  }
  const op = operations[id];
  if (!op) throw new Error("this coordinator has no operation " + id);
  return op;
}

// Calls the operation `id`: `path` fills its {segments}, `query` its query string (undefined
// values left out); a JSON or text answer, as `api`.
async function call(id, { path = {}, query = {}, body } = {}) {
  const op = await operation(id);
  const url = op.path.replace(/\{(\w+)\}/g, (_, name) => encodeURIComponent(String(path[name])));
  const q = new URLSearchParams(Object.entries(query).filter(([, v]) => v !== undefined && v !== null).map(([k, v]) => [k, String(v)]));
  const opts = { method: op.method };
  if (body !== undefined) {
    opts.body = JSON.stringify(body);
    opts.headers = { "Content-Type": "application/json" };
  }
  return api(url + (q.toString() ? "?" + q : ""), opts);
}

async function api(path, opts = {}) {
  const r = await send(path, opts);
  if (r.status === 401) {
    logout(await messageOf(r, "the token was refused"));
    throw new AuthError("logged out");
  }
  if (!r.ok) throw new Error(await messageOf(r, r.status + " " + r.statusText));
  const type = r.headers.get("content-type") || "";
  return type.includes("json") ? r.json() : r.text();
}

// A request with the tab's token (none on a coordinator that runs without tokens).
function send(path, opts = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = Object.assign({}, opts.headers || {});
  if (token) headers.Authorization = "Bearer " + token;
  return fetch(path, Object.assign({}, opts, { headers }));
}

async function messageOf(r, fallback) {
  try {
    const body = await r.json();
    return (body.error && body.error.message) || fallback;
  } catch (_) {
    return fallback;
  }
}

// ---- small DOM helpers (text only, never markup) -------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function mib(n) {
  if (n === null || n === undefined) return "?";
  return n >= 1024 ? (n / 1024).toFixed(1) + " GiB" : n + " MiB";
}

function ago(iso) {
  if (!iso) return "";
  const secs = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (secs < 120) return secs + " s";
  if (secs < 7200) return Math.round(secs / 60) + " min";
  return (secs / 3600).toFixed(1) + " h";
}

function pct(part, whole) {
  return whole > 0 ? Math.max(0, Math.min(100, (100 * part) / whole)) : 0;
}

// The line above the view: what an action did or why it failed, or why a draw failed. A
// successful draw takes away a draw's failure, and an action's note once it has been read
// (the live redraws a retry or a cancel sets off come at once and would hide it at once).
const NOTE_MS = 10000;
let status = { at: 0, ofDraw: false };

function setStatus(text, ofDraw) {
  document.getElementById("status").textContent = text || "";
  status = { at: Date.now(), ofDraw: !!ofDraw };
}

function drawnFine() {
  if (status.ofDraw || Date.now() - status.at > NOTE_MS) setStatus("");
}

const isAdmin = () => state.me && state.me.role === "admin";
const mayAct = (owner) => isAdmin() || (state.me && state.me.name === owner);

// ---- log in and out ---------------------------------------------------------------------------

function logout(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  state.me = null;
  document.getElementById("tabs").hidden = true;
  document.getElementById("who").hidden = true;
  document.getElementById("view").replaceChildren();
  setStatus("");
  document.getElementById("login-message").textContent = message || "";
  document.getElementById("login").hidden = false;
}

async function login() {
  try {
    state.me = await call("whoAmI");
  } catch (e) {
    // Refused: back to the form (done). Unreachable or failing: the token stays; retry.
    if (!(e instanceof AuthError)) {
      setStatus(`Cannot reach the coordinator (${e.message}); trying again in 5 s.`);
      setTimeout(login, 5000);
    }
    return;
  }
  document.getElementById("login").hidden = true;
  document.getElementById("tabs").hidden = false;
  document.getElementById("who").hidden = false;
  document.getElementById("who-name").textContent = state.me.name + " (" + state.me.role + ")";
  show(state.tab);
  watchProgress();
}

// ---- tabs and live updates -------------------------------------------------------------------

const VIEWS = { gpus: viewGpus, queue: viewQueue, usage: viewUsage, experiments: viewExperiments, results: viewResults, runs: viewRuns,
  plots: viewPlots };
let drawing = null;
let redraw = false;

function show(tab) {
  state.tab = tab;
  setStatus("");
  for (const b of document.querySelectorAll("#tabs button")) {
    if (b.dataset.tab === tab) b.setAttribute("aria-current", "page");
    else b.removeAttribute("aria-current");
  }
  return refresh(true);
}

// One draw at a time; one asked for meanwhile (another tab, a change) runs after it.
async function refresh(replace) {
  if (!state.me) return;
  if (drawing) {
    redraw = true;
    return drawing;
  }
  const tab = state.tab;
  drawing = (async () => {
    try {
      const content = await VIEWS[tab]();
      if (state.tab === tab && state.me) {
        const view = document.getElementById("view");
        const focused = document.activeElement && document.activeElement.id;
        view.replaceChildren(content);
        view.dataset.tab = tab;
        sweepCharts();
        const filter = document.getElementById("runs-filter");
        if (filter && filter.catchUp) filter.catchUp();
        // Typing in the runs filter goes on through a redraw.
        if (focused && !replace) {
          const again = document.getElementById(focused);
          if (again) again.focus();
        }
        drawnFine();
      }
    } catch (e) {
      if (!(e instanceof AuthError)) setStatus(e.message, true);
    } finally {
      drawing = null;
    }
    if (redraw) {
      redraw = false;
      await refresh(true);
    }
  })();
  return drawing;
}

// Long-polls the progress counts: any change redraws the open view. GPUs and the queue also
// redraw every few seconds (telemetry and elapsed times move without job changes).
async function watchProgress() {
  const me = state.me;
  while (state.me === me) {
    try {
      const p = await call("progress", { query: { timeout_ms: 20000, after: state.version } });
      // Runs and plots redraw when the person asks (their Refresh), not under their pointer;
      // results read their live attempts' metrics themselves.
      const live = !["plots", "runs", "results"].includes(state.tab);
      if (state.version !== null && p.version !== state.version && live) await refresh(false);
      state.version = p.version;
    } catch (e) {
      if (e instanceof AuthError) return;
      await new Promise((r) => setTimeout(r, 2000));
    }
  }
}

setInterval(() => {
  if (state.me && (state.tab === "gpus" || state.tab === "queue")) refresh(false);
}, 5000);

// ---- GPUs ------------------------------------------------------------------------------------

async function latestTelemetry(node, gpu) {
  try {
    // The server's window (the last hour, newest kept): the browser's clock may be off.
    const series = await call("gpuTelemetry", { path: { name: node, gpu }, query: { limit: 1 } });
    return series.samples.length ? series.samples[series.samples.length - 1] : null;
  } catch (e) {
    if (e instanceof AuthError) throw e;
    return null;
  }
}

async function viewGpus() {
  const nodes = await call("listNodes");
  const cards = [];
  const attempt = (id) => call("getAttempt", { path: { id } }).catch((e) => {
    if (e instanceof AuthError) throw e;
    return null;
  });
  for (const node of nodes) {
    const gpus = await Promise.all(node.gpus.map(async (g) => {
      const [t, attempts] = await Promise.all([latestTelemetry(node.name, g.index), Promise.all((g.attempts || []).map(attempt))]);
      return gpuRow(node, g, t, attempts.filter(Boolean));
    }));
    cards.push(h("div", { class: "card", "data-node": node.name },
      h("h3", {}, node.name,
        h("span", { class: "badge " + (node.alive ? "ok" : "bad") }, node.alive ? "alive" : "not seen " + ago(node.last_seen)),
        h("span", { class: "muted" }, "plan " + node.plan + ", headroom " + node.headroom)),
      gpus));
  }
  return h("div", {},
    h("div", { class: "legend" },
      h("span", {}, h("i", { class: "seg-jobs" }), "jobs"),
      h("span", {}, h("i", { class: "seg-foreign" }), "not headroom's"),
      h("span", {}, h("i", { class: "seg-headroom" }), "headroom kept free"),
      h("span", {}, h("i", { class: "seg-free" }), "free")),
    nodes.length ? h("div", { class: "grid" }, cards) : h("p", { class: "muted" }, "No node has registered yet."));
}

function gpuRow(node, g, t, attempts) {
  const total = g.total_mib || 0;
  const used = g.used_mib === null || g.used_mib === undefined ? null : g.used_mib;
  const foreign = (g.foreign || []).reduce((a, p) => a + (p.used_mib || 0), 0) + (g.unattributed_mib || 0);
  const jobs = used === null ? g.estimated_mib : Math.max(0, used - foreign);
  const free = used === null ? Math.max(0, total - jobs - g.headroom_mib) : Math.max(0, total - used - g.headroom_mib);
  const bar = h("div", { class: "bar", title: `${mib(jobs)} jobs, ${mib(foreign)} not headroom's, ${mib(g.headroom_mib)} headroom, ${mib(free)} free of ${mib(total)}` });
  // The jobs' part, split by attempt in proportion to their estimates (the driver's
  // per-process figures are not kept per attempt here).
  const estimates = attempts.reduce((a, x) => a + (x.estimate_mib || 0), 0);
  const parts = attempts.length && estimates > 0
    ? attempts.map((x, i) => [i % 2 ? "seg-jobs alt" : "seg-jobs", (jobs * (x.estimate_mib || 0)) / estimates,
      `job ${x.job.slice(-8)} attempt ${x.number}: estimate ${mib(x.estimate_mib)}`, x.id])
    : [["seg-jobs", jobs, `${mib(jobs)} jobs`, null]];
  for (const [cls, v, title, id] of [...parts, ["seg-foreign", foreign, `${mib(foreign)} not headroom's`],
    ["seg-headroom", g.headroom_mib, `${mib(g.headroom_mib)} kept free`], ["seg-free", free, `${mib(free)} free`]]) {
    const seg = h("span", { class: cls, title, "data-attempt": id });
    seg.style.width = pct(v, total) + "%";
    bar.append(seg);
  }
  const quarantine = (g.quarantine || []).map((q) =>
    h("div", { class: "quarantine" }, "quarantined since " + ago(q.since) + ": " + q.reason));
  const release = g.quarantine && g.quarantine.length && isAdmin()
    ? h("button", { class: "danger", "data-release": node.name + "/" + g.index, onclick: () => releaseGpu(node.name, g.index) }, "Release")
    : null;
  const live = t
    ? [t.power_w != null ? t.power_w.toFixed(0) + " W" : null, t.temperature_c != null ? t.temperature_c.toFixed(0) + " °C" : null,
       t.utilization_pct != null ? t.utilization_pct + " % util" : null].filter(Boolean).join(" · ")
    : "";
  return h("div", { class: "gpu", "data-gpu": node.name + "/" + g.index, "data-slots-used": g.slots_used, "data-slots": g.slots },
    h("div", {}, h("strong", {}, "GPU " + g.index), " ", h("span", { class: "muted" }, g.name), " ",
      h("span", { class: "badge" }, g.slots_used + " / " + g.slots + " slots"), " ",
      h("span", { class: "muted" }, live)),
    bar,
    h("div", { class: "muted" }, `${mib(used)} used of ${mib(total)}` + (g.error ? " — cannot be read: " + g.error : "")),
    quarantine, release);
}

async function releaseGpu(node, gpu) {
  if (!confirm(`Release GPU ${gpu} of ${node}? Only when nothing of the quarantined attempts is left on it.`)) return;
  try {
    await call("releaseGpu", { path: { name: node, gpu } });
    await refresh(true);
  } catch (e) {
    if (!(e instanceof AuthError)) setStatus(e.message);
  }
}

// ---- queue -----------------------------------------------------------------------------------

// GPU memory as the server says it in a reason: whole GiB without a decimal (`20 GiB`).
function memText(n) {
  return n >= 1024 && n % 1024 === 0 ? n / 1024 + " GiB" : mib(n);
}

// MiB-hours as GiB-hours, one decimal (fair share's figures).
function gibHours(mibH) {
  return (mibH / 1024).toFixed(1) + " GiB-h";
}

function plural(n, one, many) {
  return `${n} ${n === 1 ? one : many}`;
}

function reasonText(r) {
  if (!r) return "";
  switch (r.reason) {
    case "not_enough_memory": return `not enough memory: needs ${mib(r.needed_mib)}, at most ${mib(r.available_mib)} free`;
    case "not_enough_host_memory": return `not enough host memory: needs ${mib(r.needed_mib)}, the node has ${mib(r.available_mib)} left for jobs`;
    case "concurrency_cap": return `its experiment's max_concurrent: ${r.running} of at most ${r.limit} leased or running`;
    case "user_cap": return `${r.user}'s cap: holds ` + (r.cap === "gpu_memory"
      ? `${memText(r.held)} of GPU memory, at most ${memText(r.limit)}`
      : `${plural(r.held, r.cap === "gpus" ? "GPU" : "job", r.cap === "gpus" ? "GPUs" : "jobs")}, at most ${r.limit}`);
    case "fair_share": return `fair share: ${r.user} used ${gibHours(r.used_mib_h)} (share ${r.share}), `
      + `${r.ahead} ${gibHours(r.ahead_used_mib_h)} (share ${r.ahead_share}) and goes first`;
    case "waits_for": return `waits for ${r.jobs} job${r.jobs === 1 ? "" : "s"} of ${r.experiment} to ${r.when === "ended" ? "end" : "succeed"}`
      + (r.ended_otherwise ? `; ${r.ended_otherwise} ended otherwise: headroom retry ${r.retry || "JOB"} --cascade` : "");
    default: return r.reason.replace(/_/g, " ") + Object.entries(r).filter(([k]) => k !== "reason").map(([k, v]) => ` ${k}=${v}`).join("");
  }
}

async function viewQueue() {
  // By state: the list is in submission order, and a long history would hide the queue.
  const of = (st) => call("listJobs", { query: { state: st, limit: 2000 } });
  const [running, leased, queued, retrying] = await Promise.all(["running", "leased", "queued", "retrying"].map(of));
  running.push(...leased);
  const waiting = [...retrying, ...queued];
  const details = await Promise.all(running.slice(0, 100).map((j) => call("getJob", { path: { id: j.id } })));
  const runningRows = [];
  for (const [i, j] of running.entries()) {
    const d = details[i];
    const a = d ? d.attempts_detail[d.attempts_detail.length - 1] || {} : {};
    runningRows.push(h("tr", { "data-job": j.id },
      h("td", {}, j.experiment_name), h("td", {}, j.index), h("td", {}, paramsText(j.params)),
      h("td", {}, (j.node || "") + " " + (j.gpu_indices || []).join(",")),
      h("td", {}, a.started_at ? ago(a.started_at) : j.state),
      h("td", {}, mib(a.peak_mem_mib != null ? a.peak_mem_mib : j.estimate_mib)),
      h("td", {}, j.submitted_by)));
  }
  return h("div", {},
    h("h2", {}, `Running (${running.length})`),
    h("div", { class: "table-wrap" }, h("table", { id: "queue-running" },
      h("thead", {}, h("tr", {}, ["experiment", "job", "parameters", "node / GPUs", "elapsed", "memory", "by"].map((c) => h("th", {}, c)))),
      h("tbody", {}, runningRows))),
    h("h2", {}, `Waiting (${waiting.length})`),
    h("div", { class: "table-wrap" }, h("table", { id: "queue-pending" },
      h("thead", {}, h("tr", {}, ["experiment", "job", "parameters", "state", "why it waits", "by"].map((c) => h("th", {}, c)))),
      h("tbody", {}, waiting.slice(0, 500).map((j) => h("tr", { "data-job": j.id },
        h("td", {}, j.experiment_name), h("td", {}, j.index), h("td", {}, paramsText(j.params)),
        h("td", {}, j.state), h("td", {}, reasonText(j.pending_reason)), h("td", {}, j.submitted_by)))))));
}

// ---- usage: what each user used, and fair share's order ----------------------------------------

const USAGE_SINCE = [["24h", "the last 24 hours"], ["7d", "the last 7 days"], ["30d", "the last 30 days"], ["90d", "the last 90 days"]];

// Hours (GPU-hours, GiB-hours) and kWh: short, more digits for small values.
function amount(v) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "";
  const a = Math.abs(v);
  return a === 0 ? "0" : a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : a >= 0.01 ? v.toFixed(2) : String(+v.toPrecision(2));
}

function halfLifeText(s) {
  if (!s) return "Only what runs now counts (no half-life).";
  const d = s % 86400 === 0 ? plural(s / 86400, "day", "days") : s % 3600 === 0 ? plural(s / 3600, "hour", "hours") : plural(s, "second", "seconds");
  return `Usage counts half after ${d}.`;
}

function jobsText(jobs) {
  const order = ["succeeded", "pruned", "failed", "cancelled"];
  return Object.entries(jobs || {}).filter(([, n]) => n)
    .sort(([a], [b]) => (order.indexOf(a) + 1 || 99) - (order.indexOf(b) + 1 || 99) || a.localeCompare(b))
    .map(([k, n]) => `${k} ${n}`).join(" · ");
}

async function viewUsage() {
  const report = await call("usage", { query: { since: state.usageSince, by: state.usageBy } });
  const byExp = report.by === "experiment";
  const since = h("select", { id: "usage-since", onchange: (ev) => { state.usageSince = ev.target.value; refresh(true); } },
    USAGE_SINCE.map(([v, t]) => h("option", { value: v, selected: v === state.usageSince }, t)));
  const by = h("select", { id: "usage-by", onchange: (ev) => { state.usageBy = ev.target.value; refresh(true); } },
    [["user", "by user"], ["experiment", "by experiment"]].map(([v, t]) => h("option", { value: v, selected: v === report.by }, t)));
  const me = state.me && state.me.name;

  const shares = report.shares.map((s, i) => h("tr", { "data-user": s.user, "data-share": s.share, "data-used": s.used_gib_hours,
    "data-normalized": s.normalized, "data-running-jobs": s.running_jobs, "data-running-gpus": s.running_gpus,
    class: s.user === me ? "me" : null },
  h("td", {}, i + 1), h("td", {}, s.user), h("td", {}, s.share), h("td", {}, amount(s.used_gib_hours)), h("td", {}, amount(s.normalized)),
  h("td", {}, s.running_jobs), h("td", {}, s.running_gpus), h("td", {}, s.running_mib ? mib(s.running_mib) : "")));

  const rows = report.rows.map((r) => h("tr", { "data-key": r.key, "data-attempts": r.attempts, "data-gib-hours": r.gib_hours,
    "data-gpu-hours": r.gpu_hours, class: !byExp && r.key === me ? "me" : null },
  h("td", { title: byExp ? r.key : null }, byExp ? `${r.name || "?"} (${r.key.slice(-6)})` : r.key),
  h("td", {}, amount(r.gpu_hours)), h("td", {}, amount(r.gib_hours)), h("td", {}, amount(r.energy_kwh)),
  h("td", {}, amount(r.clean_energy_kwh)), h("td", {}, r.attempts), h("td", {}, jobsText(r.jobs))));

  const span = `From ${new Date(report.since).toLocaleString()} to ${new Date(report.until).toLocaleString()}.`;
  return h("div", { id: "usage", "data-since": state.usageSince, "data-by": report.by },
    h("h2", {}, "Fair share"),
    h("p", { class: "muted" }, "Whose waiting jobs go first: the lowest GPU memory-time used per unit of share. "
      + halfLifeText(report.half_life_s)),
    report.shares.length
      ? h("div", { class: "table-wrap" }, h("table", { id: "usage-shares", class: "compact" },
        h("thead", {}, h("tr", {}, ["order", "user", "share", "used GiB-h", "per share", "running jobs", "running GPUs", "GPU memory held"]
          .map((c) => h("th", {}, c)))),
        h("tbody", {}, shares)))
      : h("p", { class: "muted", id: "usage-no-shares" }, "No user has a share set or has used a GPU yet."),
    h("h2", {}, "Usage"),
    h("div", { class: "toolbar" }, since, by),
    rows.length
      ? h("div", { class: "table-wrap" }, h("table", { id: "usage-rows", class: "compact" },
        h("thead", {}, h("tr", {}, [byExp ? "experiment" : "user", "GPU-h", "GiB-h", "energy kWh", "clean kWh", "attempts", "jobs ended"]
          .map((c) => h("th", {}, c)))),
        h("tbody", {}, rows)))
      : h("p", { class: "muted", id: "usage-none" }, "Nothing ran in this window."),
    h("p", { class: "muted" }, span + " GiB-h: GiB of GPU memory reserved × hours, what fair share charges. "
      + "Clean kWh: of runs that had their GPUs to themselves."));
}

function paramsText(p) {
  return Object.entries(p || {}).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" ");
}

// ---- experiments -------------------------------------------------------------------------------

const STATES = ["succeeded", "pruned", "failed", "cancelled", "running", "leased", "retrying", "queued"];

async function viewExperiments() {
  const exps = await call("listExperiments");
  state.experiments = exps;
  const failedOf = Object.fromEntries(await Promise.all(exps.filter((e) => e.counts.failed)
    .map(async (e) => [e.id, await call("listJobs", { query: { experiment: e.id, state: "failed", limit: 5000 } })])));
  const cards = [];
  for (const e of exps) {
    const total = STATES.reduce((a, k) => a + (e.counts[k] || 0), 0);
    const finished = (e.counts.succeeded || 0) + (e.counts.pruned || 0) + (e.counts.failed || 0) + (e.counts.cancelled || 0);
    const bar = h("div", { class: "progress", title: `${finished} of ${total} finished` });
    for (const k of STATES) {
      const seg = h("span", { class: "st-" + k });
      seg.style.width = pct(e.counts[k] || 0, total) + "%";
      bar.append(seg);
    }
    let failures = null;
    if (failedOf[e.id]) {
      const byClass = {};
      for (const j of failedOf[e.id]) byClass[j.last_failure || "unknown"] = (byClass[j.last_failure || "unknown"] || 0) + 1;
      failures = h("div", { class: "counts" }, "failures:", Object.entries(byClass).map(([k, v]) => h("span", { class: "badge bad" }, `${k} ${v}`)));
    }
    const unfinished = total - finished;
    cards.push(h("div", { class: "card", "data-experiment": e.id, "data-finished": finished, "data-total": total },
      h("h3", {}, e.name, h("span", { class: "muted" }, "by " + e.submitted_by + ", " + ago(e.created_at) + " ago")),
      bar,
      h("div", { class: "counts" }, h("strong", { class: "finished" }, `${finished} / ${total}`),
        STATES.filter((k) => e.counts[k]).map((k) => h("span", { "data-state": k }, `${k} ${e.counts[k]}`))),
      failures,
      h("div", { class: "toolbar" },
        h("button", { onclick: () => { state.runsExp = e.id; show("runs"); } }, "Runs"),
        h("button", { "data-results": e.id, onclick: () => { state.resultsExp = e.id; show("results"); } }, "Results"),
        mayAct(e.submitted_by) && unfinished ? h("button", { class: "danger", "data-cancel": e.id, onclick: () => cancelExperiment(e) }, "Cancel") : null,
        mayAct(e.submitted_by) && e.counts.failed ? h("button", { "data-retry": e.id, onclick: () => retryFailed(e) }, "Retry failed") : null)));
  }
  return exps.length ? h("div", { class: "grid" }, cards) : h("p", { class: "muted" }, "No experiment yet: headroom submit SPEC.yaml");
}

async function cancelExperiment(e) {
  if (!confirm(`Cancel every unfinished job of ${e.name}?`)) return;
  try {
    await call("cancelExperiment", { path: { id: e.id } });
    await refresh(true);
  } catch (err) {
    if (!(err instanceof AuthError)) setStatus(err.message);
  }
}

async function retryFailed(e) {
  try {
    // One request: the server retries every failed job of the experiment, all or none.
    const r = await call("retryFailedJobs", { path: { id: e.id } });
    await refresh(true);
    setStatus(`${r.retried.length} failed job${r.retried.length === 1 ? "" : "s"} of ${e.name} queued again`);
  } catch (err) {
    if (!(err instanceof AuthError)) setStatus(err.message);
  }
}

// ---- runs: the export, one row per attempt --------------------------------------------------

// An experiment's JSON export: its columns as the server describes them (name, type, unit,
// description), and its rows, each with every column by name and the parameters the attempt
// ran with in `params` (never found by position). Read page after page (`next_after`).
async function exportOf(exp) {
  const rows = [];
  let columns = [];
  let after = 0;
  for (;;) {
    const page = await call("exportAttempts", {
      query: { format: "json", experiment: exp, after },
    });
    columns = page.columns;
    rows.push(...page.rows);
    const next = page.next_after;
    if (next === null || next === undefined || !(next > after)) break;
    after = next;
  }
  const params = new Set();
  for (const r of rows) for (const k of Object.keys(r.params || {})) params.add(k);
  return { columns: new Map(columns.map((c) => [c.name, c])), rows, params: [...params].sort() };
}

// A value as the table shows it (and as `column=value` matches it).
function cellText(v) {
  if (v === null || v === undefined) return "";
  if (Array.isArray(v) && v.every((x) => typeof x === "number")) return v.join(",");
  if (typeof v === "object") return JSON.stringify(v);
  if (typeof v === "number" && !Number.isInteger(v)) return String(+v.toPrecision(6));
  return String(v);
}

// Numbers (and booleans) by value, text in natural order; empty cells last either way.
function compareCells(a, b, desc) {
  const none = (v) => v === null || v === undefined || v === "";
  if (none(a) || none(b)) return none(a) - none(b);
  let cmp;
  if (typeof a === typeof b && (typeof a === "number" || typeof a === "boolean")) cmp = a - b;
  else cmp = cellText(a).localeCompare(cellText(b), undefined, { numeric: true });
  return desc ? -cmp : cmp;
}

function columnTitle(c) {
  return c.unit ? `${c.description} (${c.unit})` : c.description;
}

// A column of the runs table: a fixed one by its name, a parameter as `params.NAME` (so a
// parameter named like a fixed column, a grid axis `node`, stays apart from it).
function fixedColumn(data, name) {
  const c = data.columns.get(name);
  return c ? { key: name, title: columnTitle(c), value: (r) => r[name] } : null;
}

function paramColumn(name) {
  return { key: "params." + name, param: name, title: `Parameter ${name}, as the attempt ran with it`,
    value: (r) => (r.params || {})[name] };
}

// What a filter's `column=value` names: `params.NAME`, a fixed column, or a parameter by its
// bare name where no fixed column has it.
function namedColumn(data, name) {
  if (name.startsWith("params.")) return paramColumn(name.slice(7));
  return fixedColumn(data, name) || (data.params.includes(name) ? paramColumn(name) : null);
}

const RUN_COLUMNS = ["attempt", "success", "failure_class", "node", "gpus", "duration_s", "peak_mem_mib", "energy_j",
  "mean_power_w", "max_temp_c", "shared", "contaminated", "covers_run"];

async function experimentPicker(id, current, onchange) {
  return h("select", { id, onchange: (ev) => { if (ev.target.value !== current) onchange(ev.target.value); } },
    state.experiments.map((e) => h("option", { value: e.id, selected: e.id === current }, e.name + " (" + e.id.slice(-6) + ")")));
}

async function viewRuns() {
  state.experiments = await call("listExperiments");
  if (!state.experiments.length) return h("p", { class: "muted" }, "No experiment yet.");
  if (!state.runsExp || !state.experiments.some((e) => e.id === state.runsExp)) state.runsExp = state.experiments[0].id;
  const exp = state.runsExp;
  const data = await exportOf(exp);
  const cols = [fixedColumn(data, "job_index"), ...data.params.map(paramColumn), ...RUN_COLUMNS.map((c) => fixedColumn(data, c))]
    .filter(Boolean);
  // Free text matches any value of the row, shown or not (ids, times, ...).
  const texts = new Map(data.rows.map((r) => [r, [...Object.entries(r).filter(([k]) => k !== "params").map(([, v]) => v),
    ...Object.values(r.params || {})].map((v) => cellText(v).toLowerCase()).join("\n")]));
  if (state.runsExpShown !== exp) {
    state.runsExpShown = exp;
    state.runsSort = "";
  }
  const filter = h("input", { id: "runs-filter", type: "search", placeholder: "filter: text, or column=value ...", value: state.runsFilter,
    title: "Words match any value; column=value one column's (a parameter: params.NAME, or NAME where no fixed column has it)" });
  const count = h("span", { id: "runs-count", class: "muted" });
  const tbody = h("tbody", {});
  const detail = h("div", { id: "run-detail" });
  const draw = () => {
    const tests = filter.value.trim().split(/\s+/).filter(Boolean).map((t) => {
      const eq = t.indexOf("=");
      if (eq > 0) {
        const c = namedColumn(data, t.slice(0, eq)), want = t.slice(eq + 1);
        return (r) => c !== null && cellText(c.value(r)) === want;
      }
      const low = t.toLowerCase();
      return (r) => texts.get(r).includes(low);
    });
    let rows = data.rows.filter((r) => tests.every((t) => t(r)));
    const by = cols.find((c) => c.key === state.runsSort);
    if (by) rows = rows.slice().sort((a, b) => compareCells(by.value(a), by.value(b), state.runsDesc));
    count.textContent = `${rows.length} of ${data.rows.length} attempts`;
    tbody.replaceChildren(...rows.map((r) => h("tr", { "data-attempt": r.attempt_id, onclick: () => { state.runsAttempt = r.attempt_id; showAttempt(r.attempt_id, detail); } },
      cols.map((c) => h("td", {}, cellText(c.value(r)))))));
  };
  filter.addEventListener("input", () => { state.runsFilter = filter.value; draw(); });
  // This view was built from the filter as it was when the build began: what was typed into
  // the view it replaces meanwhile is taken over once it is shown.
  filter.catchUp = () => {
    if (filter.value !== state.runsFilter) {
      filter.value = state.runsFilter;
      draw();
    }
  };
  const head = h("tr", {}, cols.map((c) => h("th", { "data-column": c.key, title: c.title, class: c.param !== undefined ? "param" : null, onclick: () => {
    state.runsDesc = state.runsSort === c.key ? !state.runsDesc : false;
    state.runsSort = c.key;
    draw();
  } }, c.key)));
  draw();
  // The attempt chosen before a redraw of this experiment (Refresh, or a click while the view
  // was being rebuilt) stays shown.
  if (state.runsAttempt && data.rows.some((r) => r.attempt_id === state.runsAttempt)) showAttempt(state.runsAttempt, detail);
  // The same rows as the CSV file the API writes (for a spreadsheet), asked for when wanted.
  const download = h("button", { id: "runs-download", onclick: async () => {
    try {
      const text = await call("exportAttempts", { query: { experiment: exp } });
      const a = h("a", { href: URL.createObjectURL(new Blob([text], { type: "text/csv" })), download: `attempts-${exp}.csv` });
      a.click();
      setTimeout(() => URL.revokeObjectURL(a.href), 1000);
    } catch (e) {
      if (!(e instanceof AuthError)) setStatus(e.message);
    }
  } }, "Download CSV");
  return h("div", {},
    h("div", { class: "toolbar" }, await experimentPicker("runs-experiment", exp, (v) => { state.runsExp = v; refresh(true); }),
      filter, count, download, h("button", { id: "runs-refresh", onclick: () => refresh(true) }, "Refresh")),
    h("div", { class: "table-wrap" }, h("table", { id: "runs-table", "data-experiment": exp }, h("thead", {}, head), tbody)),
    detail);
}

let shownAttempt = null;

async function showAttempt(id, into) {
  shownAttempt = id;
  const current = () => shownAttempt === id;
  try {
    const t = await call("attemptTelemetry", { path: { id } });
    const samples = t.gpus.flatMap((g) => g.samples);
    if (!current()) return;
    into.replaceChildren(h("h2", {}, `Attempt ${id.slice(-8)}: memory and power over its run`),
      lineChart(samples, "used_mib", "MiB", "plot-attempt-mem"), lineChart(samples, "power_w", "W", "plot-attempt-power"));
  } catch (e) {
    if (e instanceof AuthError || !current()) return;
    into.replaceChildren(h("p", { class: "muted" }, "No telemetry: " + e.message));
  }
  // Its log, where the API lets this token read it (its own jobs, or shared visibility).
  const log = h("pre", { id: "run-log", class: "log" });
  into.append(h("h2", {}, "Log"), log);
  try {
    const text = await logTail(id, 20000);
    if (current()) log.textContent = text || "(empty)";
  } catch (e) {
    if (!(e instanceof AuthError) && current()) log.textContent = e.message;
  }
}

// The end of an attempt's log: read on from each answer's offset (a read returns at most
// 1 MiB), keeping the last `keep` characters.
async function logTail(id, keep) {
  let offset = 0, text = "";
  const path = (await operation("readLog")).path.replace("{id}", encodeURIComponent(id));
  for (let reads = 0; reads < 64; reads++) {
    const r = await send(`${path}?offset=${offset}`);
    if (r.status === 401) {
      logout(await messageOf(r, "the token was refused"));
      throw new AuthError("logged out");
    }
    if (!r.ok) throw new Error(await messageOf(r, r.status + " " + r.statusText));
    const chunk = await r.text();
    const next = Number(r.headers.get("x-log-offset"));
    text = (text + chunk).slice(-keep);
    if (!chunk || !Number.isFinite(next) || next <= offset) break;
    offset = next;
  }
  return text.length >= keep ? "…" + text : text;
}

// ---- charts: uPlot (vendored, served from the binary at /ui/uPlot.iife.min.js) ----------------

// The page's colours (light or dark) for what uPlot draws on its canvas.
function palette() {
  const css = getComputedStyle(document.documentElement);
  const v = (name) => css.getPropertyValue(name).trim();
  return { muted: v("--muted"), line: v("--line"), accent: v("--accent"), bad: v("--bad"), ok: v("--ok"), pruned: v("--pruned"),
    card: v("--card") };
}

// A number as a tick or the legend shows it: short, and 1e-5 rather than 0.00001.
function fmtNum(v) {
  if (v === null || v === undefined || !Number.isFinite(v)) return "";
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e6 || a < 1e-3) return v.toExponential(3).replace(/\.?0+e/, "e").replace("e+", "e");
  return String(+v.toPrecision(6));
}

// A log axis's ends: out to the next round value (6e-6, 0.2), where its ticks start.
function roundOut(v, up) {
  const inc = Math.pow(10, Math.floor(Math.log10(v)));
  return +((up ? Math.ceil(v / inc - 1e-9) : Math.floor(v / inc + 1e-9)) * inc).toPrecision(12);
}

function axis(p, label, extra) {
  return Object.assign({ label, stroke: p.muted, font: "12px system-ui, sans-serif", labelFont: "bold 12px system-ui, sans-serif",
    grid: { stroke: p.line, width: 1 }, ticks: { stroke: p.line, width: 1 } }, extra);
}

// The charts on the page: each made once its box is shown (uPlot takes the box's width), sized
// with it, and destroyed once its view is gone (uPlot listens on the window).
const charts = new Set();

function dropChart(c) {
  c.ro.disconnect();
  if (c.plot) c.plot.destroy();
  charts.delete(c);
}

function sweepCharts() {
  for (const c of charts) if (!c.box.isConnected) dropChart(c);
}

function chartBox(id, attrs, make) {
  const box = h("div", Object.assign({ class: "chart", id }, attrs));
  const c = { box, plot: null, ro: null };
  c.ro = new ResizeObserver(() => {
    // Built before its view is shown: made once it is; taken out of the page: gone.
    if (!box.isConnected) return c.plot ? dropChart(c) : undefined;
    const width = Math.floor(box.clientWidth) - 16; // less its padding
    if (width <= 0) return;
    if (!c.plot) {
      sweepCharts();
      c.plot = make(box, width);
      box.uplot = c.plot;
      charts.add(c);
    } else if (Math.abs(c.plot.width - width) >= 1) {
      c.plot.setSize({ width, height: c.plot.height });
    }
  });
  c.ro.observe(box);
  return box;
}

// Drag across a chart to zoom in on x; a double click zooms back out (uPlot's own).
const ZOOM = { drag: { x: true, y: false, setScale: true } };

// One reading over time (a GPU's or an attempt's telemetry).
function lineChart(samples, field, unit, id) {
  const pts = samples.filter((p) => p[field] !== null && p[field] !== undefined)
    .map((p) => [Date.parse(p.at) / 1000, Number(p[field])]).sort((a, b) => a[0] - b[0]);
  if (!pts.length) return h("div", { class: "chart empty", id, "data-points": 0 }, `no ${field} readings`);
  const label = unit ? `${field} (${unit})` : field;
  return chartBox(id, { "data-points": pts.length, "data-y": field }, (box, width) => {
    const p = palette();
    return new uPlot({
      width, height: 260, cursor: ZOOM,
      scales: { x: { time: true } },
      series: [{ label: "time" },
        { label, stroke: p.accent, width: 1.6, value: (u, v) => (v === null ? "--" : fmtNum(v)) }],
      axes: [axis(p, "time"), axis(p, label, { size: 64, values: (u, splits) => splits.map(fmtNum) })],
    }, [pts.map((q) => q[0]), pts.map((q) => q[1])], box);
  });
}

// A parameter's value as a number, or null (text, a list: the axis is then one place per value).
function numericValue(v) {
  if (typeof v === "number" && Number.isFinite(v)) return v;
  if (typeof v === "string" && v.trim() !== "" && Number.isFinite(Number(v))) return Number(v);
  return null;
}

// A series drawn as points only, filled or hollow (`fill` the card's colour).
function dots(stroke, fill) {
  return { paths: () => null, stroke, fill, points: { show: true, size: 8, width: 1.5, stroke, fill } };
}

// A metric against a parameter, one point per attempt: clean ones filled, flagged ones hollow
// red (or as `kinds` names the two, and the colour of the hollow ones). A numeric parameter spanning two decades or more, all
// positive (a learning rate from 1e-5 to 0.1), gets a log axis; one that is not a number, a
// place per value.
function scatter(points, xName, yName, yUnit, id, kinds = ["clean", "flagged (not clean)", "bad"]) {
  const attrs = { "data-points": points.length, "data-x": xName, "data-y": yName };
  if (!points.length) return h("div", Object.assign({ class: "chart empty", id }, attrs), "nothing to plot");
  const numeric = points.every((q) => numericValue(q.x) !== null);
  const cats = numeric ? [] : [...new Set(points.map((q) => cellText(q.x)))]
    .sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
  const pts = points.map((q) => ({ x: numeric ? numericValue(q.x) : cats.indexOf(cellText(q.x)), y: q.y, flagged: q.flagged }))
    .sort((a, b) => a.x - b.x);
  const xs = pts.map((q) => q.x);
  const lo = xs[0], hi = xs[xs.length - 1];
  const log = numeric && lo > 0 && Math.log10(hi / lo) >= 2 - 1e-9;
  attrs["data-x-scale"] = log ? "log" : numeric ? "linear" : "category";
  const xLabel = log ? `${xName} (log scale)` : xName;
  const yLabel = yUnit ? `${yName} (${yUnit})` : yName;
  return chartBox(id, attrs, (box, width) => {
    const p = palette();
    // The whole data with some room around its outer points; a zoom as chosen (a log axis's
    // ends rounded out, where its ticks start).
    const range = (u, min, max) => {
      if (min === lo && max === hi) {
        if (!numeric) return [-0.5, cats.length - 0.5];
        if (log) return [roundOut(lo / 1.5, false), roundOut(hi * 1.5, true)];
        const pad = hi > lo ? (hi - lo) * 0.05 : Math.abs(lo) * 0.1 || 1;
        return [lo - pad, hi + pad];
      }
      return log ? [roundOut(min, false), roundOut(max, true)] : [min, max];
    };
    const xText = (v) => (numeric ? fmtNum(v) : Number.isInteger(v) && cats[v] !== undefined ? cats[v] : "");
    // The labels drawn, also kept on the box (a canvas has no text to read).
    const ticks = (u, splits) => {
      const labels = splits.map((v) => (v === null ? "" : xText(v)));
      box.dataset.xTicks = labels.filter(Boolean).join(" ");
      return labels;
    };
    const yValue = (u, v) => (v === null ? "--" : fmtNum(v));
    const series = [{ label: xName, value: (u, v) => (v === null ? "--" : xText(v)) },
      Object.assign({ label: kinds[0], value: yValue }, dots(p.accent, p.accent))];
    const data = [xs, pts.map((q) => (q.flagged ? null : q.y))];
    if (pts.some((q) => q.flagged)) {
      series.push(Object.assign({ label: kinds[1], value: yValue }, dots(p[kinds[2]], p.card)));
      data.push(pts.map((q) => (q.flagged ? q.y : null)));
    }
    const xAxis = axis(p, xLabel, { values: ticks, space: log ? 40 : 60 });
    if (!numeric) xAxis.splits = (u, i, min, max) => cats.map((_, k) => k).filter((k) => k >= min && k <= max);
    return new uPlot({
      width, height: 300, cursor: ZOOM,
      scales: { x: Object.assign({ time: false, range }, log ? { distr: 3, log: 10 } : {}) },
      series,
      axes: [xAxis, axis(p, yLabel, { size: 64, values: (u, splits) => splits.map(fmtNum) })],
    }, data, box);
  });
}

// ---- plots -----------------------------------------------------------------------------------

async function viewPlots() {
  const nodes = await call("listNodes");
  const gpuChoices = nodes.flatMap((n) => n.gpus.map((g) => n.name + "/" + g.index));
  const gpuPick = h("select", { id: "plot-gpu-pick" }, gpuChoices.map((c) => h("option", { value: c }, c)));
  const fieldPick = h("select", { id: "plot-gpu-field" }, [["used_mib", "MiB"], ["power_w", "W"], ["temperature_c", "°C"], ["utilization_pct", "%"]]
    .map(([f, u]) => h("option", { value: f, "data-unit": u }, f)));
  const gpuChart = h("div", {});
  const drawGpu = async () => {
    if (!gpuPick.value) return gpuChart.replaceChildren(h("p", { class: "muted" }, "No GPU yet."));
    const [node, gpu] = gpuPick.value.split("/");
    const series = await call("gpuTelemetry", { path: { name: node, gpu }, query: { limit: 3600 } });
    const opt = fieldPick.selectedOptions[0];
    gpuChart.replaceChildren(lineChart(series.samples, fieldPick.value, opt ? opt.dataset.unit : "", "plot-gpu"));
  };
  gpuPick.addEventListener("change", drawGpu);
  fieldPick.addEventListener("change", drawGpu);
  await drawGpu();

  const expSection = h("div", {});
  state.experiments = await call("listExperiments");
  if (state.experiments.length) {
    if (!state.plotExp || !state.experiments.some((e) => e.id === state.plotExp)) state.plotExp = state.experiments[0].id;
    const all = await exportOf(state.plotExp);
    const clean = new Set(all.rows.filter((r) => r.clean).map((r) => r.attempt_id));
    const xPick = h("select", { id: "plot-exp-x" }, all.params.map((p) => h("option", { value: p }, p)));
    // The figures the export marks as such: a new measured column is offered here at once.
    const figures = [...all.columns.values()].filter((c) => c.figure).map((c) => c.name);
    const yPick = h("select", { id: "plot-exp-y" }, figures
      .map((m) => h("option", { value: m, title: columnTitle(all.columns.get(m)) }, m)));
    const cleanOnly = h("input", { id: "plot-exp-clean", type: "checkbox", checked: true });
    const chart = h("div", {});
    const draw = () => {
      const param = xPick.value, metric = yPick.value;
      const points = all.rows.filter((r) => r.success === true && typeof r[metric] === "number"
          && r.params && r.params[param] !== undefined && r.params[param] !== null)
        .map((r) => ({ x: r.params[param], y: r[metric], flagged: !clean.has(r.attempt_id) }))
        .filter((p) => !cleanOnly.checked || !p.flagged);
      const col = all.columns.get(metric);
      const box = scatter(points, param, metric, col && col.unit, "plot-exp");
      box.setAttribute("data-experiment", state.plotExp);
      chart.replaceChildren(box,
        h("p", { class: "muted" }, (cleanOnly.checked ? "Clean measurements only (not shared, contaminated, throttled or partly read)."
          : "Hollow red points are flagged: not clean measurements.") + " Drag across the chart to zoom in; double-click to zoom out."));
    };
    for (const el of [xPick, yPick, cleanOnly]) el.addEventListener("change", draw);
    draw();
    expSection.append(h("div", { class: "toolbar" },
      await experimentPicker("plot-exp-pick", state.plotExp, (v) => { state.plotExp = v; refresh(true); }),
      h("label", {}, "x ", xPick), h("label", {}, "y ", yPick), h("label", {}, cleanOnly, " clean only")), chart);
  }
  return h("div", {},
    h("h2", {}, "A GPU over the last hour"),
    h("div", { class: "toolbar" }, gpuPick, fieldPick, h("button", { id: "plots-refresh", onclick: () => refresh(true) }, "Refresh")), gpuChart,
    h("h2", {}, "An experiment: a metric against a parameter"), expSection);
}

// ---- results: what the runs achieved, beside the energy they used ----------------------------

// The attempts' metrics as the API keeps them (`experimentMetrics`): read again every few
// seconds while one of them is live (or a job of the experiment is yet to end, whose attempt
// has not reported yet), until the view is left.
const POLL_MS = 3000;
let resultsPoll = null;

// A row of the export's final value of `metric` (its `metrics`, or the flat `metric.NAME`).
function metricOf(row, metric) {
  const v = row.metrics ? row.metrics[metric] : undefined;
  const flat = row["metric." + metric];
  return typeof v === "number" ? v : typeof flat === "number" ? flat : null;
}

// The metric names of an experiment: those its attempts report, those its export rows hold.
function metricNames(attempts, rows) {
  return [...new Set([...attempts.flatMap((a) => [...Object.keys(a.series || {}), ...Object.keys(a.finals || {})]),
    ...rows.flatMap((r) => Object.keys(r.metrics || {}))])].sort();
}

// The Pareto front of points {x: cost (the joules), y: a metric}: those no other point beats at
// no more cost with a value as good or better. `mode` "max": higher is better; "min": lower.
// In order of cost; of points equal in both, the first given is kept.
function paretoFront(points, mode) {
  const better = mode === "min" ? (a, b) => a < b : (a, b) => a > b;
  const order = points.map((p, i) => ({ p, i }))
    .sort((a, b) => a.p.x - b.p.x || (better(a.p.y, b.p.y) ? -1 : better(b.p.y, a.p.y) ? 1 : a.i - b.i));
  const front = [];
  for (const { p } of order) if (!front.length || better(p.y, front[front.length - 1].y)) front.push(p);
  return front;
}

// An attempt as a legend names it: its job's index (its number after a first attempt) and
// its parameters, briefly.
function attemptLabel(a) {
  const params = paramsText(a.params);
  return `#${a.index}` + (a.number > 1 ? ` (attempt ${a.number})` : "")
    + (params ? " " + (params.length > 40 ? params.slice(0, 39) + "…" : params) : "");
}

// Whether `early_stop` stopped the attempt (its job's state says so of its latest attempt only).
function wasPruned(a, attempts) {
  if ((a.rungs || []).some((r) => r.pruned)) return true;
  return a.state === "pruned" && !attempts.some((b) => b.job === a.job && b.number > a.number);
}

// A line's colour, apart from its neighbours' (hues a golden angle apart); faded when pruned.
function lineColour(i, faded) {
  return `hsl(${Math.round((i * 137.508) % 360)} 70% 42%${faded ? " / 0.6" : ""})`;
}

// `metric` over steps: x the steps any attempt reported it at, a series per attempt (in order
// of job index), null where that attempt has no value.
function curvesData(attempts, metric) {
  const shown = attempts.filter((a) => ((a.series || {})[metric] || []).length)
    .sort((a, b) => a.index - b.index || a.number - b.number);
  const steps = [...new Set(shown.flatMap((a) => a.series[metric].map((q) => q.step)))].sort((x, y) => x - y);
  const at = new Map(steps.map((s, i) => [s, i]));
  const data = [steps, ...shown.map((a) => {
    const ys = steps.map(() => null);
    for (const q of a.series[metric]) ys[at.get(q.step)] = q.value;
    return ys;
  })];
  return { shown, data };
}

// Learning curves: a line per attempt, pruned ones dashed and faded. The box names its
// attempts in the series' order (`data-attempts`); its data is kept on it for live updates.
function curvesChart(attempts, metric, id) {
  const { shown, data } = curvesData(attempts, metric);
  const attrs = { "data-y": metric, "data-series": shown.length, "data-attempts": shown.map((a) => a.attempt).join(" ") };
  if (!shown.length) return h("div", Object.assign({ class: "chart empty", id }, attrs), `no attempt has reported ${metric} yet`);
  const box = chartBox(id, attrs, (el, width) => {
    const p = palette();
    const yValue = (u, v) => (v === null ? "--" : fmtNum(v));
    const series = shown.map((a, i) => {
      const pruned = wasPruned(a, attempts);
      return Object.assign({ label: attemptLabel(a) + (pruned ? " (pruned)" : ""), stroke: lineColour(i, pruned),
        width: pruned ? 1.2 : 1.8, spanGaps: true, value: yValue }, pruned ? { dash: [6, 4] } : {});
    });
    return new uPlot({
      width, height: 320, cursor: ZOOM,
      scales: { x: { time: false } },
      series: [{ label: "step" }, ...series],
      axes: [axis(p, "step"), axis(p, metric, { size: 64, values: (u, splits) => splits.map(fmtNum) })],
    }, el.curves, el);
  });
  box.curves = data;
  return box;
}

// Gives a curves chart its attempts' new points; false when they are other attempts (or
// another metric) and it must be drawn anew.
function updateCurves(box, attempts, metric) {
  const { shown, data } = curvesData(attempts, metric);
  if (!box || box.dataset.y !== metric || box.dataset.attempts !== shown.map((a) => a.attempt).join(" ")) return false;
  box.curves = data;
  if (box.uplot) box.uplot.setData(data);
  return true;
}

// `early_stop`'s decision at each rung each attempt reached (on the metric it stops by).
function rungsTable(attempts) {
  const rows = attempts.slice().sort((a, b) => a.index - b.index || a.number - b.number)
    .flatMap((a) => (a.rungs || []).map((r) => h("tr", { "data-attempt": a.attempt, "data-rung": r.rung, "data-step": r.step,
      "data-value": r.value, "data-cutoff": r.cutoff, class: r.pruned ? "pruned" : null },
    h("td", {}, attemptLabel(a)), h("td", {}, r.rung), h("td", {}, r.step), h("td", {}, fmtNum(r.value)),
    h("td", {}, r.cutoff === null || r.cutoff === undefined ? "none yet" : fmtNum(r.cutoff)), h("td", {}, r.competitors),
    h("td", {}, r.pruned ? "pruned" : "went on"))));
  if (!rows.length) return null;
  return h("div", {}, h("h3", {}, "Early stopping: the decision at each rung"),
    h("div", { class: "table-wrap" }, h("table", { id: "results-rungs", class: "compact" },
      h("thead", {}, h("tr", {}, ["attempt", "rung", "step", "value", "cutoff", "compared", "decision"].map((c) => h("th", {}, c)))),
      h("tbody", {}, rows))));
}

// A metric against the energy its attempt used: clean points filled, flagged ones hollow, and
// the Pareto front over them as a step line: at each energy, the best value for at most that.
function energyChart(points, front, metric, mode, id) {
  const attrs = { "data-points": points.length, "data-front": front.length, "data-y": metric, "data-mode": mode };
  if (!points.length) return h("div", Object.assign({ class: "chart empty", id }, attrs), `no attempt has both ${metric} and energy_j`);
  const pts = points.slice().sort((a, b) => a.x - b.x);
  const xs = pts.map((q) => q.x);
  const lo = xs[0], hi = xs[xs.length - 1];
  return chartBox(id, attrs, (box, width) => {
    const p = palette();
    const yValue = (u, v) => (v === null ? "--" : fmtNum(v));
    const series = [{ label: "energy_j", value: yValue }, Object.assign({ label: "clean", value: yValue }, dots(p.accent, p.accent))];
    const data = [xs, pts.map((q) => (q.flagged ? null : q.y))];
    if (pts.some((q) => q.flagged)) {
      series.push(Object.assign({ label: "flagged (not clean)", value: yValue }, dots(p.bad, p.card)));
      data.push(pts.map((q) => (q.flagged ? q.y : null)));
    }
    series.push({ label: `Pareto front (${mode})`, stroke: p.ok, width: 1.6, value: yValue,
      paths: uPlot.paths.stepped({ align: 1 }), points: { show: false } });
    data.push(xs.map((x) => {
      const reached = front.filter((q) => q.x <= x);
      return reached.length ? reached[reached.length - 1].y : null;
    }));
    // The whole data with some room around its outer points; a zoom as chosen.
    const range = (u, min, max) => {
      if (min !== lo || max !== hi) return [min, max];
      const pad = hi > lo ? (hi - lo) * 0.05 : Math.abs(lo) * 0.1 || 1;
      return [lo - pad, hi + pad];
    };
    return new uPlot({
      width, height: 320, cursor: ZOOM,
      scales: { x: { time: false, range } },
      series,
      axes: [axis(p, "energy_j (J)", { values: (u, splits) => splits.map(fmtNum) }),
        axis(p, metric, { size: 64, values: (u, splits) => splits.map(fmtNum) })],
    }, data, box);
  });
}

// The front's points as numbers to read (the chart is a canvas): the exact values are on
// each row too.
function frontTable(front, metric, mode) {
  return h("div", { class: "table-wrap" }, h("table", { id: "results-front", class: "compact", "data-mode": mode, "data-y": metric },
    h("thead", {}, h("tr", {}, ["job", "energy_j (J)", metric].map((c) => h("th", {}, c)))),
    h("tbody", {}, front.map((q) => h("tr", { "data-attempt": q.attempt, "data-job-index": q.index, "data-energy": q.x, "data-value": q.y,
      class: q.flagged ? "flagged" : null },
    h("td", {}, `#${q.index}` + (q.number > 1 ? ` (attempt ${q.number})` : "") + (q.flagged ? " (flagged)" : "")),
    h("td", {}, fmtNum(q.x)), h("td", {}, fmtNum(q.y)))))));
}

// Points per attempt's curve the Results view asks for.
const CURVE_POINTS = 200;

async function viewResults() {
  clearTimeout(resultsPoll);
  state.experiments = await call("listExperiments");
  if (!state.experiments.length) return h("p", { class: "muted" }, "No experiment yet.");
  if (!state.resultsExp || !state.experiments.some((e) => e.id === state.resultsExp)) state.resultsExp = state.experiments[0].id;
  const exp = state.resultsExp;
  // Curves need no more points than a chart is wide: the API thins each series.
  const metricsOf = () => call("experimentMetrics", { path: { id: exp }, query: { points: CURVE_POINTS } });
  let [attempts, data] = await Promise.all([metricsOf(), exportOf(exp)]);
  const names = metricNames(attempts, data.rows);
  const toolbar = h("div", { class: "toolbar" },
    await experimentPicker("results-experiment", exp, (v) => { state.resultsExp = v; refresh(true); }));
  const root = h("div", { id: "results", "data-experiment": exp }, toolbar);
  const refreshButton = h("button", { id: "results-refresh", onclick: () => refresh(true) }, "Refresh");

  // Live attempts: their curves grow in place. An attempt that ends or starts, a job that
  // changes state or a new metric draws the view anew (the export has its energy then).
  const counts = (state.experiments.find((e) => e.id === exp) || {}).counts || {};
  const liveKey = (list, c) => list.filter((a) => a.live).map((a) => a.attempt).sort().join(" ") + "/" + list.length
    + "/" + STATES.map((k) => c[k] || 0).join(",");
  const unfinished = ["queued", "leased", "running", "retrying"].some((k) => counts[k]);
  const live = attempts.some((a) => a.live) || unfinished;
  let onPoll = () => {};
  const poll = async () => {
    if (!root.isConnected) return;
    try {
      const [now, progress] = await Promise.all([metricsOf(),
        call("progress", { query: { experiment: exp } })]);
      if (!root.isConnected) return;
      if (liveKey(now, progress.counts) !== liveKey(attempts, counts)
        || metricNames(now, data.rows).join("\n") !== names.join("\n")) return refresh(false);
      attempts = now;
      onPoll();
    } catch (e) {
      if (e instanceof AuthError) return;
    }
    resultsPoll = setTimeout(poll, POLL_MS);
  };
  if (live) resultsPoll = setTimeout(poll, POLL_MS);

  if (!names.length) {
    toolbar.append(refreshButton);
    root.append(h("p", { class: "muted", id: "results-none" }, "No metrics reported yet. A job reports them by printing lines like "
      + "HEADROOM_METRIC {\"step\": 1, \"acc\": 0.5}, or the spec's metrics: read them from its output."));
    return root;
  }
  if (!names.includes(state.resultsMetric)) state.resultsMetric = names[0];
  const metricPick = h("select", { id: "results-metric" }, names.map((n) => h("option", { value: n, selected: n === state.resultsMetric }, n)));
  toolbar.append(h("label", {}, "metric ", metricPick), refreshButton);

  // 1. Learning curves, and early stopping's decisions.
  const curves = h("div", {});
  const rungs = h("div", {});
  const drawCurves = () => curves.replaceChildren(curvesChart(attempts, metricPick.value, "results-curves"));
  const drawRungs = () => rungs.replaceChildren(...[rungsTable(attempts)].filter(Boolean));
  onPoll = () => {
    if (!updateCurves(curves.querySelector("#results-curves"), attempts, metricPick.value)) drawCurves();
    drawRungs();
  };

  // 2. The final value against a numeric parameter: finished attempts filled, pruned hollow.
  const counted = data.rows.filter((r) => r.success === true || r.failure_class === "pruned");
  const numericParams = data.params.filter((k) => {
    const vs = data.rows.map((r) => (r.params || {})[k]).filter((v) => v !== undefined && v !== null);
    return vs.length > 0 && vs.every((v) => numericValue(v) !== null);
  });
  if (!numericParams.includes(state.resultsParam)) state.resultsParam = numericParams[0] || "";
  const paramPick = h("select", { id: "results-param" }, numericParams.map((k) => h("option", { value: k, selected: k === state.resultsParam }, k)));
  const vsParam = h("div", {});
  const drawParam = () => {
    const metric = metricPick.value, param = paramPick.value;
    if (!param) return vsParam.replaceChildren(h("p", { class: "muted" }, "No parameter with numeric values to plot against."));
    const points = counted.filter((r) => metricOf(r, metric) !== null && numericValue((r.params || {})[param]) !== null)
      .map((r) => ({ x: r.params[param], y: metricOf(r, metric), flagged: r.failure_class === "pruned" }));
    vsParam.replaceChildren(scatter(points, param, metric, "", "results-param-plot", ["finished", "pruned", "pruned"]));
  };

  // 3. The final value against the energy used, with its Pareto front: clean measurements
  // only unless asked (a shared or contaminated GPU's energy is not the attempt's alone).
  const modePick = h("select", { id: "results-mode" }, [["max", "higher is better"], ["min", "lower is better"]]
    .map(([v, t]) => h("option", { value: v, selected: v === state.resultsMode }, `${v}: ${t}`)));
  const flaggedToo = h("input", { id: "results-flagged", type: "checkbox", checked: state.resultsFlagged });
  const vsEnergy = h("div", {});
  const drawEnergy = () => {
    const metric = metricPick.value, mode = modePick.value;
    const points = counted.filter((r) => metricOf(r, metric) !== null && typeof r.energy_j === "number" && (flaggedToo.checked || r.clean))
      .sort((a, b) => a.job_index - b.job_index || a.attempt - b.attempt)
      .map((r) => ({ x: r.energy_j, y: metricOf(r, metric), flagged: !r.clean, attempt: r.attempt_id, index: r.job_index, number: r.attempt }));
    const front = paretoFront(points, mode);
    vsEnergy.replaceChildren(energyChart(points, front, metric, mode, "results-energy"),
      h("p", { class: "muted" }, (flaggedToo.checked ? "Hollow red points are flagged: their energy is not a clean measurement. "
        : "Clean measurements only (not shared, contaminated, throttled or partly read). ")
        + `The line is the Pareto front: the best ${metric} for at most that energy. Its points:`),
      frontTable(front, metric, mode));
  };

  metricPick.addEventListener("change", () => { state.resultsMetric = metricPick.value; drawCurves(); drawParam(); drawEnergy(); });
  paramPick.addEventListener("change", () => { state.resultsParam = paramPick.value; drawParam(); });
  modePick.addEventListener("change", () => { state.resultsMode = modePick.value; drawEnergy(); });
  flaggedToo.addEventListener("change", () => { state.resultsFlagged = flaggedToo.checked; drawEnergy(); });
  drawCurves();
  drawRungs();
  drawParam();
  drawEnergy();
  root.append(
    h("h2", {}, "Learning curves"), curves,
    h("p", { class: "muted" }, (live ? `Live: read again every ${POLL_MS / 1000} s until every job has ended. ` : "")
      + "Dashed, faded lines are attempts early stopping pruned. Drag across a chart to zoom in; double-click to zoom out."),
    rungs,
    h("h2", {}, "The final value against a parameter"), h("div", { class: "toolbar" }, h("label", {}, "x ", paramPick)), vsParam,
    h("h2", {}, "The final value against the energy used"),
    h("div", { class: "toolbar" }, h("label", {}, "best ", modePick), h("label", {}, flaggedToo, " include flagged runs")), vsEnergy);
  return root;
}

// ---- start -----------------------------------------------------------------------------------

// The link `headroom up` prints: the token in the fragment (never sent to a server), out of
// the address bar and history at once, and taken into this tab only once the person has seen
// whose it is and said yes. Anyone can make such a link: taken silently, a page could log this
// tab in as the link's maker, who would then read whatever is submitted from it.
async function takeLinkToken() {
  const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (!m) return;
  history.replaceState(null, "", location.pathname + location.search);
  let token;
  try {
    token = decodeURIComponent(m[1]);
  } catch (_) {
    token = m[1];
  }
  let who = null;
  try {
    const r = await fetch((await operation("whoAmI")).path, { headers: { Authorization: "Bearer " + token } });
    if (r.ok) who = await r.json();
  } catch (_) {}
  if (!who) return setStatus("The link's token was refused: log in below.");
  if (confirm(`This link logs this tab in as ${who.name} (role ${who.role}): what you submit here will be ${who.name}'s. Log in as ${who.name}?`)) {
    sessionStorage.setItem(TOKEN_KEY, token);
  }
}

document.addEventListener("DOMContentLoaded", async () => {
  await takeLinkToken();
  for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => show(b.dataset.tab));
  document.getElementById("logout").addEventListener("click", () => logout("Logged out."));
  document.getElementById("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = document.getElementById("login-token");
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    input.value = "";
    login();
  });
  if (sessionStorage.getItem(TOKEN_KEY)) login();
  else {
    // A coordinator without tokens (`headroom up --no-auth`) answers without one.
    operation("whoAmI").then((op) => send(op.path)).then((r) => (r.ok ? login() : logout(""))).catch(() => logout(""));
  }
});
