// Warden console live updates (htmx 2 ws extension: the socket names regions, the page re-fetches them).
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
    if (msg && msg.chat) streamed(msg.chat);
  });

  // The chat answer as it streams: {"chat": {run, turn, text, tools}} frames (agent/chat_stream.py),
  // gathered per run and turn and shown in the run's live bubble (#chat-live-N) after the turns it
  // already shows from the database (data-turns). A re-fetch of the chat log redraws them.
  var streams = {};
  var asked = {};
  function streamed(f) {
    var runs = streams[f.run] = streams[f.run] || {};
    var t = runs[f.turn] = runs[f.turn] || {text: "", tools: []};
    t.text += f.text || "";
    t.tools = t.tools.concat(f.tools || []);
    if (!drawStream(f.run) && !asked[f.run]) {
      asked[f.run] = true; // the bubble is not on the page yet: fetch the chat log once
      htmx.trigger(document.body, "chat-changed");
    }
  }
  function drawStream(run) {
    var bubble = document.getElementById("chat-live-" + run);
    if (!bubble) return false;
    var box = bubble.querySelector(".streaming");
    var shown = parseInt(bubble.dataset.turns, 10);
    box.textContent = "";
    Object.keys(streams[run] || {}).map(Number).sort(function (a, b) { return a - b; }).forEach(function (turn) {
      if (turn <= shown) return;
      var t = streams[run][turn];
      if (t.text) {
        var p = document.createElement("div");
        p.className = "text";
        p.textContent = t.text;
        box.appendChild(p);
      }
      if (t.tools.length) {
        var ul = document.createElement("ul");
        ul.className = "chat-calls";
        t.tools.forEach(function (name) {
          var li = document.createElement("li");
          li.className = "chat-call outcome-pending";
          li.textContent = "⚙ " + name + " → proposed";
          ul.appendChild(li);
        });
        box.appendChild(ul);
      }
    });
    var log = document.getElementById("chat-log");
    if (log) log.scrollTop = log.scrollHeight;
    return true;
  }
  document.addEventListener("htmx:afterSwap", function (evt) {
    if (!evt.detail.target || evt.detail.target.id !== "chat-log") return;
    evt.detail.target.querySelectorAll(".msg-live").forEach(function (b) { drawStream(b.dataset.run); });
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

  // Live updates must not fight the user: a region with a text field being typed into (a reject
  // comment, an ack comment, a reason) skips its re-fetch; the next signal or the periodic poll
  // after the form is sent brings it up to date.
  function typing(region) {
    // a ticked box (bulk approve) is a selection in progress too
    if (region.querySelector("input[type=checkbox]:checked")) return true;
    var fields = region.querySelectorAll("input[type=text], input[type=search], textarea, select");
    for (var i = 0; i < fields.length; i++) {
      var f = fields[i];
      if (f === document.activeElement) return true;
      if ((f.tagName !== "SELECT") && f.value && f.defaultValue !== f.value) return true;
    }
    return false;
  }
  document.addEventListener("htmx:beforeRequest", function (evt) {
    var elt = evt.detail.elt;
    if (elt && elt.classList && elt.classList.contains("region") && evt.detail.requestConfig.verb === "get" && typing(elt)) {
      evt.preventDefault();
    }
  });

  // Approval expiry countdowns: "expires in 12 min" → "expired", every second, from data-expires.
  function fmt(s) {
    if (s < 90) return Math.floor(s) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min";
    var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
    return h + " h" + (m ? " " + m + " min" : "");
  }
  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-expires]").forEach(function (el) {
      var left = (Date.parse(el.dataset.expires) - now) / 1000;
      if (left <= 0) {
        el.textContent = "expired";
        var card = el.closest(".approval");
        if (card) { card.classList.add("approval-lapsed"); card.querySelectorAll(".decide button").forEach(function (b) { b.disabled = true; }); }
      } else {
        el.textContent = "expires in " + fmt(left);
      }
    });
  }
  setInterval(tick, 1000);

  // A form with an empty required field is never sent silently: the browser says which field
  // (htmx 2 skips the request without a word otherwise).
  htmx.config.reportValidityOfForms = true;

  // Freshness labels ("read 12 s ago") keep counting between pushes: data-age is the age in
  // seconds when the server drew it; the browser adds the time since it got it (no clock skew).
  function ages() {
    var now = Date.now();
    document.querySelectorAll("[data-age]").forEach(function (el) {
      if (!el.dataset.seen) el.dataset.seen = String(now);
      var s = parseFloat(el.dataset.age) + (now - parseInt(el.dataset.seen, 10)) / 1000;
      if (!isNaN(s)) el.textContent = (el.dataset.prefix || "") + fmt(Math.max(0, s)) + " ago";
    });
  }
  setInterval(ages, 1000);

  // An action's one-line answer ("observe cycle queued (run 12)") is news, not state: it goes
  // after data-ttl seconds (the run, the audit log and the page keep the lasting record).
  function expireFlashes() {
    var now = Date.now();
    document.querySelectorAll("[data-ttl]").forEach(function (el) {
      if (!el.dataset.shown) el.dataset.shown = String(now);
      if (now - parseInt(el.dataset.shown, 10) > parseFloat(el.dataset.ttl) * 1000) el.remove();
    });
  }
  setInterval(expireFlashes, 1000);
})();

// Alerts tab: "select every firing alert" ticks each row's checkbox (they belong to #bulk-ack).
document.addEventListener("change", function (evt) {
  if (evt.target.id !== "alerts-select-all") return;
  document.querySelectorAll(".alert-pick:not([disabled])").forEach(function (box) { box.checked = evt.target.checked; });
});

// Approvals inbox: "select all" ticks every enabled approval's checkbox (they belong to #bulk-form).
document.addEventListener("change", function (evt) {
  if (evt.target.id !== "bulk-all") return;
  document.querySelectorAll(".bulk-pick:not(:disabled)").forEach(function (box) { box.checked = evt.target.checked; });
});
