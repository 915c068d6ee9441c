// headroom's dashboard. Everything on the page comes from the REST API, asked with the token
// the person gave (kept in this tab's session storage); text goes into the page as text only.
"use strict";

const TOKEN_KEY = "headroom-token";
const state = {
  tab: "gpus", me: null, version: null, experiments: [],
  // What the person picked, kept across the redraws live updates make.
  runsExp: "", runsFilter: "", runsSort: -1, runsDesc: false, runsAttempt: "", plotExp: "",
};

// ---- the API ------------------------------------------------------------------------------

class AuthError extends Error {}

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

const SVG = "http://www.w3.org/2000/svg";
function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
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

function setStatus(text) {
  document.getElementById("status").textContent = text || "";
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
    state.me = await api("/v1/whoami");
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

const VIEWS = { gpus: viewGpus, queue: viewQueue, experiments: viewExperiments, runs: viewRuns, plots: viewPlots };
let drawing = null;
let redraw = false;

function show(tab) {
  state.tab = tab;
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
        const filter = document.getElementById("runs-filter");
        if (filter && filter.catchUp) filter.catchUp();
        // Typing in the runs filter goes on through a redraw.
        if (focused && !replace) {
          const again = document.getElementById(focused);
          if (again) again.focus();
        }
        setStatus("");
      }
    } catch (e) {
      if (!(e instanceof AuthError)) setStatus(e.message);
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
      const after = state.version === null ? "" : "&after=" + state.version;
      const p = await api("/v1/progress?timeout_ms=20000" + after);
      // Runs and plots redraw when the person asks (their Refresh), not under their pointer.
      const live = state.tab !== "plots" && state.tab !== "runs";
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
    const series = await api(`/v1/nodes/${encodeURIComponent(node)}/gpus/${gpu}/telemetry?limit=1`);
    return series.samples.length ? series.samples[series.samples.length - 1] : null;
  } catch (e) {
    if (e instanceof AuthError) throw e;
    return null;
  }
}

async function viewGpus() {
  const nodes = await api("/v1/nodes");
  const cards = [];
  const attempt = (id) => api("/v1/attempts/" + id).catch((e) => {
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
    await api(`/v1/nodes/${encodeURIComponent(node)}/gpus/${gpu}/release`, { method: "POST" });
    await refresh(true);
  } catch (e) {
    if (!(e instanceof AuthError)) setStatus(e.message);
  }
}

// ---- queue -----------------------------------------------------------------------------------

function reasonText(r) {
  if (!r) return "";
  switch (r.reason) {
    case "not_enough_memory": return `not enough memory: needs ${mib(r.needed_mib)}, at most ${mib(r.available_mib)} free`;
    default: return r.reason.replace(/_/g, " ") + Object.entries(r).filter(([k]) => k !== "reason").map(([k, v]) => ` ${k}=${v}`).join("");
  }
}

async function viewQueue() {
  // By state: the list is in submission order, and a long history would hide the queue.
  const of = (st) => api(`/v1/jobs?state=${st}&limit=2000`);
  const [running, leased, queued, retrying] = await Promise.all(["running", "leased", "queued", "retrying"].map(of));
  running.push(...leased);
  const waiting = [...retrying, ...queued];
  const details = await Promise.all(running.slice(0, 100).map((j) => api("/v1/jobs/" + j.id)));
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

function paramsText(p) {
  return Object.entries(p || {}).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" ");
}

// ---- experiments -------------------------------------------------------------------------------

const STATES = ["succeeded", "failed", "cancelled", "running", "leased", "retrying", "queued"];

async function viewExperiments() {
  const exps = await api("/v1/experiments");
  state.experiments = exps;
  const failedOf = Object.fromEntries(await Promise.all(exps.filter((e) => e.counts.failed)
    .map(async (e) => [e.id, await api(`/v1/jobs?experiment=${e.id}&state=failed&limit=5000`)])));
  const cards = [];
  for (const e of exps) {
    const total = STATES.reduce((a, k) => a + (e.counts[k] || 0), 0);
    const finished = (e.counts.succeeded || 0) + (e.counts.failed || 0) + (e.counts.cancelled || 0);
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
        mayAct(e.submitted_by) && unfinished ? h("button", { class: "danger", "data-cancel": e.id, onclick: () => cancelExperiment(e) }, "Cancel") : null,
        mayAct(e.submitted_by) && e.counts.failed ? h("button", { "data-retry": e.id, onclick: () => retryFailed(e) }, "Retry failed") : null)));
  }
  return exps.length ? h("div", { class: "grid" }, cards) : h("p", { class: "muted" }, "No experiment yet: headroom submit SPEC.yaml");
}

