"""Dashboard figures in the real headless Chromium, each beside a peer measured
in the same run and browser:

1. First paint (first-contentful-paint, Performance API), first rows rendered
   (the page's `hvfleet-rendered` mark: totals, label totals and the first page
   of hosts drawn from the feed), and time to interactive (the end of the last
   long task, PerformanceObserver `longtask`, after load; at least
   domContentLoaded) of the overview at 1k and at 10k hosts; peer: the login
   page (no fleet data) in the same browser.
2. Live: an agent's status write to the page showing it (server watch fan-out,
   the dashboard's row, SSE, the page's feed request); peer: a direct
   `Store.watch` seeing the same write.
3. The server side of it: GET /dashboard/overview.json and /dashboard/heat.json
   (the whole fleet's heat map) beside GET /readyz.
4. Under churn (`--rate` status writes a second, each as the host's agent, for
   `--churn-seconds`): bytes per minute received by one open overview tab
   (Chrome's Network.dataReceived, compressed, event stream included) and
   redraws per second, beside the same tab in a quiet period; and the heat
   map's bytes: plain JSON, gzip, and one delta.

The server is the real `hvfleet serve` (TLS) over a SQLite store filled with
synthetic hosts (tests/dashboard/fleet.py, seed_synthetic; seeded once and
copied, tests/dashboard/synthetic.py, so a copy's hosts may show as Stale),
logged into with a real viewer token. Each figure is the median of `--runs`
fresh page loads.

    .venv/bin/python bench/dashboard.py [--hosts 1000,10000] [--runs 5] [--rate 100] [--churn-seconds 30]
    .venv/bin/python bench/dashboard.py --screenshots docs/img   # the docs' screenshots
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.dashboard.fleet import CHROMIUM, CHROMIUM_ARGS, serving, wait_dashboard_loaded  # noqa: E402
from tests.dashboard.synthetic import seeded_store  # noqa: E402

from hvfleet.model.quantity import Quantity  # noqa: E402
from hvfleet.store import open_store  # noqa: E402
from hvfleet.store.ownership import agent_manager  # noqa: E402
from hvfleet.store.tokens import issue_token  # noqa: E402

# Installed before any page script: collects long tasks for time to interactive.
LONGTASKS = """
window.__longtasks = [];
try {
  new PerformanceObserver((l) => {
    for (const e of l.getEntries()) window.__longtasks.push(e.startTime + e.duration);
  }).observe({type: 'longtask', buffered: true});
} catch (e) {}
"""

MEASURE = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const fcp = performance.getEntriesByName('first-contentful-paint')[0];
  const rendered = performance.getEntriesByName('hvfleet-rendered')[0];
  const last = Math.max(0, ...(window.__longtasks || []));
  return {fcp: fcp ? fcp.startTime : null, rendered: rendered ? rendered.startTime : null,
          dcl: nav.domContentLoadedEventEnd, tti: Math.max(nav.domContentLoadedEventEnd,
          rendered ? rendered.startTime : 0, last), bytes: nav.transferSize};
}"""


def seed(dest: Path, n: int, seed_: int = 1) -> str:
    """A store of `n` synthetic hosts (shared with the 10k tests); its URL."""
    return seeded_store(dest, n, seed_)


def token(store_url: str, role: str = "viewer") -> str:
    with open_store(store_url) as s:
        return issue_token(s, role, manager="bench", now=datetime.now(UTC),  # type: ignore[arg-type]
                           ttl=timedelta(hours=2), name=f"bench-{role}")[1]


def load(browser: Any, url: str, tok: str, path: str, ready: str) -> dict[str, float]:
    ctx = browser.new_context(ignore_https_errors=True, viewport={"width": 1400, "height": 1000})
    try:
        host = url.split("//", 1)[1].split(":")[0]
        ctx.add_cookies([{"name": "hvfleet_session", "value": tok, "domain": host, "path": "/",
                          "httpOnly": True, "secure": True, "sameSite": "Strict"}])
        ctx.add_init_script(LONGTASKS)
        page = ctx.new_page()
        page.goto(url + path)
        page.wait_for_selector(ready, state="attached", timeout=60_000)
        page.wait_for_timeout(1500)  # let late long tasks (heat map) be observed
        return dict(page.evaluate(MEASURE))
    finally:
        ctx.close()


