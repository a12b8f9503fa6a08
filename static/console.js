// Warden console live updates (htmx 2 ws extension; reference/console-ux.md §3.4).
// The server pushes {"trigger": "<topic>"}; we fire that event on <body> and the regions listening
// for it re-fetch their own partial. On (re)connect and when the tab becomes visible every region
// re-fetches ("console-resync"), since the channel layer does not replay missed signals.
(function () {
  function pill(state, text) {
    var p = document.getElementById("live-pill");
    if (p) { p.dataset.state = state; p.textContent = text || state; }
  }
  function resync() { htmx.trigger(document.body, "console-resync"); }
  document.addEventListener("htmx:wsBeforeMessage", function (evt) {
    evt.preventDefault(); // signals only: never swap the frame into the page
    var msg;
    try { msg = JSON.parse(evt.detail.message); } catch (e) { return; }
    if (msg && msg.trigger) htmx.trigger(document.body, msg.trigger);
  });
  document.addEventListener("htmx:wsConnecting", function () { pill("connecting"); });
  document.addEventListener("htmx:wsOpen", function () { pill("live"); resync(); });
  document.addEventListener("htmx:wsClose", function (evt) {
    var code = evt.detail.event.code;
    if (code === 4401) { pill("signed-out", "signed out"); return; }
    pill("offline", "offline (" + code + ")");
    // htmx 2 retries only 1006/1011/1012/1013; a normal close (daphne's timeout) must reconnect too
    if (code === 1000 || code === 1001) {
      setTimeout(function () { evt.detail.socketWrapper.reconnect(); }, 500 + Math.random() * 2000);
    }
  });
  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "visible") resync();
  });
})();