async function cancelExperiment(e) {
  if (!confirm(`Cancel every unfinished job of ${e.name}?`)) return;
  try {
    await api(`/v1/experiments/${e.id}/cancel`, { method: "POST" });
    await refresh(true);
  } catch (err) {
    if (!(err instanceof AuthError)) setStatus(err.message);
  }
}

async function retryFailed(e) {
  try {
    const failed = await api(`/v1/jobs?experiment=${e.id}&state=failed&limit=5000`);
    const refused = [];
    for (const j of failed) {
      try {
        await api(`/v1/jobs/${j.id}/retry`, { method: "POST" });
      } catch (err) {
        if (err instanceof AuthError) return;
        refused.push(`job ${j.index}: ${err.message}`);
      }
    }
    await refresh(true);
    if (refused.length) setStatus(`${refused.length} of ${failed.length} not retried: ${refused.join("; ")}`);
  } catch (err) {
    if (!(err instanceof AuthError)) setStatus(err.message);
  }
}

// ---- runs: the export, one row per attempt --------------------------------------------------

function parseCsv(text) {
  const rows = [];
  let row = [], field = "", quoted = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') { field += '"'; i++; }
      else if (c === '"') quoted = false;
      else field += c;
    } else if (c === '"') quoted = true;
    else if (c === ",") { row.push(field); field = ""; }
    else if (c === "\n") { row.push(field); rows.push(row); row = []; field = ""; }
    else if (c !== "\r") field += c;
  }
  if (field !== "" || row.length) { row.push(field); rows.push(row); }
  return rows;
}

async function exportOf(exp, cleanOnly) {
  const text = await api(`/v1/export?experiment=${exp}` + (cleanOnly ? "&clean_only=true" : ""));
  const [header, ...rows] = parseCsv(text);
  return { header: header || [], rows, text };
}

// The export's columns: fixed ones, then the spec's parameters, then the outcome from `success`.
function paramColumns(header) {
  const from = header.indexOf("attempt_id") + 1;
  const to = header.indexOf("success");
  return from > 0 && to > from ? header.slice(from, to) : [];
}

async function experimentPicker(id, current, onchange) {
  return h("select", { id, onchange: (ev) => { if (ev.target.value !== current) onchange(ev.target.value); } },
    state.experiments.map((e) => h("option", { value: e.id, selected: e.id === current }, e.name + " (" + e.id.slice(-6) + ")")));
}

