// A rehearsal's charts, drawn by the vendored Chart.js (static/vendor/, `make vendor`) from the series
// the page carries as JSON (#rh-series, #rh-frame; console/views/rehearsals.py): queue and backlog, live
// capacity against the target, cumulative $, each with markers where approvals waited (triangles) and
// where an unsafe decision happened (crosses). Drawn again when htmx swaps the #rehearsal region in.
(function () {
  var charts = [];

  function json(id) {
    var el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }
  function css(name, fallback) {
    var v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return v || fallback;
  }
  function points(rows) {
    return rows.map(function (r) { return { x: r[0], y: r[1] }; });
  }
  function line(label, rows, color, extra) {
    var ds = { label: label, data: points(rows), borderColor: color, backgroundColor: color,
               borderWidth: 2, pointRadius: rows.length > 48 ? 0 : 2, spanGaps: false };
    for (var k in extra || {}) ds[k] = extra[k];
    return ds;
  }
  // markers sit on the x axis; their words show in the tooltip
  function marks(label, rows, color, style) {
    return { type: "scatter", label: label, borderColor: color, backgroundColor: color, pointStyle: style,
             pointRadius: 7, pointHoverRadius: 9, borderWidth: 2,
             data: rows.map(function (r) { return { x: r[0], y: 0, detail: r[1] }; }) };
  }
  function draw() {
    charts.forEach(function (c) { c.destroy(); });
    charts = [];
    var s = json("rh-series"), frame = json("rh-frame");
    if (!s || !frame || !window.Chart) return;
    var span = frame.end - frame.start;
    var step = span <= 6 ? 1 : span <= 24 ? 4 : span <= 72 ? 12 : 24;
    var fg = css("--fg", "#1d1f23"), muted = css("--muted", "#6b7280"), grid = css("--line", "#d9dbe0");
    var accent = css("--accent", "#2456c7"), ok = css("--ok", "#127a3a"), warn = css("--warn", "#a15c00"), bad = css("--bad", "#b3261e");
    function withMarks(datasets) {
      if (s.approval.length) datasets.push(marks("approval waited", s.approval, accent, "triangle"));
      if (s.unsafe.length) datasets.push(marks("unsafe decision", s.unsafe, bad, "crossRot"));
      return datasets;
    }
    function make(id, datasets, opts) {
      var canvas = document.getElementById(id);
      if (!canvas) return;
      opts = opts || {};
      charts.push(new Chart(canvas, {
        type: "line",
        data: { datasets: withMarks(datasets) },
        options: {
          responsive: true, maintainAspectRatio: false, animation: false, parsing: false, normalized: true,
          interaction: { mode: "nearest", axis: "x", intersect: false },
          scales: {
            x: { type: "linear", min: frame.start, max: frame.end, grid: { color: grid },
                 afterBuildTicks: function (scale) {  // whole hours from the day's start
                   var ticks = [];
                   for (var v = frame.start; v <= frame.end; v += step) ticks.push({ value: v });
                   scale.ticks = ticks;
                 },
                 ticks: { color: muted, maxRotation: 0, callback: function (v) { return v + " h"; } } },
            y: { beginAtZero: true, grid: { color: grid }, ticks: { color: muted, precision: opts.precision, callback: opts.yTick } }
          },
          plugins: {
            legend: { labels: { color: fg, usePointStyle: true, boxWidth: 24 } },
            tooltip: { callbacks: {
              title: function (items) { return items.length ? "hour " + items[0].parsed.x.toFixed(2) : ""; },
              label: function (ctx) {
                if (ctx.raw && ctx.raw.detail) return ctx.dataset.label + ": " + ctx.raw.detail;
                return ctx.dataset.label + ": " + (opts.yTick ? opts.yTick(ctx.parsed.y) : ctx.parsed.y);
              }
            } }
          }
        }
      }));
    }
    make("chart-rh-queue", [line("queued", s.queued, warn, { stepped: true }), line("backlog", s.backlog, muted, { stepped: true })],
         { precision: 0 });
    var known = s.capacity.some(function (p) { return p[1] !== null; });
    make("chart-rh-capacity", [
      known ? line("live capacity (proofs/hr)", s.capacity, accent, { stepped: true })
            : line("live workers", s.live_workers, accent, { stepped: true }),
      line("proofs delivered", s.proofs, ok, { stepped: true }),
      line("target (proofs/hr)", s.target, bad, { borderDash: [6, 4], stepped: true, pointRadius: 0 })
    ], { precision: 0 });
    make("chart-rh-spend", [line("$ spent", s.spend_cum, accent)], { yTick: function (v) { return "$" + v; } });
  }

  document.addEventListener("DOMContentLoaded", draw);
  document.addEventListener("htmx:afterSettle", function () {
    var canvas = document.getElementById("chart-rh-queue");
    if (canvas && window.Chart && !Chart.getChart(canvas)) draw();  // the region came back with new canvases
  });
})();
