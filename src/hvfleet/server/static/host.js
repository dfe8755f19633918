// hvfleet dashboard: a host's page follows the server's event stream and
// replaces its live part (status, bars, reservations, changes) when the host changes.
"use strict";
(function () {
  const live = document.getElementById("live");
  if (!live) return;
  const host = live.dataset.host;
  let pending = null;
  async function reload() {
    pending = null;
    const r = await fetch(`/hosts/${encodeURIComponent(host)}?part=live`, {credentials: "same-origin"});
    if (r.ok) { live.innerHTML = await r.text(); document.body.dataset.updated = String(Date.now()); }
  }
  const es = new EventSource("/dashboard/events?host=" + encodeURIComponent(host));
  es.addEventListener("change", () => { if (!pending) pending = setTimeout(reload, 100); });
  // A change between this page's rendering and the stream's start has no event of
  // its own: read the live part once when the stream says hello.
  es.addEventListener("hello", () => { if (!pending) pending = setTimeout(reload, 0); });
  document.body.dataset.ready = "1";
})();
