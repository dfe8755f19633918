// hvfleet dashboard: the fleet overview. Renders the server's JSON feed (every
// figure is the core's, as text and as bar shares; nothing is computed here),
// follows the server's event stream, and draws the heat map.
//
// The view (selector, name search, state, sort, page, page size, heat map
// grouping) is the URL's: it changes only when the person submits the form,
// picks a page or follows a link, never from what is typed but not submitted.
// Live changes are applied in place (the DOM is patched node by node, so
// focus, selection and scroll stay), at most once a second; a change that
// would move rows on the page is announced ("N changes") instead of applied.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
  const pct = (f) => (Math.max(0, f) * 100).toFixed(2) + "%";
  const fmt = (n) => Number(n).toLocaleString("en");
  const VIEW_KEYS = ["q", "selector", "state", "sort", "order", "page", "perPage", "group"];
  const MIN_GAP_MS = 1000;  // at most one redraw a second under churn
  let doc = JSON.parse($("initial").textContent);
  let view = viewOf(new URLSearchParams(location.search));
  let heat = null;
  let redraws = 0;

  function viewOf(p) {
    const v = {};
    for (const k of VIEW_KEYS) if (p.get(k)) v[k] = p.get(k);
    return v;
  }

  function query(v, extra) {
    const p = new URLSearchParams();
    for (const k of VIEW_KEYS) if (v[k] && !(k === "page" && v[k] === "1")) p.set(k, v[k]);
    for (const k in extra || {}) p.set(k, extra[k]);
    return p;
  }

  // -- patching the DOM in place ------------------------------------------------------------------
  // Only nodes that differ are touched: the element that has focus, a text
  // selection and the scroll position survive an update that did not change them.
  function morph(el, html) {
    const t = document.createElement("template");
    t.innerHTML = html;
    morphChildren(el, t.content);
  }

  function morphChildren(a, b) {
    const want = Array.from(b.childNodes);
    if (a.childNodes.length !== want.length) { a.replaceChildren(...want); return; }
    for (let i = 0; i < want.length; i++) {
      const x = a.childNodes[i], y = want[i];
      if (x.nodeType !== y.nodeType || x.nodeName !== y.nodeName ||
          (x.nodeType === 1 && x.dataset.host !== y.dataset.host)) { a.replaceChild(y, x); continue; }
      if (x.nodeType === 3) { if (x.data !== y.data) x.data = y.data; continue; }
      if (x.nodeType !== 1 || x.isEqualNode(y)) continue;
      for (const at of Array.from(x.attributes)) if (!y.hasAttribute(at.name)) x.removeAttribute(at.name);
      for (const at of Array.from(y.attributes)) if (x.getAttribute(at.name) !== at.value) x.setAttribute(at.name, at.value);
      morphChildren(x, y);
    }
  }

  // -- rendering ---------------------------------------------------------------------------------------
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
    return Object.keys(s).sort().map((k) => `<span class="state state-${esc(k)}">${esc(k)}: ${fmt(s[k])}</span>`).join(" ");
  }

  // A label value's totals link to the overview narrowed to that value.
  function groupLink(k, v) {
    const sel = doc.selector ? `${doc.selector},${k}=${v}` : `${k}=${v}`;
    return "/?" + query({selector: sel, sort: view.sort, order: view.order, perPage: view.perPage, group: view.group});
  }

  function renderTotals() {
    const t = doc.total;
    const narrowed = doc.count !== doc.matching ? ` (${fmt(doc.count)} shown by name and state)` : "";
    morph($("totals"), `<p>${fmt(t.hosts)} hosts match${doc.selector ? " <code>" + esc(doc.selector) + "</code>" : ""}${narrowed}. ${states(t.states)}</p>` +
      `<div class="bars" id="total-bars">${bars(t.resources, doc.resources)}</div>`);
    const keys = Object.keys(doc.groups);
    if (!keys.length) { morph($("groups"), "<p>No labels to group by.</p>"); return; }
    morph($("groups"), keys.map((k) => {
      const rows = Object.keys(doc.groups[k]).map((v) => {
        const g = doc.groups[k][v];
        return `<tr data-group="${esc(k)}=${esc(v)}"><th scope="row"><a href="${esc(groupLink(k, v))}">${esc(k)}=${esc(v)}</a></th><td>${fmt(g.hosts)}</td><td>${states(g.states)}</td><td class="bars">${bars(g.resources, doc.resources)}</td></tr>`;
      }).join("");
      return `<table class="groups"><caption>By ${esc(k)}</caption><thead><tr><th scope="col">${esc(k)}</th><th scope="col">Hosts</th><th scope="col">States</th><th scope="col">Capacity</th></tr></thead><tbody>${rows}</tbody></table>`;
    }).join(""));
  }

  function hostRow(h) {
    const rd = h.readiness;
    const labels = Object.keys(h.labels).sort().map((k) => `${esc(k)}=${esc(h.labels[k])}`).join(", ");
    const synced = h.synced.state === "False" ? ' <span class="pending" title="' + esc(h.synced.message) + '">effective capacity not synced</span>' : "";
    return `<tr data-host="${esc(h.name)}" class="row-${esc(rd.state)}"><th scope="row"><a href="/hosts/${encodeURIComponent(h.name)}">${esc(h.name)}</a></th>` +
      `<td><span class="state state-${esc(rd.state)}" title="${esc(rd.message)}">${esc(rd.state)}</span>${synced}</td>` +
      `<td>${h.instances}</td><td class="bars">${bars(h.resources, doc.resources)}</td><td>${labels || "-"}</td></tr>`;
  }

  // Column headings sort the table (again: the other direction).
  function heading(label, key) {
    const on = doc.sort === key;
    const sort = on ? (doc.order === "desc" ? "descending" : "ascending") : null;
    return `<th scope="col"${sort ? ` aria-sort="${sort}"` : ""}><button type="button" class="sort" data-sort="${esc(key)}">${esc(label)}${on ? (doc.order === "desc" ? " ▼" : " ▲") : ""}</button></th>`;
  }

  function renderHosts() {
    const first = doc.count ? (doc.page - 1) * doc.perPage + 1 : 0;
    const used = doc.resources.length ? `used:${doc.resources[0]}` : "name";
    morph($("hosts"), `<table class="hosts"><caption>Hosts ${fmt(first)}–${fmt(first + doc.hosts.length - (doc.count ? 1 : 0))} of ${fmt(doc.count)}, sorted by ${esc(doc.sort)}${doc.order === "desc" ? " (descending)" : ""}</caption>` +
      `<thead><tr>${heading("Host", "name")}${heading("State", "state")}${heading("Instances", "instances")}${heading("Capacity per resource", used)}<th scope="col">Labels</th></tr></thead><tbody>${doc.hosts.map(hostRow).join("")}</tbody></table>` +
      (doc.hosts.length ? "" : "<p>No host matches this view.</p>"));
    const pager = [];
    const btn = (n, label, disabled) => `<button type="button" data-page="${n}"${disabled ? " disabled" : ""}>${label}</button>`;
    pager.push(btn(1, "First page", doc.page <= 1), btn(doc.page - 1, "Previous page", doc.page <= 1));
    pager.push(`<span>Page ${fmt(doc.page)} of ${fmt(doc.pages)}</span>`);
    pager.push(btn(doc.page + 1, "Next page", doc.page >= doc.pages), btn(doc.pages, "Last page", doc.page >= doc.pages));
    pager.push(`<label for="jump">Go to page</label><input id="jump" type="number" min="1" max="${doc.pages}" inputmode="numeric" size="5">` +
      `<button type="button" id="jump-go">Go</button>`);
    morph($("pager"), pager.join(" "));
  }

  function render() { renderTotals(); renderHosts(); document.body.dataset.version = String(doc.version); }

  // -- loading a view (the person asked) and following changes (the fleet moved) ------------------
  function loginAgain() { location.href = "/login?next=" + encodeURIComponent(location.pathname + location.search); }

  function status(text) { if ($("live-status").textContent !== text) $("live-status").textContent = text; }

  function showError(message, field) {
    const input = $(field) || $("selector");
    let err = document.getElementById(input.id + "-error");
    if (!err) {
      err = document.createElement("span");
      err.id = input.id + "-error"; err.className = "error"; err.setAttribute("role", "alert");
      input.insertAdjacentElement("afterend", err);
      const hint = document.getElementById(input.id + "-hint");
      input.setAttribute("aria-describedby", (hint ? hint.id + " " : "") + err.id);
    }
    err.textContent = "Error: " + message;
    input.setAttribute("aria-invalid", "true");
  }

  function clearErrors() {
    for (const err of document.querySelectorAll("#filter .error")) {
      const input = $(err.id.replace(/-error$/, ""));
      err.remove();
      if (input) {
        input.removeAttribute("aria-invalid");
        const hint = document.getElementById(input.id + "-hint");
        if (hint) input.setAttribute("aria-describedby", hint.id); else input.removeAttribute("aria-describedby");
      }
    }
  }

  // A view the person chose: the whole page of it, and the URL says it.
  async function open(v, push) {
    const r = await fetch("/dashboard/overview.json?" + query(v), {credentials: "same-origin"});
    if (r.status === 401) { loginAgain(); return; }
    const got = await r.json();
    if (r.status === 422) { showError(got.message, got.field); return; }
    if (!r.ok) { status(`Live updates: the server answered ${r.status}`); return; }
    clearErrors();
    view = v;
    doc = got;
    pendingOrder = null;
    morph($("changes"), "");
    render();
    const url = "/?" + query(view);
    if (push) history.pushState(null, "", url); else history.replaceState(null, "", url);
    heatGen += 1;  // the heat map follows the view (another view's layout: a whole map comes back)
    heatDirty = true;
    scheduleHeat(0);
  }

  // The fleet changed: the rows on this page that changed, in place, and the totals.
  let pendingOrder = null;
  async function follow() {
    const r = await fetch("/dashboard/overview.json?" + query(view, {since: String(doc.version)}), {credentials: "same-origin"});
    if (r.status === 401) { loginAgain(); return; }
    if (!r.ok) { status(`Live updates: the server answered ${r.status}; retrying on the next change`); return; }
    const d = await r.json();
    const index = new Map(doc.hosts.map((h, i) => [h.name, i]));
    for (const h of d.hosts) if (index.has(h.name)) doc.hosts[index.get(h.name)] = h;
    const shown = doc.hosts.map((h) => h.name);
    const moved = d.order.length !== shown.length || d.order.some((n, i) => n !== shown[i]) ||
      d.page !== doc.page || d.pages !== doc.pages;
    Object.assign(doc, {version: d.version, total: d.total, groups: d.groups, resources: d.resources,
                        count: moved ? doc.count : d.count, matching: d.matching});
    if (moved) {
      const changes = Math.max(d.order.filter((n, i) => n !== shown[i]).length, Math.abs(d.count - doc.count), 1);
      pendingOrder = changes;
      morph($("changes"), `<p class="changes">${fmt(changes)} change${changes === 1 ? "" : "s"} would reorder this page. ` +
        `<button type="button" id="show-changes">Show ${changes === 1 ? "it" : "them"}</button></p>`);
    }
    render();
    redraws += 1;
    document.body.dataset.redraws = String(redraws);
    heatDirty = true;
    scheduleHeat();
  }

  // Changes are coalesced: the first after a quiet second is shown within 0.1 s,
  // then at most one update a second however many arrive.
  let dirty = false, busy = false, lastAt = 0, timer = null;
  function changed() { dirty = true; schedule(); }
  function schedule() {
    if (timer || busy) return;
    timer = setTimeout(tick, Math.max(100, MIN_GAP_MS - (Date.now() - lastAt)));
  }
  async function tick() {
    timer = null;
    if (!dirty) return;
    dirty = false; busy = true; lastAt = Date.now();
    try { await follow(); } catch (e) { status("Live updates: the last update failed; retrying on the next change"); }
    finally { busy = false; if (dirty) schedule(); }
  }

  // -- heat map ------------------------------------------------------------------------------------------
  // Bands darker as the share in use grows (relative luminance 0.82, 0.52, 0.30,
  // 0.16, 0.06: at least 1.5:1 between neighbours), so they differ without colour vision.
  const COLOURS = ["#d7f1d0", "#d4c111", "#e57713", "#d3291e", "#8e0720"];
  function level(u) { return u < 0 ? -1 : u < 500 ? 0 : u < 800 ? 1 : u < 950 ? 2 : u <= 1000 ? 3 : 4; }
  let heatDirty = true, heatTimer = null, heatAt = 0, heatBusy = false, heatGen = 0;
  const cursor = {};

  function scheduleHeat(now) {
    if (heatTimer || heatBusy) return;
    const wait = now === 0 || !heatAt ? 50 : Math.max(0, 2000 - (Date.now() - heatAt));
    heatTimer = setTimeout(loadHeat, wait);
  }

  async function loadHeat() {
    heatTimer = null;
    if (!heatDirty) return;
    heatDirty = false; heatBusy = true; heatAt = Date.now();
    const gen = heatGen;
    try {
      const v = Object.assign({}, view); delete v.page; delete v.perPage;
      const extra = heat ? {since: String(heat.version), layout: heat.layout} : {};
      const r = await fetch("/dashboard/heat.json?" + query(v, extra), {credentials: "same-origin"});
      if (!r.ok) return;
      const got = await r.json();
      if (gen !== heatGen) { heatDirty = true; return; }  // the view changed meanwhile
      if (got.delta && !heat) { heatDirty = true; return; }
      if (got.delta) {
        for (const [i, ...tile] of got.changed) { heat.tiles[i] = tile; drawTile(i); }
        heat.version = got.version;
      } else {
        heat = got;
        drawHeat();
      }
      document.body.dataset.heatVersion = String(heat.version);
    } finally { heatBusy = false; if (heatDirty) scheduleHeat(); }
  }

  function geometry(n) {
    const side = Math.max(1, Math.ceil(Math.sqrt(n)));
    return {side, tile: Math.max(2, Math.min(16, Math.floor(320 / side)))};
  }

  function canvasId(j, g) { return heat.groups.length > 1 ? `heat-${j}-${g}` : `heat-${j}`; }

  function drawHeat() {
    const rs = heat.resources;
    let html = "";
    rs.forEach((r, j) => {
      html += `<figure class="heat"><figcaption>${esc(r)}</figcaption>`;
      heat.groups.forEach(([value, start, count], g) => {
        const {side, tile} = geometry(count);
        const title = heat.group ? `${heat.group}=${value || "(none)"}` : "";
        if (title) html += `<p class="heat-group">${esc(title)}: ${fmt(count)} host${count === 1 ? "" : "s"}</p>`;
        html += `<canvas id="${canvasId(j, g)}" data-j="${j}" data-g="${g}" width="${side * tile}" height="${Math.ceil(count / side) * tile}" tabindex="0" role="img" ` +
          `aria-label="Heat map of ${esc(r)} use over ${fmt(count)} hosts${title ? " with " + esc(title) : ""}; use the arrow keys to read each host"></canvas>`;
      });
      html += "</figure>";
    });
    $("heat").innerHTML = html;
    // Each group's geometry and each map's drawing context, looked up once per layout.
    heat.geo = heat.groups.map(([, , count]) => geometry(count));
    heat.ctx = rs.map((r, j) => heat.groups.map((grp, g) => $(canvasId(j, g)).getContext("2d")));
    for (const c of $("heat").querySelectorAll("canvas")) wireCanvas(c);
    for (let i = 0; i < heat.names.length; i++) drawTile(i);
  }

  function groupOf(i) {
    let lo = 0, hi = heat.groups.length - 1;
    while (lo < hi) {  // the last group starting at or before i
      const mid = (lo + hi + 1) >> 1;
      if (heat.groups[mid][1] <= i) lo = mid; else hi = mid - 1;
    }
    return lo;
  }

  function drawTile(i) {
    const g = groupOf(i), start = heat.groups[g][1];
    const {side, tile} = heat.geo[g];
    const k = i - start, x = (k % side) * tile, y = Math.floor(k / side) * tile;
    const t = heat.tiles[i];
    const size = tile - (tile > 3 ? 1 : 0);
    const edge = heat.states[t[0]] !== "Ready" && tile > 3;
    for (let j = 0; j < heat.resources.length; j++) {
      const ctx = heat.ctx[j][g];
      const l = level(t[j + 1]);
      ctx.clearRect(x, y, tile, tile);
      ctx.fillStyle = l < 0 ? "#ffffff" : COLOURS[l];
      ctx.fillRect(x, y, size, size);
      if (edge) { ctx.fillStyle = "#222"; ctx.fillRect(x, y, Math.max(1, tile / 4), tile - 1); }
    }
  }

  function describe(i, j) {
    const u = heat.tiles[i][j + 1];
    return {name: heat.names[i], text: `${heat.names[i]} (${heat.states[heat.tiles[i][0]]}): ${heat.resources[j]} ` +
      (u < 0 ? "no effective capacity" : `${(u / 10).toFixed(1)}% of effective capacity in use`)};
  }

  function readCell(i, j) {
    const d = describe(i, j);
    $("heat-cell").innerHTML = `<a href="/hosts/${encodeURIComponent(d.name)}">${esc(d.name)}</a>` + esc(d.text.slice(d.name.length));
  }

  function tileAt(c, ev) {
    const g = Number(c.dataset.g), [, start, count] = heat.groups[g];
    const {side, tile} = geometry(count);
    const rect = c.getBoundingClientRect();
    const k = Math.floor((ev.clientY - rect.top) / tile) * side + Math.floor((ev.clientX - rect.left) / tile);
    return k >= 0 && k < count && Math.floor((ev.clientX - rect.left) / tile) < side ? start + k : -1;
  }

  function showTip(c, i, j, x, y) {
    const tip = $("heat-tip");
    tip.textContent = describe(i, j).text;
    tip.hidden = false;
    const box = c.closest("section").getBoundingClientRect();
    tip.style.left = `${x - box.left + 12}px`;
    tip.style.top = `${y - box.top + 12}px`;
  }

  function wireCanvas(c) {
    const j = Number(c.dataset.j), g = Number(c.dataset.g);
    c.addEventListener("mousemove", (ev) => {
      const i = tileAt(c, ev);
      if (i < 0) { $("heat-tip").hidden = true; return; }
      showTip(c, i, j, ev.clientX, ev.clientY);
    });
    c.addEventListener("mouseleave", () => { $("heat-tip").hidden = true; });
    c.addEventListener("click", (ev) => {
      const i = tileAt(c, ev);
      if (i >= 0) { cursor[c.id] = i; readCell(i, j); }
    });
    c.addEventListener("focus", () => {
      if (!heat) return;
      const [, start] = heat.groups[g];
      const i = cursor[c.id] !== undefined ? cursor[c.id] : start;
      cursor[c.id] = i;
      readCell(i, j);
      const rect = c.getBoundingClientRect();
      showTip(c, i, j, rect.left, rect.bottom - 12);
    });
    c.addEventListener("blur", () => { $("heat-tip").hidden = true; });
    c.addEventListener("keydown", (ev) => {
      const [, start, count] = heat.groups[g];
      const {side} = geometry(count);
      const moves = {ArrowRight: 1, ArrowLeft: -1, ArrowDown: side, ArrowUp: -side, Home: -count, End: count};
      const at = cursor[c.id] !== undefined ? cursor[c.id] : start;
      if (ev.key in moves) {
        const i = Math.min(start + count - 1, Math.max(start, at + moves[ev.key]));
        cursor[c.id] = i;
        readCell(i, j);
        const rect = c.getBoundingClientRect();
        showTip(c, i, j, rect.left, rect.bottom - 12);
        ev.preventDefault();
      } else if (ev.key === "Enter") { location.href = "/hosts/" + encodeURIComponent(heat.names[at]); }
    });
  }

  // -- wiring -----------------------------------------------------------------------------------------
  // The form is read only when submitted (Apply, Enter, or choosing a sort,
  // state, order or page size, which apply at once).
  function submitted() {
    const f = $("filter").elements;
    const v = {group: view.group};
    for (const k of ["q", "selector", "state", "sort", "order", "perPage"]) if (f[k] && f[k].value) v[k] = f[k].value;
    if (v.sort === "name") delete v.sort;
    if (v.order === "asc") delete v.order;
    if (v.perPage === "100") delete v.perPage;
    if (!v.group) delete v.group;
    return v;
  }
  $("filter").addEventListener("submit", (ev) => { ev.preventDefault(); open(submitted(), true); });
  for (const k of ["state", "sort", "order", "perPage"]) $(k).addEventListener("change", () => open(submitted(), true));
  $("heat-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const v = Object.assign({}, view);
    if ($("heat-group").value) v.group = $("heat-group").value; else delete v.group;
    open(v, true);
  });
  $("hosts").addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-sort]");
    if (!b) return;
    const v = Object.assign({}, view);
    const same = (v.sort || "name") === b.dataset.sort;
    v.sort = b.dataset.sort;
    if (same && v.order !== "desc") v.order = "desc"; else delete v.order;
    delete v.page;
    open(v, true).then(() => { const again = document.querySelector(`button[data-sort="${CSS.escape(v.sort)}"]`); if (again) again.focus(); });
  });
  function goTo(n) {
    const page = Math.min(Math.max(1, n), doc.pages);
    open(Object.assign({}, view, {page: String(page)}), true);
  }
  $("pager").addEventListener("click", (ev) => {
    const b = ev.target.closest("button[data-page]");
    if (b) { goTo(Number(b.dataset.page)); return; }
    if (ev.target.id === "jump-go") goTo(Number($("jump").value) || 1);
  });
  $("pager").addEventListener("keydown", (ev) => {
    if (ev.target.id === "jump" && ev.key === "Enter") { ev.preventDefault(); goTo(Number($("jump").value) || 1); }
  });
  $("changes").addEventListener("click", (ev) => {
    if (ev.target.id === "show-changes") open(view, false);
  });
  window.addEventListener("popstate", () => { open(viewOf(new URLSearchParams(location.search)), false); });

  function connect() {
    const es = new EventSource("/dashboard/events");
    es.addEventListener("hello", (ev) => {
      status("Live updates: on");
      // A change between the page's data and the stream's start has no event of its own.
      if (JSON.parse(ev.data).version !== doc.version) changed();
    });
    es.addEventListener("change", changed);
    es.onerror = () => { status("Live updates: reconnecting…"); };
  }

  render();
  document.body.dataset.redraws = "0";
  document.body.dataset.ready = "1";
  if (window.performance && performance.mark) performance.mark("hvfleet-rendered");
  connect();
  scheduleHeat(0);
})();
