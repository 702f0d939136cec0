// crawlfleet dashboard: asks the server for named panels over a time window (never SQL),
// draws series with uPlot and tables as sortable HTML, and refreshes with fetch() polling.
"use strict";

const state = { panels: [], window: "1h", refreshS: 5, seq: 0, asked: 0, timer: null,
                charts: {}, sort: {}, last: null };
const COLORS = ["#2f6fdf", "#d9822b", "#2e9e5b", "#b4372a", "#7b4fc4", "#1c9aa8", "#a0522d",
                "#c2185b", "#607d8b", "#827717"];

function el(tag, attrs, ...kids) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const kid of kids) node.append(kid instanceof Node ? kid : String(kid));
  return node;
}

async function getJSON(url) {
  const resp = await fetch(url, { credentials: "same-origin", cache: "no-store" });
  const body = await resp.json();
  if (!resp.ok) throw new Error(body.error || resp.statusText);
  return body;
}

function isNum(v) { return typeof v === "number" && Number.isFinite(v); }

function fmt(v) {
  if (v === null || v === undefined) return "";
  if (Array.isArray(v)) return v.join(", ");
  return String(v);
}

function layout() {
  const nav = document.getElementById("windows");
  for (const w of state.windows) {
    const b = el("button", { type: "button", "data-window": w,
                             "aria-pressed": String(w === state.window) }, w);
    b.addEventListener("click", () => { state.window = w; markWindow(); refresh(); });
    nav.append(b);
  }
  document.getElementById("live").addEventListener("change", schedule);
  const main = document.getElementById("panels");
  for (const p of state.panels) {
    const sec = el("section", { class: "panel" + (p.wide ? " wide" : ""), id: "panel-" + p.name,
                                "data-panel": p.name, "data-kind": p.kind },
                   el("h2", {}, p.title), el("div", { class: "body" }));
    main.append(sec);
  }
}

function markWindow() {
  for (const b of document.querySelectorAll("#windows button")) {
    b.setAttribute("aria-pressed", String(b.dataset.window === state.window));
  }
}

function schedule() {
  clearTimeout(state.timer);
  if (document.getElementById("live").checked) {
    state.timer = setTimeout(refresh, state.refreshS * 1000);
  }
}

async function refresh() {
  const asked = ++state.asked;
  const window = state.window;
  const status = document.getElementById("status");
  try {
    const data = await getJSON("/api/data?window=" + encodeURIComponent(window));
    if (asked !== state.asked) return;  // a newer request is under way: its answer wins
    render(data);
    status.textContent = `window ${window} (${data.since_s ?? "-"} s, buckets of ` +
      `${data.bucket_s ?? "-"} s) · updated ${data.at}`;
  } catch (err) {
    if (asked !== state.asked) return;
    status.textContent = "refresh failed: " + err.message;
  } finally {
    if (asked === state.asked) schedule();
  }
}

function render(data) {
  const storeError = document.getElementById("store-error");
  storeError.hidden = !data.store_error;
  storeError.textContent = data.store_error || "";
  for (const p of state.panels) {
    const body = document.querySelector(`#panel-${p.name} .body`);
    const got = data.panels[p.name];
    const sec = body.parentElement;
    sec.dataset.rows = got ? String(got.rows.length) : "";
    body.replaceChildren();
    destroyChart(p.name);
    if (!got) {
      body.append(el("p", { class: "empty" }, data.store_error ? "no store to read" :
                      "not asked for"));
    } else if (got.error) {
      body.append(el("p", { class: "error" }, "query failed: " + got.error));
    } else if (!got.rows.length) {
      body.append(el("p", { class: "empty" }, got.empty));
    } else if (p.kind === "series") {
      drawSeries(p, got, body, data);
    } else {
      body.append(table(p, got, data.approved));
    }
    if (got && got.truncated) {
      body.append(el("p", { class: "note" }, `showing the first ${got.rows.length} rows`));
    }
  }
  state.last = data;
  document.body.dataset.window = data.window;
  document.body.dataset.since = String(data.since_s ?? "");
  document.body.dataset.at = data.at;
  document.body.dataset.seq = String(++state.seq);
}

function destroyChart(name) {
  if (state.charts[name]) { state.charts[name].destroy(); delete state.charts[name]; }
}

// One line per value of series_by (or per value column), aligned on the sorted buckets.
function seriesData(p, got) {
  const idx = Object.fromEntries(got.columns.map((c, i) => [c, i]));
  const times = [...new Set(got.rows.map(r => r[idx.time]))].sort();
  const at = Object.fromEntries(times.map((t, i) => [t, i]));
  const lines = new Map();
  for (const r of got.rows) {
    for (const col of p.values) {
      const label = p.series_by ? String(r[idx[p.series_by]]) : col;
      if (!lines.has(label)) lines.set(label, new Array(times.length).fill(null));
      lines.get(label)[at[r[idx.time]]] = r[idx[col]];
    }
  }
  const xs = times.map(t => Date.parse(t.endsWith("Z") || t.includes("+") ? t : t + "Z") / 1000);
  return { xs, labels: [...lines.keys()], ys: [...lines.values()] };
}

