// The theme before the first paint: light or dark as chosen in this browser (localStorage
// "warden-theme", set by the header's select in static/keys.js), else the system's. Loaded without
// defer in <head> so the page never flashes the other theme; a file, not an inline script, so the
// Content-Security-Policy needs no 'unsafe-inline' (docs/security.md).
try {
  var t = localStorage.getItem("warden-theme");
  if (t === "light" || t === "dark") document.documentElement.dataset.theme = t;
} catch (e) { /* storage off: the system's theme */ }