async function viewRuns() {
  state.experiments = await api("/v1/experiments");
  if (!state.experiments.length) return h("p", { class: "muted" }, "No experiment yet.");
  if (!state.runsExp || !state.experiments.some((e) => e.id === state.runsExp)) state.runsExp = state.experiments[0].id;
  const exp = state.runsExp;
  const data = await exportOf(exp, false);
  const wanted = ["attempt", "success", "failure_class", "node", "gpus", "duration_s", "peak_mem_mib", "energy_j",
    "mean_power_w", "max_temp_c", "shared", "contaminated", "covers_run"];
  const params = paramColumns(data.header);
  const cols = ["job_index", ...params, ...wanted].filter((c) => data.header.includes(c));
  const idx = cols.map((c) => data.header.indexOf(c));
  const attemptCol = data.header.indexOf("attempt_id");
  if (state.runsExpShown !== exp) {
    state.runsExpShown = exp;
    state.runsSort = -1;
  }
  const filter = h("input", { id: "runs-filter", type: "search", placeholder: "filter: text, or column=value ...", value: state.runsFilter });
  const count = h("span", { id: "runs-count", class: "muted" });
  const tbody = h("tbody", {});
  const detail = h("div", { id: "run-detail" });
  const draw = () => {
    const terms = filter.value.trim().split(/\s+/).filter(Boolean);
    let rows = data.rows.filter((r) => terms.every((t) => {
      const eq = t.indexOf("=");
      if (eq > 0) {
        const c = data.header.indexOf(t.slice(0, eq));
        return c >= 0 && r[c] === t.slice(eq + 1);
      }
      return r.some((v) => v.toLowerCase().includes(t.toLowerCase()));
    }));
    const desc = state.runsDesc;
    if (state.runsSort >= 0 && state.runsSort < idx.length) {
      const c = idx[state.runsSort];
      rows = rows.slice().sort((a, b) => {
        const x = parseFloat(a[c]), y = parseFloat(b[c]);
        const cmp = !isNaN(x) && !isNaN(y) ? x - y : String(a[c]).localeCompare(String(b[c]));
        return desc ? -cmp : cmp;
      });
    }
    count.textContent = `${rows.length} of ${data.rows.length} attempts`;
    tbody.replaceChildren(...rows.map((r) => h("tr", { "data-attempt": r[attemptCol], onclick: () => { state.runsAttempt = r[attemptCol]; showAttempt(r[attemptCol], detail); } },
      idx.map((c) => h("td", {}, r[c])))));
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
  const head = h("tr", {}, cols.map((c, i) => h("th", { "data-column": c, onclick: () => {
    state.runsDesc = state.runsSort === i ? !state.runsDesc : false;
    state.runsSort = i;
    draw();
  } }, c)));
  draw();
  // The attempt chosen before a redraw of this experiment (Refresh, or a click while the view
  // was being rebuilt) stays shown.
  if (state.runsAttempt && data.rows.some((r) => r[attemptCol] === state.runsAttempt)) showAttempt(state.runsAttempt, detail);
  const download = h("button", { id: "runs-download", onclick: () => {
    const a = h("a", { href: URL.createObjectURL(new Blob([data.text], { type: "text/csv" })), download: `attempts-${exp}.csv` });
    a.click();
    setTimeout(() => URL.revokeObjectURL(a.href), 1000);
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
    const t = await api(`/v1/attempts/${id}/telemetry`);
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
  for (let reads = 0; reads < 64; reads++) {
    const r = await send(`/v1/attempts/${id}/log?offset=${offset}`);
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

// ---- plots -----------------------------------------------------------------------------------

function axes(svg, w, hgt, pad, x0, x1, y0, y1, xLabel, yLabel) {
  svg.append(s("line", { class: "axis", x1: pad, y1: hgt - pad, x2: w - 10, y2: hgt - pad }));
  svg.append(s("line", { class: "axis", x1: pad, y1: 10, x2: pad, y2: hgt - pad }));
  svg.append(s("text", { x: pad, y: hgt - pad + 16 }, x0));
  svg.append(s("text", { x: w - 10, y: hgt - pad + 16, "text-anchor": "end" }, x1));
  svg.append(s("text", { x: pad - 4, y: hgt - pad, "text-anchor": "end" }, y0));
  svg.append(s("text", { x: pad - 4, y: 18, "text-anchor": "end" }, y1));
  svg.append(s("text", { x: (w + pad) / 2, y: hgt - 6, "text-anchor": "middle" }, xLabel));
  svg.append(s("text", { x: 12, y: hgt / 2, transform: `rotate(-90 12 ${hgt / 2})`, "text-anchor": "middle" }, yLabel));
}

function lineChart(samples, field, unit, id) {
  const w = 800, hgt = 260, pad = 56;
  const pts = samples.filter((p) => p[field] !== null && p[field] !== undefined).map((p) => [Date.parse(p.at), Number(p[field])]);
  const svg = s("svg", { class: "chart", id, viewBox: `0 0 ${w} ${hgt}`, "data-points": pts.length });
  if (!pts.length) {
    svg.append(s("text", { x: w / 2, y: hgt / 2, "text-anchor": "middle" }, `no ${field} readings`));
    return svg;
  }
  const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
  const xmin = Math.min(...xs), xmax = Math.max(...xs, xmin + 1), ymin = Math.min(0, ...ys), ymax = Math.max(...ys, ymin + 1);
  const X = (x) => pad + ((x - xmin) / (xmax - xmin)) * (w - pad - 10);
  const Y = (y) => hgt - pad - ((y - ymin) / (ymax - ymin)) * (hgt - pad - 10);
  axes(svg, w, hgt, pad, new Date(xmin).toLocaleTimeString(), new Date(xmax).toLocaleTimeString(), ymin.toFixed(0), ymax.toFixed(0), "time", `${field} (${unit})`);
  svg.append(s("polyline", { class: "line", points: pts.map((p) => `${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" ") }));
  return svg;
}

function scatter(points, xLabel, yLabel, id) {
  const w = 800, hgt = 300, pad = 56;
  const svg = s("svg", { class: "chart", id, viewBox: `0 0 ${w} ${hgt}`, "data-points": points.length, "data-x": xLabel, "data-y": yLabel });
  if (!points.length) {
    svg.append(s("text", { x: w / 2, y: hgt / 2, "text-anchor": "middle" }, "nothing to plot"));
    return svg;
  }
  const numeric = points.every((p) => !isNaN(parseFloat(p.x)));
  const cats = numeric ? [] : [...new Set(points.map((p) => p.x))];
  const xv = (p) => (numeric ? parseFloat(p.x) : cats.indexOf(p.x));
  const xs = points.map(xv), ys = points.map((p) => p.y);
  const xmin = Math.min(...xs), xmax = Math.max(...xs, xmin + 1), ymin = Math.min(0, ...ys), ymax = Math.max(...ys, ymin + 1e-9);
  const X = (x) => pad + 20 + ((x - xmin) / (xmax - xmin)) * (w - pad - 50);
  const Y = (y) => hgt - pad - ((y - ymin) / (ymax - ymin)) * (hgt - pad - 10);
  axes(svg, w, hgt, pad, numeric ? xmin : cats[0], numeric ? xmax : cats[cats.length - 1], ymin.toPrecision(3), ymax.toPrecision(3), xLabel, yLabel);
  for (const p of points) {
    const dot = s("circle", { class: "dot" + (p.flagged ? " flagged" : ""), cx: X(xv(p)).toFixed(1), cy: Y(p.y).toFixed(1), r: 4 });
    dot.append(s("title", {}, `${xLabel}=${p.x} ${yLabel}=${p.y}${p.flagged ? " (flagged: not a clean measurement)" : ""}`));
    svg.append(dot);
  }
  return svg;
}

const METRICS = ["energy_j", "duration_s", "peak_mem_mib", "mean_power_w", "max_power_w", "max_temp_c", "mean_util_pct", "energy_share_j"];

async function viewPlots() {
  const nodes = await api("/v1/nodes");
  const gpuChoices = nodes.flatMap((n) => n.gpus.map((g) => n.name + "/" + g.index));
  const gpuPick = h("select", { id: "plot-gpu-pick" }, gpuChoices.map((c) => h("option", { value: c }, c)));
  const fieldPick = h("select", { id: "plot-gpu-field" }, [["used_mib", "MiB"], ["power_w", "W"], ["temperature_c", "°C"], ["utilization_pct", "%"]]
    .map(([f, u]) => h("option", { value: f, "data-unit": u }, f)));
  const gpuChart = h("div", {});
  const drawGpu = async () => {
    if (!gpuPick.value) return gpuChart.replaceChildren(h("p", { class: "muted" }, "No GPU yet."));
    const [node, gpu] = gpuPick.value.split("/");
    const series = await api(`/v1/nodes/${encodeURIComponent(node)}/gpus/${gpu}/telemetry?limit=3600`);
    const opt = fieldPick.selectedOptions[0];
    gpuChart.replaceChildren(lineChart(series.samples, fieldPick.value, opt ? opt.dataset.unit : "", "plot-gpu"));
  };
  gpuPick.addEventListener("change", drawGpu);
  fieldPick.addEventListener("change", drawGpu);
  await drawGpu();

  const expSection = h("div", {});
  state.experiments = await api("/v1/experiments");
  if (state.experiments.length) {
    if (!state.plotExp || !state.experiments.some((e) => e.id === state.plotExp)) state.plotExp = state.experiments[0].id;
    const all = await exportOf(state.plotExp, false);
    const clean = new Set((await exportOf(state.plotExp, true)).rows.map((r) => r[all.header.indexOf("attempt_id")]));
    const params = paramColumns(all.header);
    const xPick = h("select", { id: "plot-exp-x" }, params.map((p) => h("option", { value: p }, p)));
    const yPick = h("select", { id: "plot-exp-y" }, METRICS.filter((m) => all.header.includes(m)).map((m) => h("option", { value: m }, m)));
    const cleanOnly = h("input", { id: "plot-exp-clean", type: "checkbox", checked: true });
    const chart = h("div", {});
    const draw = () => {
      const xi = all.header.indexOf(xPick.value), yi = all.header.indexOf(yPick.value), ai = all.header.indexOf("attempt_id");
      const si = all.header.indexOf("success");
      const points = all.rows.filter((r) => r[si] === "true" && r[yi] !== "" && !isNaN(parseFloat(r[yi])))
        .map((r) => ({ x: r[xi], y: parseFloat(r[yi]), flagged: !clean.has(r[ai]) }))
        .filter((p) => !cleanOnly.checked || !p.flagged);
      const svg = scatter(points, xPick.value, yPick.value, "plot-exp");
      svg.setAttribute("data-experiment", state.plotExp);
      chart.replaceChildren(svg,
        h("p", { class: "muted" }, cleanOnly.checked ? "Clean measurements only (not shared, contaminated, throttled or partly read)." : "Hollow red points are flagged: not clean measurements."));
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
    const r = await fetch("/v1/whoami", { headers: { Authorization: "Bearer " + token } });
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
    send("/v1/whoami").then((r) => (r.ok ? login() : logout(""))).catch(() => logout(""));
  }
});
