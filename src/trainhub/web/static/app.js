// trainhub dashboard: canvas charts of downsampled series, parallel coordinates, and live
// updates by server-sent events (polling the same data where a stream fails). No library.
"use strict";
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
const POLL_MS = 2000;
const PAD = { L: 60, R: 10, T: 10, B: 28 };

function smooth(ys, alpha) {
  if (!alpha) return ys;
  const out = new Array(ys.length);
  let acc = ys[0];
  for (let i = 0; i < ys.length; i++) { acc = alpha * acc + (1 - alpha) * ys[i]; out[i] = acc; }
  return out;
}

function sizeCanvas(canvas, fallbackH) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 1000, h = canvas.clientHeight || fallbackH;
  canvas.width = w * dpr; canvas.height = h * dpr;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  return { ctx, w, h };
}

// series: [{name, x: [...], y: [...]}]; opts: {log, smoothing, xLabels, xRange: [x0, x1]}
function drawChart(canvas, series, opts) {
  const { ctx, w, h } = sizeCanvas(canvas, 320);
  const log = opts.log;
  const f = (v) => (log ? (v > 0 ? Math.log10(v) : NaN) : v);
  const range = opts.xRange;
  let x0 = range ? range[0] : Infinity, x1 = range ? range[1] : -Infinity, y0 = Infinity, y1 = -Infinity;
  const prepared = series.map((s) => {
    const ys = smooth(s.y, opts.smoothing).map(f);
    for (let i = 0; i < s.x.length; i++) {
      const x = s.x[i];
      if (range) { if (x < range[0] || x > range[1]) continue; }
      else { if (x < x0) x0 = x; if (x > x1) x1 = x; }
      if (ys[i] < y0) y0 = ys[i]; if (ys[i] > y1) y1 = ys[i];
    }
    return { name: s.name, x: s.x, y: ys, dots: s.dots, step: s.step };
  });
  const { L, R, T, B } = PAD;
  ctx.font = "11px system-ui"; ctx.fillStyle = "#6b7380"; ctx.strokeStyle = "#e3e6ea";
  canvas._geom = null;
  if (!isFinite(x0) || !isFinite(y0)) { ctx.fillText("no data yet", L, T + 20); canvas.dataset.drawn = String(performance.now()); return; }
  if (x1 === x0) { x0 -= 0.5; x1 += 0.5; } if (y1 === y0) { const pad = Math.abs(y0) * 0.1 || 1; y1 = y0 + pad; y0 = y0 - pad; }
  if (opts.margin) { const dx = (x1 - x0) * 0.04, dy = (y1 - y0) * 0.06; x0 -= dx; x1 += dx; y0 -= dy; y1 += dy; }
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (w - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (h - T - B);
  canvas._geom = { x0, x1, L, R, w, h };
  for (let i = 0; i <= 4; i++) {
    const yv = y0 + ((y1 - y0) * i) / 4, py = sy(yv);
    ctx.beginPath(); ctx.moveTo(L, py); ctx.lineTo(w - R, py); ctx.stroke();
    ctx.fillText((log ? Math.pow(10, yv) : yv).toPrecision(3), 4, py + 4);
    const xv = x0 + ((x1 - x0) * i) / 4;
    // day labels only where a day is (one day: once, not five times)
    const whole = Math.abs(xv - Math.round(xv)) < 1e-9;
    const label = opts.xLabels ? (whole ? (opts.xLabels[Math.round(xv)] || "") : "") : opts.xWhole ? "" : (x1 - x0 < 8 ? xv.toFixed(1) : Math.round(xv).toString());
    ctx.textAlign = i === 0 ? "left" : i === 4 ? "right" : "center";
    ctx.fillText(label, sx(xv), h - 8);
    ctx.textAlign = "left";
  }
  if (opts.xWhole) {  // whole numbers only (trials): at most about 8 of them
    const every = Math.max(1, Math.ceil((x1 - x0) / 8));
    ctx.textAlign = "center";
    for (let k = Math.ceil(x0 / every) * every; k <= x1; k += every) ctx.fillText(String(k), sx(k), h - 8);
    ctx.textAlign = "left";
  }
  ctx.save(); ctx.beginPath(); ctx.rect(L, 0, w - L - R, h - B); ctx.clip();
  let shown = 0;
  prepared.forEach((s, k) => {
    ctx.strokeStyle = COLORS[k % COLORS.length]; ctx.lineWidth = 1.2; ctx.beginPath();
    let pen = false, prev = NaN;
    ctx.fillStyle = ctx.strokeStyle;
    for (let i = 0; i < s.x.length; i++) {
      const v = s.y[i];
      if (!isFinite(v)) { pen = false; continue; }
      if (s.x[i] >= x0 && s.x[i] <= x1) shown++;
      // dots: points only; step: hold the value until the next point
      if (s.dots) { ctx.beginPath(); ctx.arc(sx(s.x[i]), sy(v), 3.5, 0, 2 * Math.PI); ctx.fill(); continue; }
      if (pen && s.step) ctx.lineTo(sx(s.x[i]), sy(prev));
      if (pen) ctx.lineTo(sx(s.x[i]), sy(v)); else { ctx.moveTo(sx(s.x[i]), sy(v)); pen = true; }
      prev = v;
    }
    if (!s.dots) ctx.stroke();
    // a lone point (one day of usage, one step) draws no line: a dot then
    if (s.x.length === 1 && isFinite(s.y[0])) { ctx.fillStyle = ctx.strokeStyle; ctx.beginPath(); ctx.arc(sx(s.x[0]), sy(s.y[0]), 3, 0, 2 * Math.PI); ctx.fill(); }
  });
  ctx.restore();
  if (prepared.length > 1) prepared.forEach((s, k) => { ctx.fillStyle = COLORS[k % COLORS.length]; ctx.fillText(s.name, w - R - 90, T + 12 + 13 * k); });
  if (opts.xTitle) { ctx.fillStyle = "#6b7380"; ctx.fillText("x: " + opts.xTitle, L + 6, T + 12); }
  canvas.dataset.shown = String(shown);
  canvas.dataset.drawn = String(performance.now());
}

function chartOptions() {
  const log = document.querySelector(".logscale");
  const sm = document.querySelector(".smoothing");
  return { log: !!(log && log.checked), smoothing: sm ? parseFloat(sm.value) : 0 };
}

async function getJSON(url, headers) {
  const r = await fetch(url, { credentials: "same-origin", headers: headers || {} });
  if (!r.ok) throw new Error(url + ": " + r.status);
  return r.json();
}

// A page's live updates: a server-sent event stream; where it cannot be opened, the same
// events polled as JSON (?once=1). handlers: {event name: function(data)}.
function live(url, handlers) {
  let es = null, lastId = "", polling = false, opened = false, closed = false, timer = null;
  const dispatch = (name, data, id) => { if (id) lastId = id; if (handlers[name]) handlers[name](data); };
  async function poll() {
    if (closed) return;
    try {
      const body = await getJSON(url + (url.includes("?") ? "&" : "?") + "once=1", lastId ? { "Last-Event-ID": lastId } : {});
      body.events.forEach((e) => dispatch(e.event, e.data, e.id));
    } catch (e) { console.warn(e); }
    timer = setTimeout(poll, POLL_MS);
  }
  function fallback() {
    if (polling || closed) return;
    polling = true; if (es) es.close();
    document.body.dataset.live = "polling"; poll();
  }
  if (!window.EventSource) { fallback(); return { close() { closed = true; clearTimeout(timer); } }; }
  es = new EventSource(url);
  Object.keys(handlers).forEach((name) => es.addEventListener(name, (e) => {
    document.body.dataset.live = "sse"; dispatch(name, JSON.parse(e.data), e.lastEventId);
  }));
  es.addEventListener("logout", () => { es.close(); window.location.reload(); });
  es.addEventListener("failed", () => es.close());
  es.onopen = () => { opened = true; document.body.dataset.live = "sse"; };
  es.onerror = () => { if (!opened || es.readyState === EventSource.CLOSED) fallback(); };
  return { close() { closed = true; clearTimeout(timer); if (es) es.close(); } };
}

// drag across a chart to zoom into those steps; double-click to reset
function attachZoom(canvas, onZoom, onReset) {
  let start = null;
  const px = (e) => e.clientX - canvas.getBoundingClientRect().left;
  canvas.addEventListener("mousedown", (e) => { if (canvas._geom) start = px(e); });
  canvas.addEventListener("mousemove", (e) => {
    if (start === null) return;
    const g = canvas._geom, ctx = canvas.getContext("2d");
    canvas._redraw();
    ctx.fillStyle = "rgba(31, 119, 180, 0.15)";
    ctx.fillRect(Math.min(start, px(e)), 0, Math.abs(px(e) - start), g.h - PAD.B);
  });
  window.addEventListener("mouseup", (e) => {
    if (start === null) return;
    const g = canvas._geom, end = px(e), a = Math.min(start, end), b = Math.max(start, end);
    start = null;
    if (!g || b - a < 5) { canvas._redraw(); return; }
    const step = (p) => g.x0 + ((Math.max(g.L, Math.min(g.w - g.R, p)) - g.L) / (g.w - g.L - g.R)) * (g.x1 - g.x0);
    onZoom([step(a), step(b)]);
  });
  canvas.addEventListener("dblclick", onReset);
}

// which buttons the state allows (what ended offers none: they go)
function applyActions(id, actions) {
  const block = document.getElementById(id);
  if (!block || !actions) return;
  block.querySelectorAll("form[data-verb]").forEach((f) => {
    if (!actions.length) f.remove(); else f.hidden = !actions.includes(f.dataset.verb);
  });
  if (!block.children.length) block.remove();
}

// the trial page: one canvas per metric in a grid, the script's own metrics first and what the
// runtime reports by itself (step timing, communication, layer statistics) folded under
// "system"; zoom shared by all, logs of the chosen rank, its GPUs
function trialPage(root) {
  let last = null, zoom = null, zoomed = null, fetching = 0;
  const canvases = {};
  const reset = document.getElementById("zoom-reset");
  const prefixes = JSON.parse(root.dataset.systemPrefixes || "[]");
  const userGrid = document.getElementById("metric-charts") || root;
  const system = document.getElementById("system-charts");
  const systemGrid = system ? system.querySelector(".chart-grid") : root;
  const isSystem = (name) => prefixes.some((p) => name.startsWith(p));
  function render() {
    if (!last) return;
    const data = zoom && zoomed ? zoomed : last;
    const names = Object.keys(last.metrics);
    for (const name of names) {
      if (!canvases[name]) {
        const cell = document.createElement("div"); cell.className = "chart-cell";
        const title = document.createElement("div"); title.className = "chart-title"; title.textContent = name;
        const c = document.createElement("canvas"); c.className = "chart"; c.dataset.metric = name;
        cell.append(title, c);
        (isSystem(name) ? systemGrid : userGrid).append(cell);
        canvases[name] = c;
        c._redraw = () => draw(name);
        attachZoom(c, setZoom, () => setZoom(null));
      }
      draw(name);
    }
    if (system) {
      const n = names.filter(isSystem).length;
      system.hidden = n === 0;
      system.querySelector(".count").textContent = String(n);
    }
    const p = document.getElementById("points"); if (p) p.textContent = last.points + " points";
    const st = document.getElementById("trial-state"); if (st && last.state) st.textContent = last.state;
    applyActions("trial-actions", last.actions);
    root.dataset.zoom = zoom ? zoom.map((v) => Math.round(v)).join(",") : "";
    if (reset) reset.hidden = !zoom;
    root.dataset.ready = "1";
    function draw(name) {
      const s = data.metrics[name] || { x: [], y: [] };
      drawChart(canvases[name], [{ name, x: s.x, y: s.y }], { ...chartOptions(), xRange: zoom });
    }
  }
  // drawn while folded, a chart has no width: again when shown, or the window resizes
  if (system) system.addEventListener("toggle", render);
  window.addEventListener("resize", render);
  // first paint from the data in the page; the live stream follows with what arrives
  const seed = document.getElementById("chart-data");
  if (seed) { last = JSON.parse(seed.textContent); render(); }
  async function fetchZoom() {
    if (!zoom) return;
    const ticket = ++fetching;
    const q = new URLSearchParams({ x0: String(zoom[0]), x1: String(zoom[1]) });
    try {
      const body = await getJSON(root.dataset.src + "?" + q);
      if (ticket === fetching && zoom) { zoomed = body; render(); }
    } catch (e) { console.warn(e); }
  }
  function setZoom(range) { zoom = range; zoomed = null; render(); fetchZoom(); }
  if (reset) reset.addEventListener("click", () => setZoom(null));
  document.querySelectorAll(".logscale, .smoothing").forEach((el) => el.addEventListener("input", render));

  const pre = document.getElementById("log");
  let rank = 0, attempt = null, stream = null;
  function onLog(chunk) {
    if (chunk.rank !== rank) return;
    if (attempt !== null && chunk.attempt !== attempt) pre.textContent = "";
    attempt = chunk.attempt;
    pre.append(document.createTextNode(chunk.text));
    pre.dataset.rank = String(rank);
    if (document.getElementById("follow").checked) pre.scrollTop = pre.scrollHeight;
  }
  function open() {
    if (stream) stream.close();
    stream = live(root.dataset.live + "?rank=" + rank, {
      chart: (body) => { last = body; render(); fetchZoom(); },
      log: onLog,
      gpus: (body) => { const g = document.getElementById("trial-gpus"); if (g) g.innerHTML = body.html; },
      profiles: (body) => { const g = document.getElementById("profiles"); if (g) g.innerHTML = body.html; },
      timing: (body) => swap("trial-timing", body.html),
      attempts: (body) => swap("trial-attempts", body.html),
      alerts: (body) => swap("trial-alerts", body.html),
    });
  }
  document.querySelectorAll("button.rank").forEach((b) => b.addEventListener("click", () => {
    document.querySelectorAll("button.rank").forEach((o) => o.classList.remove("active"));
    b.classList.add("active");
    rank = parseInt(b.dataset.rank, 10); attempt = null; pre.textContent = ""; open();
  }));
  open();
}

function swap(id, html) {
  const el = document.getElementById(id);
  if (el) { el.innerHTML = html; el.dataset.updated = String(Date.now()); }
}

function curves(canvas) {
  const seed = document.getElementById("curves-data");
  let last = seed ? JSON.parse(seed.textContent) : null;
  function render() {
    if (!last) return;
    const series = Object.entries(last.series).map(([name, s]) => ({ name, x: s.x, y: s.y }));
    drawChart(canvas, series, chartOptions());
  }
  async function refresh() {
    try { last = await getJSON(canvas.dataset.src); render(); } catch (e) { console.warn(e); }
  }
  document.querySelectorAll(".logscale").forEach((el) => el.addEventListener("input", render));
  if (last) render(); else refresh();  // first paint from the data in the page
  setInterval(refresh, 10 * POLL_MS);  // metrics that change no trial's best value
  return refresh;
}

// parallel coordinates: an axis per varying hyperparameter, then the metric; a line per trial,
// coloured from worst (red) to best (blue)
function drawParcoords(canvas, pc) {
  const { ctx, w, h } = sizeCanvas(canvas, 360);
  const axes = pc.axes, n = axes.length, top = 34, bottom = h - 30, left = 70, right = w - 70;
  ctx.font = "11px system-ui"; ctx.fillStyle = "#6b7380";
  canvas.dataset.lines = String(pc.lines.length);
  if (!pc.lines.length) { ctx.fillText("no trial has a value of the metric yet", left, top + 20); canvas.dataset.drawn = "1"; return; }
  const ax = (i) => (n === 1 ? (left + right) / 2 : left + ((right - left) * i) / (n - 1));
  const unit = axes.map((a) => {
    if (a.kind === "category") return (v) => (a.ticks.length < 2 ? 0.5 : a.ticks.indexOf(String(v)) / (a.ticks.length - 1));
    const f = a.kind === "log" ? Math.log10 : (v) => v;
    const lo = f(a.min), hi = f(a.max);
    return (v) => (hi === lo ? 0.5 : (f(v) - lo) / (hi - lo));
  });
  const y = (u) => bottom - u * (bottom - top);
  const metric = unit[n - 1];
  const better = (v) => (pc.mode === "max" ? metric(v) : 1 - metric(v));
  const lines = pc.lines.slice().sort((a, b) => better(a.values[n - 1]) - better(b.values[n - 1]));
  ctx.lineWidth = 1.3;
  for (const line of lines) {
    const g = better(line.values[n - 1]);
    ctx.strokeStyle = `rgba(${Math.round(214 - 183 * g)}, ${Math.round(39 + 80 * g)}, ${Math.round(40 + 140 * g)}, 0.75)`;
    ctx.beginPath();
    let pen = false;
    line.values.forEach((v, i) => {
      const u = v === null || v === undefined ? NaN : unit[i](v);
      if (!isFinite(u) || u < 0) { pen = false; return; }
      if (pen) ctx.lineTo(ax(i), y(u)); else { ctx.moveTo(ax(i), y(u)); pen = true; }
    });
    ctx.stroke();
  }
  axes.forEach((a, i) => {
    const x = ax(i);
    ctx.strokeStyle = "#1d2430"; ctx.lineWidth = 1; ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, bottom); ctx.stroke();
    ctx.fillStyle = "#1d2430"; ctx.textAlign = "center";
    ctx.font = a.metric ? "bold 12px system-ui" : "12px system-ui";
    ctx.fillText(a.name + (a.kind === "log" ? " (log)" : ""), x, top - 14);
    ctx.font = "11px system-ui"; ctx.fillStyle = "#4b5563";
    const label = (v) => (typeof v === "number" && !Number.isInteger(v) ? Number(v).toPrecision(3) : String(v));
    if (a.kind === "category") a.ticks.forEach((t) => ctx.fillText(t, x, y(unit[i](t)) + 4));
    else { ctx.fillText(label(a.max), x, top - 2); ctx.fillText(label(a.min), x, bottom + 14); }
  });
  ctx.textAlign = "left";
  canvas.dataset.drawn = String(performance.now());
}

