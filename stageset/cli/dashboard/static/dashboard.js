// Live updates for the stageset dashboard.  The server sends whole fragments of the page, rendered
// and escaped by its template engine; this script only swaps them in.  It never builds markup from
// data, so tenant-written text cannot become markup here.
"use strict";
// A button that says data-confirm (Suspend) asks first; its text was rendered and escaped by the
// server and is shown as text.
document.addEventListener("submit", function (event) {
  const button = event.submitter;
  if (button && button.dataset.confirm && !window.confirm(button.dataset.confirm)) {
    event.preventDefault();
  }
});
(function () {
  const main = document.querySelector("main[data-live]");
  const badge = document.getElementById("live");
  if (!main || !window.EventSource) {
    return;
  }
  function state(name, text) {
    badge.dataset.state = name;
    badge.textContent = text;
  }
  function swap(message) {
    const target = document.getElementById(message.id);
    if (!target || target.dataset.digest === message.digest) {
      return;
    }
    // Keep what the reader opened or closed: details elements by id.
    const open = {};
    for (const details of target.querySelectorAll("details[id]")) {
      open[details.id] = details.open;
    }
    target.innerHTML = message.html;
    target.dataset.digest = message.digest;
    for (const details of target.querySelectorAll("details[id]")) {
      if (details.id in open) {
        details.open = open[details.id];
      }
    }
  }
  const source = new EventSource(main.dataset.live);
  source.addEventListener("open", function () { state("on", "live"); });
  source.addEventListener("error", function () { state("off", "reconnecting…"); });
  source.addEventListener("swap", function (event) { swap(JSON.parse(event.data)); });
})();
