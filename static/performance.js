// The Machine Performance charts, drawn by the vendored Chart.js (static/vendor/, `make vendor`)
// from the series the page carries as JSON (#perf-series, #perf-frame; console/views/performance.py).
// Redrawn when htmx swaps the #performance region (live updates).
(function () {
  var charts = [];

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
    var span = frame.now - frame.since, hour = 3600 * 1000;
    var days = span > 26 * hour;
    // round UTC hours for the ticks: 1 h over 6 h, 4 h over a day, 12 h over 3 days, a day over a week
    var step = span <= 6 * hour ? hour : span <= 24 * hour ? 4 * hour : span <= 72 * hour ? 12 * hour : 24 * hour;
    var fg = css("--fg", "#1d1f23"), muted = css("--muted", "#6b7280"), grid = css("--line", "#d9dbe0");
    var accent = css("--accent", "#2456c7"), ok = css("--ok", "#127a3a"), warn = css("--warn", "#a15c00"), bad = css("--bad", "#b3261e");
    function make(id, datasets, opts) {
      var canvas = document.getElementById(id);
      if (!canvas) return;
      opts = opts || {};
      charts.push(new Chart(canvas, {
        type: "line",
        data: { datasets: datasets },
        options: {
          responsive: true, maintainAspectRatio: false, animation: false, parsing: false, normalized: true,
          interaction: { mode: "nearest", axis: "x", intersect: false },
          scales: {
            x: { type: "linear", min: frame.since, max: frame.now, grid: { color: grid },
                 afterBuildTicks: function (scale) {  // ticks on round UTC hours, not at the window's odd start
                   var ticks = [];
                   for (var v = Math.ceil(frame.since / step) * step; v <= frame.now; v += step) ticks.push({ value: v });
                   scale.ticks = ticks;
                 },
                 ticks: { color: muted, maxRotation: 0, callback: function (v) {
                   var iso = new Date(v).toISOString();
                   return days ? iso.slice(5, 10) + " " + iso.slice(11, 16) : iso.slice(11, 16);
                 } } },
            y: { beginAtZero: true, grid: { color: grid }, suggestedMax: opts.suggestedMax,
                 ticks: { color: muted, precision: opts.precision, callback: opts.yTick } }
          },
          plugins: {
            legend: { labels: { color: fg, usePointStyle: true, pointStyle: "line", boxWidth: 24 } },
            tooltip: { callbacks: { title: function (items) {
              return items.length ? new Date(items[0].parsed.x).toISOString().slice(0, 16).replace("T", " ") + " UTC" : "";
            } } }
          }
        }
      }));
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
  }

  document.addEventListener("DOMContentLoaded", draw);
  document.addEventListener("htmx:afterSettle", function (evt) {
    if (evt.detail && evt.detail.elt && evt.detail.elt.id === "performance") draw();
  });
})();