// the search's best-so-far: each trial's value (dots) and the running best (a step line), by the
// order the trials finished
function drawBestSoFar(canvas, data) {
  const series = [
    { name: "trial's value", x: data.x, y: data.values, dots: true },
    { name: "best so far", x: data.x, y: data.best, step: true },
  ];
  canvas.dataset.chart = JSON.stringify(data);
  drawChart(canvas, series, { log: false, smoothing: 0, margin: true, xWhole: true, xTitle: "trials, in the order they finished" });
  canvas.dataset.drawn = String(data.x.length);
}

function experimentPage(anchor) {
  const bsf = document.getElementById("best-so-far");
  const pc = document.getElementById("parcoords");
  const refreshCurves = document.getElementById("curves") ? curves(document.getElementById("curves")) : null;
  const table = document.getElementById("trials");
  live(anchor.dataset.live, {
    experiment: (body) => {
      const st = document.getElementById("experiment-state"); if (st) st.textContent = body.state;
      applyActions("experiment-actions", body.actions);
      if (table) { table.tBodies[0].innerHTML = body.trials_html; table.dataset.updated = String(Date.now()); }
      if (pc) { pc.dataset.chart = JSON.stringify(body.parcoords); drawParcoords(pc, body.parcoords); }
      if (bsf && body.best_so_far) drawBestSoFar(bsf, body.best_so_far);
      if (refreshCurves) refreshCurves();
    },
  });
}