def live_latency(browser: Any, url: str, tok: str, store_url: str, runs: int) -> tuple[float, float]:
    """Median time from an agent's status write (hv-00000, first on page 1) to
    the open page showing its new allocation, beside the time a direct
    Store.watch in this process sees the same write."""
    import threading

    # The probe (wait_for_function) is a script the page's CSP refuses.
    ctx = browser.new_context(ignore_https_errors=True, bypass_csp=True,
                              viewport={"width": 1400, "height": 1000})
    host = url.split("//", 1)[1].split(":")[0]
    ctx.add_cookies([{"name": "hvfleet_session", "value": tok, "domain": host, "path": "/",
                      "httpOnly": True, "secure": True, "sameSite": "Strict"}])
    page = ctx.new_page()
    page.goto(url + "/")
    page.wait_for_selector("#live-status:has-text('on')")
    cell = "tr[data-host='hv-00000'] .res[data-resource='cpu']"
    shown, seen = [], []
    with open_store(store_url) as store:
        for i in range(runs):
            h = store.get_hypervisor("hv-00000")
            used = 1000 + i
            status = h.status.model_copy(update={"allocation": {**h.status.allocation,
                                                                 "cpu": Quantity(used)}})
            arrived: list[float] = []
            stop = threading.Event()

            def watch(since: int, stop: threading.Event = stop, arrived: list[float] = arrived) -> None:
                with open_store(store_url) as w:
                    for _ in w.watch("Hypervisor", since=since, name="hv-00000", stop=stop, timeout=10):
                        arrived.append(time.perf_counter())
                        return

            t = threading.Thread(target=watch, args=(store.revision(),))
            t.start()
            time.sleep(0.2)
            t0 = time.perf_counter()
            store.update(h.model_copy(update={"status": status}), agent_manager("hv-00000"))
            want = str(Quantity(used))  # the core's string, e.g. "1k"
            page.wait_for_function(f"document.querySelector(\"{cell}\").dataset.allocation === '{want}'",
                                   timeout=30_000)
            shown.append(time.perf_counter() - t0)
            t.join(10)
            stop.set()
            if arrived:
                seen.append(arrived[0] - t0)
            time.sleep(0.5)
    ctx.close()
    return statistics.median(shown) * 1000, statistics.median(seen or [float("nan")]) * 1000


def tab_traffic(browser: Any, url: str, tok: str, store_url: str, rate: float,
                seconds: float) -> dict[str, float]:
    """One open overview tab: bytes received and redraws, for `seconds` quiet,
    then for `seconds` under `rate` status writes a second (each as its host's
    agent, spread over the fleet)."""
    import threading

    ctx = browser.new_context(ignore_https_errors=True, viewport={"width": 1400, "height": 1000})
    host = url.split("//", 1)[1].split(":")[0]
    ctx.add_cookies([{"name": "hvfleet_session", "value": tok, "domain": host, "path": "/",
                      "httpOnly": True, "secure": True, "sameSite": "Strict"}])
    page = ctx.new_page()
    received = [0]
    cdp = ctx.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.on("Network.dataReceived", lambda e: received.__setitem__(0, received[0] + e["encodedDataLength"]))
    page.goto(url + "/")
    page.wait_for_selector("#live-status:has-text('on')", timeout=60_000)
    page.wait_for_timeout(3000)  # the heat map and history loaded

    def window(writes: bool) -> tuple[float, float, int]:
        stop = threading.Event()
        written = [0]

        def write() -> None:
            with open_store(store_url) as store:
                hosts = {h.name: h for h in store.list_hypervisors()}
                names = sorted(hosts)
                t0 = time.perf_counter()
                i = 0
                while not stop.is_set():
                    name = names[(i * 7919) % len(names)]
                    h = hosts[name]
                    status = h.status.model_copy(update={"allocation": {**h.status.allocation,
                                                                         "cpu": Quantity(i % 64)}})
                    hosts[name] = store.update(h.model_copy(update={"status": status}), agent_manager(name))
                    i += 1
                    ahead = t0 + i / rate - time.perf_counter()
                    if ahead > 0:
                        time.sleep(ahead)
                written[0] = i

        b0, r0 = received[0], int(page.get_attribute("body", "data-redraws") or 0)
        t = threading.Thread(target=write) if writes else None
        t0 = time.perf_counter()
        if t:
            t.start()
        page.wait_for_timeout(seconds * 1000)
        stop.set()
        if t:
            t.join()
        elapsed = time.perf_counter() - t0
        redraws = int(page.get_attribute("body", "data-redraws") or 0) - r0
        return (received[0] - b0) * 60 / elapsed, redraws / elapsed, int(written[0] / elapsed)

    quiet_bytes, quiet_redraws, _ = window(False)
    busy_bytes, busy_redraws, achieved = window(True)
    ctx.close()
    return {"quiet_bytes": quiet_bytes, "quiet_redraws": quiet_redraws, "bytes": busy_bytes,
            "redraws": busy_redraws, "rate": achieved}


