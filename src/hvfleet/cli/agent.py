"""`hvfleet agent`: run the node agent for one libvirt host.

    hvfleet agent --connect URI [--name NAME] [--store URL] [--token T] [--ca F] [--once]
                  [--resync 60s] [--lease-ttl 30s] [--status-resync 5m] [--count defined|running]
                  [--metrics-addr HOST:PORT]

`--once` reconciles one time and exits (1 if libvirt cannot be reached);
otherwise the agent runs until SIGTERM or SIGINT and then exits cleanly.
`hvfleet agent ...` runs through `standalone()`, which loads this command
only, not the other families' dependencies (numpy, rich, the guest
generator), so a long-running agent on every host stays small in memory.
"""

from __future__ import annotations

import logging
import math
import signal
import sys
import threading
from datetime import UTC, datetime
from types import FrameType

import typer
import typer.main

from hvfleet.agent.metrics import AgentMetrics
from hvfleet.agent.runner import Agent, AgentConfig
from hvfleet.cli.main import PLAIN, app, error_line, with_connection_options
from hvfleet.model.durations import parse_duration
from hvfleet.model.errors import HvfleetError, InvalidInput
from hvfleet.model.hypervisor import COUNT_MODES, CountMode, Hypervisor
from hvfleet.model.readiness import readiness
from hvfleet.model.resources import CPU, MEMORY, ResourceName
from hvfleet.ops.quantities import readable
from hvfleet.store import open_store, store_url


def parse_count(text: str) -> CountMode:
    for mode in COUNT_MODES:
        if text == mode:
            return mode
    raise InvalidInput(f"--count: {text!r} is not one of {', '.join(COUNT_MODES)}")


def summary(h: Hypervisor, url: str) -> str:
    s = h.status

    def fraction(r: ResourceName) -> str:
        # The human form every table shows (memory 8.3Gi/15.5Gi, not 8742684Ki).
        return f"{r} {readable(r, s.allocation.get(r))}/{readable(r, s.capacity.get(r))}"

    # The agent's own view: no lease to consult (it holds it), judged now.
    state = readiness(h, datetime.now(UTC)).state
    return (
        f"{h.name}: {fraction(CPU)}, {fraction(MEMORY)}, {len(s.instances)} instance(s), "
        f"{len(s.cells)} cell(s), {state} → {url}"
    )


@app.command("agent")
def agent(
    connect: str = typer.Option(
        ..., "--connect", metavar="URI",
        help="libvirt URI: test:///default, test:///abs/node.xml, qemu:///embed?root=DIR, "
        "qemu:///system",
    ),
    name: str | None = typer.Option(
        None, "--name", help="Hypervisor name (default: libvirt's host name; the file name "
        "for a test-driver node file)",
    ),
    store: str | None = typer.Option(
        None, "--store", metavar="URL", help="store URL (default: $HVFLEET_STORE or "
        "sqlite:///hvfleet.db)",
    ),
    once: bool = typer.Option(False, "--once", help="reconcile once, write status, exit"),
    resync: str = typer.Option("60s", "--resync", help="full resync period, e.g. 60s, 5m"),
    lease_ttl: str = typer.Option(
        "30s", "--lease-ttl", help="liveness Lease duration (renewed every third of it): "
        "readers see the host NotReady this long after the agent stops",
    ),
    status_resync: str = typer.Option(
        "5m", "--status-resync", help="rewrite an unchanged status this often (the liveness "
        "Lease, renewed every few seconds, is the heartbeat in between)",
    ),
    count: str = typer.Option(
        "defined", "--count", help="count defined domains (shut-off ones hold their place) "
        "or only running ones",
    ),
    metrics_addr: str | None = typer.Option(
        None, "--metrics-addr", metavar="HOST:PORT", help="serve Prometheus metrics here",
    ),
    dump_dir: str | None = typer.Option(
        None, "--dump-dir", metavar="DIR", help="where libvirt writes guest core dumps on "
        "this host (qemu.conf auto_dump_path); reported as hostCapabilities.dumpLocation",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="log every reconcile"),
) -> None:
    """Keep one hypervisor's status (capacity, allocation, instances, host
    capabilities, effective capacity) true, from libvirt."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="hvfleet agent: %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    config = AgentConfig(
        uri=connect,
        name=name,
        count=parse_count(count),
        resync=parse_duration(resync, field="resync", positive=True).total_seconds(),
        lease_ttl=math.ceil(parse_duration(lease_ttl, field="lease_ttl", positive=True).total_seconds()),
        status_resync=parse_duration(status_resync, field="status_resync", positive=True).total_seconds(),
        dump_location=dump_dir,
    )
    url = store_url(store)
    metrics = AgentMetrics(name or "")
    if metrics_addr is not None:
        host, port = metrics.serve(metrics_addr)
        logging.getLogger(__name__).info("metrics on http://%s:%d/metrics", host, port)
    try:
        with open_store(url) as backend:
            runner = Agent(config, backend, metrics)
            if once:
                print(summary(runner.run_once(), url))
                return
            stop = threading.Event()

            def request_stop(_signum: int, _frame: FrameType | None) -> None:
                stop.set()

            signal.signal(signal.SIGTERM, request_stop)
            signal.signal(signal.SIGINT, request_stop)
            runner.run(stop)
    finally:
        metrics.close()


def standalone(argv: list[str], prog_name: str = "hvfleet agent") -> None:
    """`hvfleet agent ARGS` with only this command loaded."""
    one = typer.Typer(**PLAIN)  # type: ignore[arg-type]
    one.command()(agent)
    try:
        with_connection_options(typer.main.get_command(one))(args=argv, prog_name=prog_name)
    except HvfleetError as exc:
        from hvfleet.cli.exit_codes import exit_code_of  # only on the way out

        print(error_line(exc), file=sys.stderr)
        sys.exit(exit_code_of(exc))
