"""`hvfleet serve`: the fleet's Kubernetes-shaped HTTPS API.

    hvfleet serve [--store URL] [--listen 127.0.0.1:8443] [--tls-cert F --tls-key F]
                  [--data-dir DIR] [--insecure-http] [--audit-log FILE] [--tls-name NAME...]
                  [--history-retention 7d] [--history-tiers 10s:1h,1m:1d,10m:7d]
                  [--placement-listen HOST:PORT] [--http auto|h11|httptools] [--loop auto|asyncio|uvloop]
                  [--follow-pace SECONDS]
    hvfleet serve --store URL --rotate-ca begin|switch|end

The CLI and the server are two edges that never import each other
(ARCHITECTURE.md): this command parses its flags and then becomes the server
program (`python -m hvfleet.server`, by exec, so signals, the PID and the exit
code are the server's own), handing it the settings as one JSON argument.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from hvfleet.cli.main import app

# Not the clients' StoreOpt: the store this server serves, never another
# server's (so no --token, --ca or --kubeconfig either).
ServedStoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store", envvar="HVFLEET_STORE",
        help="The store this server serves: sqlite:///PATH (default ./hvfleet.db) or "
        "etcd://HOST:PORT[,HOST:PORT].",
    ),
]


@app.command("serve")
def serve(
    store: ServedStoreOpt = None,
    listen: Annotated[str, typer.Option("--listen", help="HOST:PORT to serve on.")] = "127.0.0.1:8443",
    tls_cert: Annotated[str | None, typer.Option("--tls-cert", help="Serving certificate (PEM).")] = None,
    tls_key: Annotated[str | None, typer.Option("--tls-key", help="Its private key (PEM).")] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", envvar="HVFLEET_DATA_DIR",
                     help="Where the server keeps its own CA (default ./hvfleet-data)."),
    ] = None,
    insecure_http: Annotated[
        bool, typer.Option("--insecure-http", help="Plain HTTP, allowed only on a loopback address.")
    ] = False,
    audit_log: Annotated[
        str | None, typer.Option("--audit-log", help="File for the JSON audit log (default stderr).")
    ] = None,
    tls_name: Annotated[
        list[str] | None,
        typer.Option("--tls-name", help="Another name (or address) the serving certificate "
                     "must carry, e.g. the load balancer's; repeatable."),
    ] = None,
    rotate_ca: Annotated[
        str | None,
        typer.Option("--rotate-ca", metavar="begin|switch|end",
                     help="Move a rotation of the CA the replicas over this store share one step "
                     "on, then exit without serving (docs/scaling.md)."),
    ] = None,
    history_retention: Annotated[
        str | None, typer.Option("--history-retention",
                                 help="How long the dashboard's history is kept in the store (default 7d).")
    ] = None,
    history_tiers: Annotated[
        str | None, typer.Option("--history-tiers",
                                 help="The history's RESOLUTION:WINDOW tiers, finest first "
                                      "(default 10s:1h,1m:1d,10m:7d).")
    ] = None,
    placement_listen: Annotated[
        str | None, typer.Option("--placement-listen", metavar="HOST:PORT",
                                 help="Also serve the Placement API at the root of this address "
                                      "(Placement's port is 8778), same TLS and tokens; "
                                      "/placement stays on --listen.")
    ] = None,
    http: Annotated[
        str, typer.Option("--http", metavar="auto|h11|httptools",
                          help="uvicorn's HTTP implementation: auto is httptools when installed "
                               "(less CPU per request), else h11.")
    ] = "auto",
    loop: Annotated[
        str, typer.Option("--loop", metavar="auto|asyncio|uvloop",
                          help="The event loop: auto is uvloop when installed, else asyncio's.")
    ] = "auto",
    follow_pace: Annotated[
        float | None, typer.Option("--follow-pace", metavar="SECONDS",
                                   help="Over etcd: read the store's stream of writes at most this "
                                        "often while writes come faster (default 0.01): less CPU "
                                        "per followed write, watch events up to this late; 0 reads "
                                        "each write as it comes.")
    ] = None,
) -> None:
    """Serve the hvfleet.io/v1 API (kubectl and Kubernetes clients work against it)."""
    settings = {
        "store": store, "listen": listen, "tls_cert": tls_cert, "tls_key": tls_key,
        "data_dir": None if data_dir is None else str(data_dir),
        "insecure_http": insecure_http, "audit_log": audit_log, "rotate_ca": rotate_ca,
        "tls_names": tls_name or None,
        "history_retention": history_retention, "history_tiers": history_tiers,
        "placement_listen": placement_listen, "http": http, "loop": loop,
        "follow_pace": follow_pace,
    }
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "hvfleet.server", json.dumps(settings)])
