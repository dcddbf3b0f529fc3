// The console works without this file; it only keeps a form from being sent twice
// while the first submission is on its way (a resolve or a decision is one API call).
"use strict";
document.addEventListener("submit", function (ev) {
  var form = ev.target;
  if (form.dataset.sent === "1") {
    ev.preventDefault();
    return;
  }
  form.dataset.sent = "1";
  window.setTimeout(function () {
    form.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
  }, 0);
});
