/* django_dispatch console: live refresh and relative times for the admin pages.
 *
 * No framework and no CDN (many admins run offline): every few seconds the
 * page's own URL is fetched again and each element marked data-dispatch-live
 * is replaced by the element with the same id in the fresh copy, so counts
 * move without a reload. Refreshing stops while the tab is hidden (no load
 * on the database for nobody) and while the operator is in the middle of
 * something on the page (rows ticked, an action chosen, focus in a form
 * field), so a refresh never throws away a selection.
 *
 * <time class="dispatch-age" data-age="12.3"> elements say "12 s ago"; their
 * age was measured on the server's clock, and is advanced here by the time
 * elapsed since the page (or fragment) arrived.
 */
(function () {
  "use strict";
  var INTERVAL = 5000;
  var timer = null;
  var loadedAt = Date.now();

  function human(seconds) {
    if (seconds < 1) return Math.round(seconds * 1000) + " ms";
    if (seconds < 10) return seconds.toFixed(1) + " s";
    if (seconds < 60) return Math.round(seconds) + " s";
    var minutes = Math.floor(seconds / 60), secs = Math.floor(seconds % 60);
    if (minutes < 60) return minutes + " min" + (secs ? " " + secs + " s" : "");
    var hours = Math.floor(minutes / 60);
    minutes = minutes % 60;
    if (hours < 48) return hours + " h" + (minutes ? " " + minutes + " min" : "");
    var days = Math.floor(hours / 24);
    hours = hours % 24;
    return days + " d" + (hours ? " " + hours + " h" : "");
  }

  function tick() {
    var elapsed = (Date.now() - loadedAt) / 1000;
    document.querySelectorAll("time.dispatch-age[data-age]").forEach(function (el) {
      var age = parseFloat(el.getAttribute("data-age")) + elapsed;
      el.textContent =
        Math.abs(age) < 2 ? "just now" : age > 0 ? human(age) + " ago" : "in " + human(-age);
    });
  }

  function busy() {
    if (document.querySelector('input[name="_selected_action"]:checked')) return true;
    var action = document.querySelector('select[name="action"]');
    if (action && action.value) return true;
    var focused = document.activeElement;
    return !!(focused && /^(INPUT|SELECT|TEXTAREA)$/.test(focused.tagName) && focused.type !== "checkbox");
  }

  function setState(text) {
    document.querySelectorAll(".dispatch-live-state").forEach(function (el) {
      el.textContent = text;
    });
  }

  function refresh() {
    if (document.hidden) return;
    if (busy()) {
      setState("(live updates paused while you select)");
      return;
    }
    fetch(window.location.href, {
      credentials: "same-origin",
      headers: { "X-Requested-With": "dispatch-console" },
    })
      .then(function (response) {
        if (!response.ok) throw new Error(response.status + " " + response.statusText);
        return response.text();
      })
      .then(function (text) {
        if (busy()) return;
        var fresh = new DOMParser().parseFromString(text, "text/html");
        document.querySelectorAll("[data-dispatch-live][id]").forEach(function (el) {
          var replacement = fresh.getElementById(el.id);
          if (replacement) el.replaceWith(document.importNode(replacement, true));
        });
        // The admin's actions.js bound the old list's checkboxes and counted
        // them: give it the new count, then bind the new ones.
        var counter = document.querySelector(".action-counter");
        var freshCounter = fresh.querySelector(".action-counter");
        if (counter && freshCounter) {
          counter.setAttribute("data-actions-icnt", freshCounter.getAttribute("data-actions-icnt"));
        }
        var boxes = document.querySelectorAll("#dispatch-results tr input.action-select");
        if (boxes.length && typeof window.Actions === "function") window.Actions(boxes);
        loadedAt = Date.now();
        setState("· live");
        tick();
        document.dispatchEvent(new CustomEvent("dispatch:refreshed"));
      })
      .catch(function (error) {
        setState("(live updates failed: " + error.message + "; retrying)");
      });
  }

  function start() {
    if (timer === null) timer = window.setInterval(refresh, INTERVAL);
  }

  function stop() {
    if (timer !== null) window.clearInterval(timer);
    timer = null;
  }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) {
      stop();
    } else {
      refresh();
      start();
    }
  });

  document.addEventListener("DOMContentLoaded", function () {
    if (!document.querySelector("[data-dispatch-live]")) return;
    // Tests (and impatient operators) may set window.DISPATCH_CONSOLE_INTERVAL (ms).
    if (window.DISPATCH_CONSOLE_INTERVAL > 0) INTERVAL = window.DISPATCH_CONSOLE_INTERVAL;
    setState("· live");
    window.setInterval(tick, 1000);
    if (!document.hidden) start();
  });
})();
