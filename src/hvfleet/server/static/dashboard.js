// hvfleet dashboard: the fleet overview. Renders the server's JSON feed (every
// figure is the core's, as text and as bar shares; nothing is computed here),
// follows the server's event stream, and draws the heat map.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const pct = (f) => (Math.max(0, f) * 100).toFixed(2) + "%";
  let doc = JSON.parse($("initial").textContent);
  let heat = null;
  let pending = null;
  let heatDirty = true;

  function params(extra) {
    const form = $("filter");
    const p = new URLSearchParams();
    p.set("selector", form.elements.selector.value);
    p.set("sort", form.elements.sort.value);
    p.set("perPage", form.elements.perPage.value);
    p.set("page", String(doc.page));
    for (const k in extra || {}) p.set(k, extra[k]);
    return p;
  }

  function bar(r, x) {
    const b = x.bar, t = x.text;
    let words = `${r}: ${t.allocation} allocated, ${t.held} held by reservations, ${t.free} free of ${t.effective} effective`;
    let marks = `<span class="mark eff" style="left:${pct(b.effective)}"></span>`;
    if (x.raw !== null && x.raw !== undefined) {
      words += `; raw capacity ${t.raw}, overcommit ×${x.ratio}`;
      marks += `<span class="mark raw" style="left:${pct(b.raw)}"></span>`;
    }
    const note = x.level === "overcommitted" ? ' <strong class="over">overcommitted</strong>'
      : x.level === "low" ? ' <em class="low">low</em>' : "";
    const ratio = x.ratio !== undefined && x.ratio !== 1 ? ` <span class="ratio">×${esc(x.ratio)}</span>` : "";
    return `<div class="res level-${esc(x.level)}" data-resource="${esc(r)}" data-effective="${esc(x.effective)}"` +
      ` data-allocation="${esc(x.allocation)}" data-held="${esc(x.held)}" data-free="${esc(x.free)}">` +
      `<span class="rname">${esc(r)}</span><span class="bar" role="img" aria-label="${esc(words)}">` +
      `<span class="seg alloc" style="width:${pct(b.allocation)}"></span>` +
      `<span class="seg held" style="width:${pct(b.held)}"></span>` +
      `<span class="seg free" style="width:${pct(b.free)}"></span>${marks}</span>` +
      `<span class="btext">${esc(t.allocation)} + ${esc(t.held)} held / ${esc(t.effective)}, free ${esc(t.free)}${ratio}${note}</span></div>`;
  }

  function bars(resources, names) {
    return names.filter((r) => resources[r]).map((r) => bar(r, resources[r])).join("");
  }

  function states(s) {
    return Object.keys(s).sort().map((k) => `<span class="state state-${esc(k)}">${esc(k)}: ${s[k]}</span>`).join(" ");
  }

  function renderTotals() {
    const t = doc.total;
    $("totals").innerHTML = `<p>${t.hosts} hosts match${doc.selector ? " <code>" + esc(doc.selector) + "</code>" : ""}. ${states(t.states)}</p>` +
      `<div class="bars" id="total-bars">${bars(t.resources, doc.resources)}</div>`;
    const keys = Object.keys(doc.groups);
    if (!keys.length) { $("groups").innerHTML = "<p>No labels to group by.</p>"; return; }
    $("groups").innerHTML = keys.map((k) => {
      const rows = Object.keys(doc.groups[k]).map((v) => {
        const g = doc.groups[k][v];
        return `<tr data-group="${esc(k)}=${esc(v)}"><th scope="row">${esc(k)}=${esc(v)}</th><td>${g.hosts}</td><td>${states(g.states)}</td><td class="bars">${bars(g.resources, doc.resources)}</td></tr>`;
      }).join("");
      return `<table class="groups"><caption>By ${esc(k)}</caption><thead><tr><th scope="col">${esc(k)}</th><th scope="col">Hosts</th><th scope="col">States</th><th scope="col">Capacity</th></tr></thead><tbody>${rows}</tbody></table>`;
    }).join("");
  }

  function renderHosts() {
    const rows = doc.hosts.map((h) => {
      const rd = h.readiness;
      const labels = Object.keys(h.labels).sort().map((k) => `${esc(k)}=${esc(h.labels[k])}`).join(", ");
      const synced = h.synced.state === "False" ? ' <span class="pending" title="' + esc(h.synced.message) + '">effective capacity not synced</span>' : "";
      return `<tr data-host="${esc(h.name)}" class="row-${esc(rd.state)}"><th scope="row"><a href="/hosts/${encodeURIComponent(h.name)}">${esc(h.name)}</a></th>` +
        `<td><span class="state state-${esc(rd.state)}" title="${esc(rd.message)}">${esc(rd.state)}</span>${synced}</td>` +
        `<td>${h.instances}</td><td class="bars">${bars(h.resources, doc.resources)}</td><td>${labels || "-"}</td></tr>`;
    }).join("");
    $("hosts").innerHTML = `<table class="hosts"><caption>Hosts ${(doc.page - 1) * doc.perPage + 1}–${(doc.page - 1) * doc.perPage + doc.hosts.length} of ${doc.count}, sorted by ${esc(doc.sort)}</caption>` +
      `<thead><tr><th scope="col">Host</th><th scope="col">State</th><th scope="col">Instances</th><th scope="col">Capacity per resource</th><th scope="col">Labels</th></tr></thead><tbody>${rows}</tbody></table>`;
    const pager = [];
    if (doc.page > 1) pager.push(`<button type="button" data-page="${doc.page - 1}">Previous page</button>`);
    pager.push(`<span>Page ${doc.page} of ${doc.pages}</span>`);
    if (doc.page < doc.pages) pager.push(`<button type="button" data-page="${doc.page + 1}">Next page</button>`);
    $("pager").innerHTML = pager.join(" ");
  }

  function render() { renderTotals(); renderHosts(); }

  async function refresh(extra) {
    const p = params(extra);
    const r = await fetch("/dashboard/overview.json?" + p, {credentials: "same-origin"});
    if (r.status === 401) { location.href = "/login?next=" + encodeURIComponent(location.pathname + location.search); return; }
    if (r.status !== 200 && r.status !== 422) { $("live-status").textContent = `Live updates: the server answered ${r.status}; retrying on the next change`; return; }
    const got = await r.json();
    const err = document.getElementById("selector-error");
    if (r.status === 422) { showError(got.message); return; }
    if (err) { err.remove(); $("selector").removeAttribute("aria-invalid"); }
    doc = got;
    render();
    document.body.dataset.version = String(doc.version);
    history.replaceState(null, "", "/?" + params());
    heatDirty = true;
    scheduleHeat();
  }

  function showError(message) {
    let err = document.getElementById("selector-error");
    if (!err) {
      err = document.createElement("span");
      err.id = "selector-error"; err.className = "error"; err.setAttribute("role", "alert");
      $("selector").insertAdjacentElement("afterend", err);
      $("selector").setAttribute("aria-describedby", "selector-hint selector-error");
    }
    err.textContent = "Error: " + message;
    $("selector").setAttribute("aria-invalid", "true");
  }

  // -- heat map -------------------------------------------------------------------------------
  const COLOURS = ["#d8ecd4", "#f6e08b", "#f2a65a", "#d7301f", "#67000d"];
  function level(u) { return u === null ? -1 : u < 0.5 ? 0 : u < 0.8 ? 1 : u < 0.95 ? 2 : u <= 1 ? 3 : 4; }
  let cursor = 0;
  let heatTimer = null;
  let heatAt = 0;

  function scheduleHeat() {
    if (heatTimer) return;
    const wait = Math.max(0, 2000 - (Date.now() - heatAt));
    heatTimer = setTimeout(loadHeat, heatAt ? wait : 50);
  }

  async function loadHeat() {
    heatTimer = null;
    if (!heatDirty) return;
    heatDirty = false;
    heatAt = Date.now();
    const p = params();
    p.delete("page"); p.delete("perPage");
    const r = await fetch("/dashboard/heat.json?" + p, {credentials: "same-origin"});
    if (!r.ok) return;
    heat = await r.json();
    drawHeat();
  }

  function drawHeat() {
    const n = heat.names.length, rs = heat.resources;
    const side = Math.max(1, Math.ceil(Math.sqrt(n)));
    const tile = Math.max(2, Math.min(16, Math.floor(320 / side)));
    let html = "";
    rs.forEach((r, j) => {
      html += `<figure class="heat"><figcaption>${esc(r)}</figcaption><canvas id="heat-${j}" width="${side * tile}" height="${Math.ceil(n / side) * tile}" tabindex="0" role="img" aria-label="Heat map of ${esc(r)} use over ${n} hosts; use the arrow keys to read each host"></canvas></figure>`;
    });
    $("heat").innerHTML = html;
    rs.forEach((r, j) => {
      const c = $("heat-" + j), g = c.getContext("2d");
      for (let i = 0; i < n; i++) {
        const u = heat.use[i][j], l = level(u);
        const x = (i % side) * tile, y = Math.floor(i / side) * tile;
        g.fillStyle = l < 0 ? "#ffffff" : COLOURS[l];
        g.fillRect(x, y, tile - (tile > 3 ? 1 : 0), tile - (tile > 3 ? 1 : 0));
        if (heat.states[i] !== "Ready" && tile > 3) { g.fillStyle = "#222"; g.fillRect(x, y, Math.max(1, tile / 4), tile - 1); }
      }
      c.addEventListener("click", (ev) => {
        const rect = c.getBoundingClientRect();
        const i = Math.floor((ev.clientY - rect.top) / tile) * side + Math.floor((ev.clientX - rect.left) / tile);
        if (i < n) { cursor = i; readCell(j); }
      });
      c.addEventListener("keydown", (ev) => {
        const moves = {ArrowRight: 1, ArrowLeft: -1, ArrowDown: side, ArrowUp: -side};
        if (ev.key in moves) { cursor = Math.min(n - 1, Math.max(0, cursor + moves[ev.key])); readCell(j); ev.preventDefault(); }
        else if (ev.key === "Enter") { location.href = "/hosts/" + encodeURIComponent(heat.names[cursor]); }
      });
    });
  }

  function readCell(j) {
    const u = heat.use[cursor][j];
    $("heat-cell").innerHTML = `<a href="/hosts/${encodeURIComponent(heat.names[cursor])}">${esc(heat.names[cursor])}</a> (${esc(heat.states[cursor])}): ${esc(heat.resources[j])} ` +
      (u === null ? "no effective capacity" : `${(u * 100).toFixed(1)}% of effective capacity in use`);
  }

  // -- wiring -----------------------------------------------------------------------------------------
  $("filter").addEventListener("submit", (ev) => { ev.preventDefault(); doc.page = 1; refresh({page: "1"}); });
  $("sort").addEventListener("change", () => { doc.page = 1; refresh({page: "1"}); });
  $("pager").addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-page]");
    if (b) { refresh({page: b.dataset.page}); $("hosts-h").scrollIntoView(); }
  });

  function connect() {
    const es = new EventSource("/dashboard/events");
    es.addEventListener("hello", (ev) => {
      $("live-status").textContent = "Live updates: on";
      // A change between the page's data and the stream's start has no event of its own.
      const v = JSON.parse(ev.data).version;
      if (v !== doc.version && !pending) pending = setTimeout(() => { pending = null; refresh(); }, 0);
    });
    es.addEventListener("change", () => {
      if (pending) return;
      pending = setTimeout(() => { pending = null; refresh(); }, 100);
    });
    es.onerror = () => { $("live-status").textContent = "Live updates: reconnecting…"; };
  }

  render();
  document.body.dataset.version = String(doc.version);
  document.body.dataset.ready = "1";
  if (window.performance && performance.mark) performance.mark("hvfleet-rendered");
  connect();
  setTimeout(loadHeat, 0);
})();