function clusterPage(root) {
  live(root.dataset.live, {
    nodes: (body) => {
      // not while an admin types a reason; keep open histories open
      if (root.contains(document.activeElement) && document.activeElement.tagName === "INPUT") return;
      const open = Array.from(root.querySelectorAll("section.node")).filter((s) => s.querySelector("details[open]")).map((s) => s.dataset.node);
      root.innerHTML = body.html;
      open.forEach((id) => { const d = root.querySelector(`section.node[data-node="${CSS.escape(id)}"] details`); if (d) d.open = true; });
      root.dataset.updated = String(Date.now());
    },
  });
}

function queuePage(table) {
  live(table.dataset.live, {
    queue: (body) => {
      table.tBodies[0].innerHTML = body.html;
      const n = document.getElementById("queue-count"); if (n) n.textContent = String(body.count);
      table.dataset.updated = String(Date.now());
    },
  });
}

function experimentsPage(root) {
  live(root.dataset.live, {
    experiments: (body) => {
      root.innerHTML = body.html;
      const n = document.getElementById("experiments-count"); if (n) n.textContent = String(body.count);
      root.dataset.updated = String(Date.now());
    },
  });
}

function drawUsage(canvas, data) {
  const series = Object.entries(data.series).map(([name, s]) => ({ name, x: s.x, y: s.y }));
  drawChart(canvas, series, { log: false, smoothing: 0, xLabels: data.days });
}

