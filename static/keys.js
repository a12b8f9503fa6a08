// Warden console keyboard and theme (docs/operations.md, Keyboard and theme: Langfuse-style J/K).
//
// Keys, ignored while typing in a field or with Ctrl/Alt/Meta:
//   j / k   next / previous item of the page's lists: approval cards first, then table rows
//   a       approve the current approval card (on a decided one: says why nothing happened)
//   r       reject the current approval card: focuses its comment box (Enter sends; a comment is required)
//   Enter   open the current row's first link
//   /       focus the page's search box
//   ?       show or hide this list;  Esc leaves a field or closes the list
// The current item survives a live re-fetch of its region (kept by id, else by position); once the
// current approval card is decided the cursor moves to the next waiting card.
//
// Theme: system (follows the OS), light or dark, remembered per browser in localStorage
// ("warden-theme"); the <head> sets it before the first paint, the header's select changes it.
(function () {
  var ITEMS = "article.approval, [data-key-item], main table.grid tbody tr";
  var currentId = null, currentIndex = -1;
  // the current item was a waiting approval card, and its place among the waiting ones: after it is
  // decided (its card redrawn as decided, then moved to "Recently decided") the cursor goes to the
  // next waiting card instead of following it
  var wasWaiting = false, waitingIndex = -1;
  function waitingCards() {
    return Array.prototype.filter.call(document.querySelectorAll("article.approval.approval-waiting"), function (el) {
      return el.offsetParent !== null;
    });
  }
  // a one-line answer to a key that did nothing ("approval 3 is rejected: nothing to approve")
  function say(text) {
    var box = document.getElementById("key-note");
    if (!box) {
      box = document.createElement("p");
      box.id = "key-note";
      box.className = "key-note";
      box.setAttribute("role", "status");
      box.dataset.ttl = "6";
      var main = document.querySelector("main");
      if (!main) return;
      main.insertBefore(box, main.firstChild);
    }
    box.textContent = text;
    box.dataset.shown = String(Date.now());
  }

  function items() {
    var all = Array.prototype.filter.call(document.querySelectorAll(ITEMS), function (el) {
      return el.offsetParent !== null; // visible only
    });
    // approval cards first, whatever their place in the page (the dashboard's inbox follows its fleet table)
    var cards = all.filter(function (el) { return el.matches("article.approval"); });
    return cards.concat(all.filter(function (el) { return cards.indexOf(el) < 0; }));
  }
  function keyOf(el) { return el.id || null; }
  function mark(list, i) {
    document.querySelectorAll(".key-current").forEach(function (el) {
      el.classList.remove("key-current");
      el.removeAttribute("aria-current");
    });
    if (i < 0 || i >= list.length) { currentId = null; currentIndex = -1; return null; }
    var el = list[i];
    el.classList.add("key-current");
    el.setAttribute("aria-current", "true");
    if (!el.hasAttribute("tabindex")) el.setAttribute("tabindex", "-1");
    el.focus({preventScroll: true});
    el.scrollIntoView({block: "nearest"});
    currentId = keyOf(el);
    currentIndex = i;
    wasWaiting = el.matches("article.approval.approval-waiting");
    waitingIndex = wasWaiting ? waitingCards().indexOf(el) : -1;
    return el;
  }
  function current() {
    var list = items();
    if (currentId) {
      var byId = document.getElementById(currentId);
      if (byId && list.indexOf(byId) >= 0) return {list: list, i: list.indexOf(byId)};
    }
    return {list: list, i: Math.min(currentIndex, list.length - 1)};
  }
  function move(step) {
    var c = current();
    if (!c.list.length) return;
    var i = c.i < 0 ? (step > 0 ? 0 : c.list.length - 1) : Math.max(0, Math.min(c.list.length - 1, c.i + step));
    mark(c.list, i);
  }
  function currentEl() {
    var c = current();
    return c.i >= 0 ? c.list[c.i] : null;
  }
  function help(show) {
    var box = document.getElementById("key-help");
    if (!box) return;
    box.hidden = show === undefined ? !box.hidden : !show;
  }
  function typing(target) {
    return target && (target.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(target.tagName));
  }

  document.addEventListener("keydown", function (evt) {
    if (evt.ctrlKey || evt.metaKey || evt.altKey) return;
    if (typing(evt.target)) {
      if (evt.key === "Escape") evt.target.blur();
      return;
    }
    var el;
    switch (evt.key) {
      case "j": move(1); break;
      case "k": move(-1); break;
      case "a":
        el = currentEl();
        var approve = el && el.querySelector("button.approve:not([disabled])");
        if (!approve) {
          if (el && el.matches("article.approval")) {
            var st = el.querySelector("header .status");
            say("approval " + el.dataset.approval + " is " + (st ? st.textContent.trim() : "decided") +
                ": nothing to approve (j / k to a waiting card)");
            break;
          }
          return;
        }
        approve.click();
        break;
      case "r":
        el = currentEl();
        var box = el && el.querySelector(".reject-form input[name=comment]:not([disabled])");
        if (!box) return;
        box.focus();
        break;
      case "Enter":
        el = currentEl();
        var link = el && el.tagName === "TR" && el.querySelector("a[href]");
        if (!link) return;
        link.click();
        break;
      case "/":
        var search = document.querySelector("main input[type=search], main [data-search]");
        if (!search) return;
        search.focus();
        if (search.select) search.select();
        break;
      case "?": help(); break;
      case "Escape": help(false); break;
      default: return;
    }
    evt.preventDefault();
  });
  // a live re-fetch replaces the elements: mark the current item again
  document.addEventListener("htmx:afterSettle", function () {
    if (currentIndex < 0) return;
    var now = currentId && document.getElementById(currentId);
    if (wasWaiting && (!now || !now.matches("article.approval.approval-waiting"))) {
      // the current card was just decided (or went away): on to the next waiting card, if any
      var cards = waitingCards();
      if (cards.length) {
        var list = items();
        mark(list, list.indexOf(cards[Math.max(0, Math.min(waitingIndex, cards.length - 1))]));
        return;
      }
      wasWaiting = false;
    }
    var c = current();
    if (c.i >= 0) {
      var el = c.list[c.i];
      if (!el.classList.contains("key-current")) {
        el.classList.add("key-current");
        el.setAttribute("aria-current", "true");
      }
    }
  });

  // --- theme ----------------------------------------------------------------------------------
  function applyTheme(value) {
    if (value === "light" || value === "dark") document.documentElement.dataset.theme = value;
    else delete document.documentElement.dataset.theme;
  }
  document.addEventListener("DOMContentLoaded", function () {
    // the phone header's menu button: folds the navigation, the theme and the user line away
    var menu = document.getElementById("nav-toggle");
    if (menu) {
      menu.hidden = false;
      menu.addEventListener("click", function () {
        var bar = menu.closest(".topbar");
        var open = !bar.classList.contains("open");
        bar.classList.toggle("open", open);
        menu.setAttribute("aria-expanded", open ? "true" : "false");
      });
    }
    var toggle = document.getElementById("key-help-toggle");
    if (toggle) {
      toggle.hidden = false;
      toggle.addEventListener("click", function () { help(); });
    }
    var select = document.getElementById("theme-select");
    if (!select) return;
    document.getElementById("theme-control").hidden = false;
    var saved = null;
    try { saved = localStorage.getItem("warden-theme"); } catch (e) { /* storage off: system */ }
    select.value = saved === "light" || saved === "dark" ? saved : "system";
    select.addEventListener("change", function () {
      try {
        if (select.value === "system") localStorage.removeItem("warden-theme");
        else localStorage.setItem("warden-theme", select.value);
      } catch (e) { /* storage off: this page only */ }
      applyTheme(select.value);
    });
  });
})();