def heat_bytes(session: Any, url: str) -> tuple[int, int, int]:
    """The heat map: plain JSON, gzip, and the delta of the fleet's last change."""
    plain = session.get(url + "/dashboard/heat.json", headers={"Accept-Encoding": "identity"}, timeout=120)
    r = session.get(url + "/dashboard/heat.json", stream=True, timeout=120)
    gz = len(r.raw.read(decode_content=False))
    doc = plain.json()
    d = session.get(url + "/dashboard/heat.json",
                    params={"since": doc["version"] - 1, "layout": doc["layout"]}, stream=True, timeout=120)
    return len(plain.content), gz, len(d.raw.read(decode_content=False))


def timed_get(session: Any, url: str, runs: int) -> float:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        r = session.get(url, timeout=120)
        r.raise_for_status()
        out.append(time.perf_counter() - t)
    return statistics.median(out) * 1000


def bench(sizes: list[int], runs: int, rate: float, churn_seconds: float) -> None:
    from playwright.sync_api import sync_playwright

    print(f"{'hosts':>6}  {'page':<10} {'first paint':>12} {'rows drawn':>11} {'interactive':>12} "
          f"{'bytes':>9}")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for n in sizes:
            with tempfile.TemporaryDirectory() as tmp:
                t = time.perf_counter()
                store_url = seed(Path(tmp) / "hvfleet.db", n)
                seeded = time.perf_counter() - t
                tok = token(store_url)
                with serving(Path(tmp), store_url) as fleet:
                    s = fleet.http()
                    s.cookies.set("hvfleet_session", tok)
                    t = time.perf_counter()
                    wait_dashboard_loaded(fleet, tok)  # the first load runs after start-up
                    print(f"{n:>6}  the server's first load of the fleet: {time.perf_counter() - t:.1f} s "
                          "after it answered /readyz")
                    load(browser, fleet.url, tok, "/", "body[data-ready='1']")  # warm-up
                    rows = []
                    for path, ready in (("/", "body[data-ready='1']"), ("/login", "#token")):
                        got = [load(browser, fleet.url, tok, path, ready) for _ in range(runs)]
                        med = {k: statistics.median([g[k] or 0 for g in got]) for k in got[0]}
                        rows.append((path, med))
                    for path, med in rows:
                        label = "overview" if path == "/" else "login(peer)"
                        drawn = f"{med['rendered']:.0f} ms" if path == "/" else "-"
                        print(f"{n:>6}  {label:<10} {med['fcp']:>9.0f} ms {drawn:>11} {med['tti']:>9.0f} ms "
                              f"{med['bytes']:>9.0f}")
                    page_ms, watch_ms = live_latency(browser, fleet.url, tok, store_url, runs)
                    print(f"{n:>6}  live: agent status write -> shown on the open overview {page_ms:.0f} ms; "
                          f"peer: the same write seen by a direct Store.watch {watch_ms:.0f} ms")
                    ov = timed_get(s, fleet.url + "/dashboard/overview.json", runs)
                    heat = timed_get(s, fleet.url + "/dashboard/heat.json", runs)
                    ready = timed_get(s, fleet.url + "/readyz", runs)
                    print(f"{n:>6}  server: overview.json {ov:.1f} ms, heat.json {heat:.1f} ms; "
                          f"peer /readyz {ready:.1f} ms (store seeded or copied in {seeded:.1f} s)")
                    plain, gz, delta = heat_bytes(s, fleet.url)
                    print(f"{n:>6}  heat.json bytes: gzip {gz:,} and a one-host delta {delta:,}; "
                          f"peer: the plain JSON {plain:,}")
                    tr = tab_traffic(browser, fleet.url, tok, store_url, rate, churn_seconds)
                    print(f"{n:>6}  one open tab under {tr['rate']} status writes/s: "
                          f"{tr['bytes'] / 1024:,.0f} KiB/min, {tr['redraws']:.2f} redraws/s; "
                          f"peer: the same tab quiet {tr['quiet_bytes'] / 1024:,.1f} KiB/min, "
                          f"{tr['quiet_redraws']:.2f} redraws/s")
        browser.close()


