// The Machine Performance charts, drawn by the vendored Chart.js (static/vendor/, `make vendor`)
// from the series the page carries as JSON (#perf-series, #perf-frame; console/views/performance.py).
// Redrawn when htmx swaps the #performance region (live updates).
// Drag across a chart to zoom its time axis (the vendored chartjs-plugin-zoom, drag mode, no
// Hammer.js): the four charts share one time range, like a Grafana dashboard's panels, and keep it
// across live redraws; "Reset zoom" or a double-click on a chart returns to the whole window.
(function () {
  var charts = [];
  var view = null;       // the zoomed time range {min, max} in epoch ms, or null: the whole window
  var syncing = false;   // set while one chart's zoom is copied to the others
  var days = false;      // the window is longer than a day: times carry their date
  var MINUTE = 60 * 1000;
  // tick steps on round UTC times: the smallest giving at most 8 ticks over the visible range
  var STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 240, 360, 720, 1440].map(function (m) { return m * MINUTE; });

  function json(id) {
    var el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }
  function points(rows) {
    return rows.map(function (r) { return { x: r[0], y: r[1] }; });
  }
  function css(name, fallback) {
    var v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return v || fallback;
  }
  function line(label, rows, color, extra) {
    var ds = { label: label, data: points(rows), borderColor: color, backgroundColor: color,
               borderWidth: 2, pointRadius: rows.length > 60 ? 0 : 2, spanGaps: false };
    for (var k in extra || {}) ds[k] = extra[k];
    return ds;
  }
  function capLine(label, value, frame, color) {
    return line(label, [[frame.since, value], [frame.now, value]], color, { borderDash: [6, 4], pointRadius: 0 });
  }
  function draw() {
    charts.forEach(function (c) { c.destroy(); });
    charts = [];
    var s = json("perf-series"), frame = json("perf-frame");
    if (!s || !frame || !window.Chart) return;
    days = frame.now - frame.since > 26 * 60 * MINUTE;
    var fg = css("--fg", "#1d1f23"), muted = css("--muted", "#6b7280"), grid = css("--line", "#d9dbe0");
    var accent = css("--accent", "#2456c7"), ok = css("--ok", "#127a3a"), warn = css("--warn", "#a15c00"), bad = css("--bad", "#b3261e");
    function make(id, datasets, opts) {
      var canvas = document.getElementById(id);
      if (!canvas) return;
      opts = opts || {};
      var chart = new Chart(canvas, {
        type: "line",
        data: { datasets: datasets },
        options: {
          responsive: true, maintainAspectRatio: false, animation: false, parsing: false, normalized: true,
          interaction: { mode: "nearest", axis: "x", intersect: false },
          scales: {
            x: { type: "linear", min: frame.since, max: frame.now, grid: { color: grid },
                 afterBuildTicks: function (scale) {  // ticks on round UTC times, not at the range's odd start
                   var step = tickStep(scale.max - scale.min), ticks = [];
                   for (var v = Math.ceil(scale.min / step) * step; v <= scale.max; v += step) ticks.push({ value: v });
                   scale.ticks = ticks;
                 },
                 ticks: { color: muted, maxRotation: 0, callback: function (v) {
                   var iso = new Date(v).toISOString();
                   return this.max - this.min > 26 * 60 * MINUTE ? iso.slice(5, 10) + " " + iso.slice(11, 16) : iso.slice(11, 16);
                 } } },
            y: { beginAtZero: true, grid: { color: grid }, suggestedMax: opts.suggestedMax,
                 ticks: { color: muted, precision: opts.precision, callback: opts.yTick } }
          },
          plugins: {
            legend: { labels: { color: fg, usePointStyle: true, pointStyle: "line", boxWidth: 24 } },
            tooltip: { callbacks: { title: function (items) {
              return items.length ? new Date(items[0].parsed.x).toISOString().slice(0, 16).replace("T", " ") + " UTC" : "";
            } } },
            zoom: {
              zoom: { mode: "x", onZoomComplete: function (ctx) { share(ctx.chart); },
                      drag: { enabled: true, threshold: 8, borderWidth: 1, borderColor: accent,
                              backgroundColor: "rgba(36, 86, 199, 0.15)" } },
              limits: { x: { min: "original", max: "original", minRange: MINUTE } }
            }
          }
        }
      });
      canvas.addEventListener("dblclick", resetAll);
      charts.push(chart);
    }
    make("chart-proofs", [
      line("proofs/hr", s.proofs_hr, accent),
      line("target", s.target, ok, { borderDash: [6, 4], stepped: true, pointRadius: 0 })
    ]);
    make("chart-queue", [line("queued", s.queued, warn), line("backlog", s.backlog, muted)], { precision: 0 });
    make("chart-fleet", [
      line("instances", s.instances, accent, { stepped: true }),
      line("running", s.running, ok, { stepped: true }),
      capLine("instance cap", frame.max_instances, frame, bad)
    ], { precision: 0 });
    make("chart-dph", [
      line("$/hr", s.dph, accent, { stepped: true }),
      capLine("$/hr cap", frame.max_dph, frame, bad)
    ], { yTick: function (v) { return "$" + v; } });
    if (view) {  // a live redraw keeps the operator's zoom (clipped to the new window)
      var min = Math.max(view.min, frame.since), max = Math.min(view.max, frame.now);
      view = max - min >= MINUTE ? { min: min, max: max } : null;
      if (view) charts.forEach(function (c) { c.zoomScale("x", view, "none"); });
    }
    showRange();
  }

  function tickStep(span) {
    for (var i = 0; i < STEPS.length; i++) if (span / STEPS[i] <= 8) return STEPS[i];
    return STEPS[STEPS.length - 1];
  }
  function stamp(ms) { return new Date(ms).toISOString().slice(days ? 5 : 11, 16).replace("T", " "); }
  // one chart was zoomed (dragged) or reset: the others follow
  function share(chart) {
    if (syncing) return;
    syncing = true;
    try {
      var zoomed = chart.isZoomedOrPanned();
      view = zoomed ? { min: chart.scales.x.min, max: chart.scales.x.max } : null;
      charts.forEach(function (c) {
        if (c === chart) return;
        if (view) c.zoomScale("x", view, "none"); else c.resetZoom("none");
      });
    } finally { syncing = false; }
    showRange();
  }
  function resetAll() {
    view = null;
    syncing = true;
    try { charts.forEach(function (c) { c.resetZoom("none"); }); } finally { syncing = false; }
    showRange();
  }
  function showRange() {
    var button = document.getElementById("zoom-reset"), label = document.getElementById("zoom-range");
    if (button) button.hidden = !view;
    if (label) label.textContent = view
      ? "zoomed to " + stamp(view.min) + "–" + stamp(view.max) + " UTC"
      : "";
  }

  document.addEventListener("DOMContentLoaded", draw);
  document.addEventListener("click", function (evt) {
    if (evt.target.closest && evt.target.closest("#zoom-reset")) resetAll();
  });
  document.addEventListener("htmx:afterSettle", function (evt) {
    if (evt.detail && evt.detail.elt && evt.detail.elt.id === "performance") draw();
  });
})();