function drawSeries(p, got, body, data) {
  const { xs, labels, ys } = seriesData(p, got);
  // The x axis spans the chosen window, ending at the answer's time: the time control
  // changes the picture as well as the figures.
  const to = Date.parse(data.at) / 1000;
  const from = Math.min(to - data.since_s, xs[0]);
  const holder = el("div", { class: "chart" });
  body.append(holder);
  if (xs.length < 2) {
    body.append(el("p", { class: "note" },
      "one interval so far: a line needs two (rates need one sample interval)"));
  }
  const width = Math.max(300, body.clientWidth || 480);
  const opts = {
    width, height: 200,
    scales: { x: { time: true, range: () => [from, to] } },
    axes: [{}, { label: p.unit, size: 60 }],
    series: [{}, ...labels.map((label, i) => ({
      label, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: false,
      points: { show: xs.length <= 20 } }))],
  };
  state.charts[p.name] = new uPlot(opts, [xs, ...ys], holder);
  const figures = el("details", { class: "figures" }, el("summary", {}, "figures"));
  figures.append(table(p, got, null));
  body.append(figures);
}

// The first column, then the panel's lead columns, then the rest as the view orders them.
function columnOrder(p, columns) {
  const lead = (p.lead || []).filter(c => columns.includes(c));
  return [columns[0], ...lead, ...columns.slice(1).filter(c => !lead.includes(c))];
}

function table(p, got, approved) {
  const cols = columnOrder(p, got.columns);
  const idx = Object.fromEntries(got.columns.map((c, i) => [c, i]));
  const approvedSet = p.approval && approved && approved.tuples && approved.tuples.length
    ? new Set(approved.tuples) : null;
  const wrap = el("div", { class: "scroll" });
  const t = el("table", { class: "data", "data-panel": p.name });
  const head = el("tr");
  const sort = state.sort[p.name];
  cols.forEach(c => {
    const th = el("th", { "data-col": c, class: p.highlight.includes(c) ? "hi" : "" }, c);
    if (sort && sort.col === c) th.classList.add(sort.desc ? "sorted-desc" : "sorted-asc");
    th.addEventListener("click", () => {
      const cur = state.sort[p.name];
      state.sort[p.name] = { col: c, desc: cur && cur.col === c ? !cur.desc : true };
      if (state.last) render(state.last);
    });
    head.append(th);
  });
  // The approval mark right after the tuple it marks.
  if (approvedSet) head.insertBefore(el("th", { "data-col": "approved" }, "approved"),
                                     head.children[1] || null);
  t.append(el("thead", {}, head));
  let rows = got.rows.slice();
  if (sort && sort.col in idx) {
    const i = idx[sort.col];
    rows.sort((a, b) => {
      const x = a[i], y = b[i];
      const c = isNum(x) && isNum(y) ? x - y : String(x).localeCompare(String(y));
      return sort.desc ? -c : c;
    });
  }
  const tb = el("tbody");
  for (const r of rows) {
    const tr = el("tr");
    for (const c of cols) {
      const v = r[idx[c]];
      const cls = [isNum(v) ? "num" : "", p.highlight.includes(c) ? "hi" : ""];
      tr.append(el("td", { "data-col": c, class: cls.join(" ").trim() }, fmt(v)));
    }
    if (approvedSet) {
      const ok = approvedSet.has(String(r[idx.version_tuple]));
      if (!ok) tr.classList.add("unapproved");
      tr.insertBefore(el("td", { "data-col": "approved" },
                         ok ? "yes" : el("span", { class: "badge" }, "unapproved")),
                      tr.children[1] || null);
    }
    tb.append(tr);
  }
  t.append(tb);
  wrap.append(t);
  if (p.approval && approved) {
    const marks = approved.tuples && approved.tuples.length
      ? "; a tuple outside the approved set is marked unapproved (its workers refuse to consume)"
      : "";
    const note = el("p", { class: "note" }, "approved set: " + approved.note + marks);
    const box = el("div", {}, wrap, note);
    return box;
  }
  return wrap;
}

async function start() {
  const meta = await getJSON("/api/panels");
  state.panels = meta.panels;
  state.windows = meta.windows;
  state.window = meta.default_window;
  state.refreshS = meta.refresh_s;
  layout();
  await refresh();
}

start().catch(err => {
  document.getElementById("status").textContent = "cannot load the panels: " + err.message;
});
