// trainhub dashboard: canvas charts of downsampled series and live polling. No library.
"use strict";
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
const POLL_MS = 2000;

function smooth(ys, alpha) {
  if (!alpha) return ys;
  const out = new Array(ys.length);
  let acc = ys[0];
  for (let i = 0; i < ys.length; i++) { acc = alpha * acc + (1 - alpha) * ys[i]; out[i] = acc; }
  return out;
}

// series: [{name, x: [...], y: [...]}]
function drawChart(canvas, series, opts) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 1000, h = canvas.clientHeight || 320;
  canvas.width = w * dpr; canvas.height = h * dpr;
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const log = opts.log;
  const f = (v) => (log ? (v > 0 ? Math.log10(v) : NaN) : v);
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  const prepared = series.map((s) => {
    const ys = smooth(s.y, opts.smoothing).map(f);
    for (let i = 0; i < s.x.length; i++) {
      if (s.x[i] < x0) x0 = s.x[i]; if (s.x[i] > x1) x1 = s.x[i];
      if (ys[i] < y0) y0 = ys[i]; if (ys[i] > y1) y1 = ys[i];
    }
    return { name: s.name, x: s.x, y: ys };
  });
  const L = 60, R = 10, T = 10, B = 28;
  ctx.font = "11px system-ui"; ctx.fillStyle = "#6b7380"; ctx.strokeStyle = "#e3e6ea";
  if (!isFinite(x0) || !isFinite(y0)) { ctx.fillText("no data yet", L, T + 20); return; }
  if (x1 === x0) x1 = x0 + 1; if (y1 === y0) { y1 = y0 + 1; y0 = y0 - 1; }
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (w - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (h - T - B);
  for (let i = 0; i <= 4; i++) {
    const yv = y0 + ((y1 - y0) * i) / 4, py = sy(yv);
    ctx.beginPath(); ctx.moveTo(L, py); ctx.lineTo(w - R, py); ctx.stroke();
    ctx.fillText((log ? Math.pow(10, yv) : yv).toPrecision(3), 4, py + 4);
    const xv = x0 + ((x1 - x0) * i) / 4;
    const label = opts.xLabels ? (opts.xLabels[Math.round(xv)] || "") : Math.round(xv).toString();
    ctx.textAlign = i === 0 ? "left" : i === 4 ? "right" : "center";
    ctx.fillText(label, sx(xv), h - 8);
    ctx.textAlign = "left";
  }
  prepared.forEach((s, k) => {
    ctx.strokeStyle = COLORS[k % COLORS.length]; ctx.lineWidth = 1.2; ctx.beginPath();
    let pen = false;
    for (let i = 0; i < s.x.length; i++) {
      const v = s.y[i];
      if (!isFinite(v)) { pen = false; continue; }
      if (pen) ctx.lineTo(sx(s.x[i]), sy(v)); else { ctx.moveTo(sx(s.x[i]), sy(v)); pen = true; }
    }
    ctx.stroke();
    if (prepared.length > 1) { ctx.fillStyle = ctx.strokeStyle; ctx.fillText(s.name, w - R - 90, T + 12 + 13 * k); }
  });
  canvas.dataset.drawn = String(performance.now());
}

function chartOptions() {
  const log = document.querySelector(".logscale");
  const sm = document.querySelector(".smoothing");
  return { log: !!(log && log.checked), smoothing: sm ? parseFloat(sm.value) : 0 };
}

async function getJSON(url) {
  const r = await fetch(url, { credentials: "same-origin" });
  if (!r.ok) throw new Error(url + ": " + r.status);
  return r.json();
}

// the trial page: one canvas per metric
function trialCharts(root) {
  let last = null;
  const canvases = {};
  function render() {
    if (!last) return;
    for (const [name, s] of Object.entries(last.metrics)) {
      if (!canvases[name]) {
        const title = document.createElement("div"); title.className = "chart-title"; title.textContent = name;
        const c = document.createElement("canvas"); c.className = "chart"; c.dataset.metric = name;
        root.append(title, c); canvases[name] = c;
      }
      drawChart(canvases[name], [{ name, x: s.x, y: s.y }], chartOptions());
    }
    const p = document.getElementById("points"); if (p) p.textContent = last.points + " points";
    const st = document.getElementById("trial-state"); if (st && last.state) st.textContent = last.state;
    root.dataset.ready = "1";
  }
  async function poll() {
    try { last = await getJSON(root.dataset.src); render(); } catch (e) { console.warn(e); }
    if (!last || !["COMPLETED", "FAILED", "CANCELED", "PRUNED", "ERROR"].includes(last.state)) setTimeout(poll, POLL_MS);
  }
  document.querySelectorAll(".logscale, .smoothing").forEach((el) => el.addEventListener("input", render));
  poll();
}

function curves(canvas) {
  let last = null;
  function render() {
    if (!last) return;
    const series = Object.entries(last.series).map(([name, s]) => ({ name, x: s.x, y: s.y }));
    drawChart(canvas, series, chartOptions());
  }
  async function poll() {
    try { last = await getJSON(canvas.dataset.src); render(); } catch (e) { console.warn(e); }
    setTimeout(poll, POLL_MS * 2);
  }
  document.querySelectorAll(".logscale").forEach((el) => el.addEventListener("input", render));
  poll();
}

function logs(pre) {
  let rank = 0, offset = 0, attempt = null, timer = null;
  async function poll() {
    clearTimeout(timer);
    try {
      const q = new URLSearchParams({ rank: String(rank), offset: String(offset) });
      if (attempt) q.set("attempt", String(attempt));
      const chunk = await getJSON(pre.dataset.src + "?" + q);
      attempt = chunk.attempt || null;
      if (chunk.text) {
        pre.append(document.createTextNode(chunk.text));
        if (document.getElementById("follow").checked) pre.scrollTop = pre.scrollHeight;
      }
      offset = chunk.next_offset;
      pre.dataset.rank = String(rank);
      if (chunk.complete && !chunk.text) return;
    } catch (e) { console.warn(e); }
    timer = setTimeout(poll, chunk_delay());
  }
  const chunk_delay = () => POLL_MS / 2;
  document.querySelectorAll("button.rank").forEach((b) => b.addEventListener("click", () => {
    document.querySelectorAll("button.rank").forEach((o) => o.classList.remove("active"));
    b.classList.add("active");
    rank = parseInt(b.dataset.rank, 10); offset = 0; attempt = null; pre.textContent = ""; poll();
  }));
  if (document.querySelector("button.rank")) poll();
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
  const charts = document.getElementById("charts"); if (charts) trialCharts(charts);
  const c = document.getElementById("curves"); if (c) curves(c);
  const pre = document.getElementById("log"); if (pre) logs(pre);
  document.querySelectorAll("table.sortable").forEach(sortable);
  const usage = document.getElementById("usage-chart");
  if (usage) {
    const data = JSON.parse(usage.dataset.chart);
    const series = Object.entries(data.series).map(([name, s]) => ({ name, x: s.x, y: s.y }));
    drawChart(usage, series, { log: false, smoothing: 0, xLabels: data.days });
  }
});