function usagePage(root, canvas) {
  live(root.dataset.live, {
    usage: (body) => {
      root.innerHTML = body.html;
      const period = document.getElementById("usage-period"); if (period) period.textContent = body.period;
      if (canvas) { canvas.dataset.chart = JSON.stringify(body.chart); drawUsage(canvas, body.chart); }
      root.dataset.updated = String(Date.now());
    },
  });
}

function sortable(table) {
  table.querySelectorAll("th").forEach((th, col) => th.addEventListener("click", () => {
    const body = table.tBodies[0];
    const dir = th.dataset.dir === "asc" ? -1 : 1; th.dataset.dir = dir === 1 ? "asc" : "desc";
    const key = (tr) => { const t = tr.cells[col] ? tr.cells[col].textContent.trim() : ""; const n = parseFloat(t); return isNaN(n) ? t : n; };
    const rows = Array.from(body.rows).sort((a, b) => { const x = key(a), y = key(b); return (x > y ? 1 : x < y ? -1 : 0) * dir; });
    rows.forEach((r) => body.append(r));
  }));
}

document.addEventListener("DOMContentLoaded", () => {
  const charts = document.getElementById("charts"); if (charts) trialPage(charts);
  const pc = document.getElementById("parcoords");
  if (pc) drawParcoords(pc, JSON.parse(pc.dataset.chart));
  const bsf = document.getElementById("best-so-far"); if (bsf) drawBestSoFar(bsf, JSON.parse(bsf.dataset.chart));
  const exp = document.getElementById("experiment-live"); if (exp) experimentPage(exp);
  const nodes = document.getElementById("nodes"); if (nodes && nodes.dataset.live) clusterPage(nodes);
  const queue = document.getElementById("queue"); if (queue && queue.dataset.live) queuePage(queue);
  document.querySelectorAll("table.sortable").forEach(sortable);
  const list = document.getElementById("experiments-list"); if (list && list.dataset.live) experimentsPage(list);
  const usage = document.getElementById("usage-chart");
  if (usage) drawUsage(usage, JSON.parse(usage.dataset.chart));
  const usageTables = document.getElementById("usage-tables");
  if (usageTables && usageTables.dataset.live) usagePage(usageTables, usage);
  window.addEventListener("resize", () => { if (pc) drawParcoords(pc, JSON.parse(pc.dataset.chart)); });
});
