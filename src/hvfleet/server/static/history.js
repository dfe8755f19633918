// hvfleet dashboard: keeps the server-drawn history charts (section.history) current.
// Every 30 s each section is fetched again as HTML from the server and put in place
// of the old one; nothing is drawn here. A section that has keyboard focus inside
// it is left alone until the focus moves on.
"use strict";
(function () {
  async function refresh(section) {
    if (section.contains(document.activeElement)) return;
    const q = new URLSearchParams({series: section.dataset.series, range: section.dataset.range});
    const r = await fetch("/dashboard/history?" + q, {credentials: "same-origin"});
    if (!r.ok) return;
    const tmp = document.createElement("div");
    tmp.innerHTML = await r.text();
    const fresh = tmp.querySelector("section.history");
    if (fresh) section.replaceWith(fresh);
  }
  setInterval(() => document.querySelectorAll("section.history[data-series]").forEach(refresh), 30000);
})();