def screenshots(out: Path) -> None:
    """The overview, a host, fit and guests pages of the example fleet, as PNGs."""
    from playwright.sync_api import sync_playwright
    from tests.dashboard.fleet import hvfleet, login, report_fleet
    from tests.dashboard.test_dashboard import _group_in_store

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        store_url = f"sqlite:///{tmp}/hvfleet.db"
        report_fleet(store_url)
        hvfleet("overcommit", "set", "compute-01", "cpu=4", "memory=1.5", "--manager", "capacity-planner",
                "--store", store_url)
        hvfleet("reserve", "compute-01", "--cpu", "8", "--memory", "16Gi", "--consumer",
                "0b7e6f7e-5b1c-4f4e-9d7a-3f1f2f0e8a11", "--ttl", "1h", "--store", store_url)
        hvfleet("overcommit", "set", "compute-02", "cpu=2", "--manager", "ops", "--store", store_url)
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        with serving(Path(tmp), store_url) as fleet:
            _group_in_store(fleet, "intel-mixed")
            tok = fleet.token("operator", "ops")
            ctx = browser.new_context(ignore_https_errors=True, viewport={"width": 1280, "height": 900})
            page = ctx.new_page()
            login(page, fleet, tok)
            page.wait_for_selector("#heat canvas")
            page.screenshot(path=str(out / "dashboard-overview.png"), full_page=True)
            page.goto(fleet.url + "/hosts/compute-01")
            page.screenshot(path=str(out / "dashboard-host.png"), full_page=True)
            page.goto(fleet.url + "/fit?go=1&cpu=8&memory=64Gi&weigher=binpack")
            page.screenshot(path=str(out / "dashboard-fit.png"), full_page=True)
            page.goto(fleet.url + "/guests?go=1&selector=group%3Dintel-mixed&os=rhel9.1&name=web&vcpus=2"
                      "&memory=4Gi&firmware=auto")
            page.screenshot(path=str(out / "dashboard-guests.png"), full_page=True)
            ctx.close()
        browser.close()
    print(f"screenshots in {out}")


def main() -> None:
    import warnings

    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", default="1000,10000")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rate", type=float, default=100.0, help="status writes a second under churn")
    ap.add_argument("--churn-seconds", type=float, default=30.0)
    ap.add_argument("--screenshots", type=Path)
    args = ap.parse_args()
    if args.screenshots:
        screenshots(args.screenshots)
        return
    bench([int(x) for x in args.hosts.split(",")], args.runs, args.rate, args.churn_seconds)


if __name__ == "__main__":
    main()
