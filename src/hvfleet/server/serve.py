"""Starting `hvfleet serve`: the listen address (and, with --placement-listen,
a second one serving the Placement API at its root), TLS, the store, the
token authenticator and role authorizer, the audit log, and uvicorn.

The server speaks HTTPS unless told otherwise: with no certificate it makes its
own CA in the data dir (hvfleet.server.tls). Plain HTTP is served only when
asked for and only on a loopback address, where no one else can listen in.
The socket is bound here, before uvicorn starts, so a port of 0 works and the
address printed is the one really served.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hvfleet.model.errors import InvalidInput, Unavailable
from hvfleet.server.app import create_app
from hvfleet.server.audit import JsonAuditLog, configure_audit_log
from hvfleet.server.auth import DEFAULT_MAX_AGE_S, RoleAuthorizer, TokenAuthenticator
from hvfleet.server.dashboard.history import DEFAULT_RETENTION, DEFAULT_TIERS, HistorySettings
from hvfleet.server.placement import ByListener
from hvfleet.server.tls import (
    ServingFiles,
    ensure_serving_certificate,
    given_certificate,
    rotate_shared_ca,
    shared_signer,
)
from hvfleet.store import Store, open_store
from hvfleet.store.remote import is_loopback

DEFAULT_LISTEN = "127.0.0.1:8443"
GRACEFUL_SHUTDOWN_S = 5


def default_data_dir() -> Path:
    return Path(os.environ.get("HVFLEET_DATA_DIR") or "hvfleet-data")


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT`, `[V6]:PORT`; port 0 picks a free one."""
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdecimal() or int(port) > 65535:
        raise InvalidInput(f"listen: {text!r} is not HOST:PORT (e.g. 127.0.0.1:8443 or [::1]:8443)")
    if host.startswith("["):
        if not host.endswith("]"):
            raise InvalidInput(f"listen: {text!r}: an IPv6 address goes in brackets, [::1]:8443")
        host = host[1:-1]
    elif ":" in host:
        raise InvalidInput(f"listen: {text!r}: put an IPv6 address in brackets, [{host}]:{port}")
    return host, int(port)


@dataclass(frozen=True)
class ServeOptions:
    store: str | None = None
    listen: str = DEFAULT_LISTEN
    tls_cert: str | None = None
    tls_key: str | None = None
    data_dir: Path | None = None
    insecure_http: bool = False
    audit_log: str | None = None
    token_cache_seconds: float = DEFAULT_MAX_AGE_S
    # The dashboard's history in the store (server/dashboard/history.py).
    history_tiers: str = DEFAULT_TIERS
    history_retention: str = DEFAULT_RETENTION
    # One step of a rotation of the CA the replicas share (tls.ROTATION_STEPS):
    # done on the store, then the command ends without serving.
    rotate_ca: str | None = None
    # More names the serving certificate must carry (a load balancer's name,
    # the address clients reach this replica at).
    tls_names: tuple[str, ...] = ()
    # HOST:PORT of a second listener serving the Placement API at its root
    # (Placement's own endpoint form, port 8778), same TLS identity and tokens.
    placement_listen: str | None = None
    # uvicorn's HTTP implementation (server/connection.py): "auto" is httptools
    # when installed, else h11; and its event loop: "auto" is uvloop when
    # installed, else asyncio's. Both for the CPU a request costs (docs/scaling.md).
    http: str = "auto"
    loop: str = "auto"
    # Seconds: the store's shared stream is read at most this often while
    # writes come faster (None: the store's default; store/etcd.py FEED_PACE_S).
    follow_pace: float | None = None


def plan_tls(options: ServeOptions, host: str, store: Store | None = None) -> ServingFiles | None:
    """The certificate to serve with, or None for plain HTTP (loopback only).
    Without one given, issued by the CA the replicas over `store` share (or,
    over a store that keeps no server secrets, the data dir's own CA)."""
    if options.insecure_http:
        if options.tls_cert or options.tls_key:
            raise InvalidInput("TLS: plain HTTP was asked for together with a certificate; choose one")
        if not is_loopback(host):
            raise InvalidInput(
                f"listen: plain HTTP is served only on a loopback address "
                f"(127.0.0.1, ::1, localhost), not {host}"
            )
        return None
    if bool(options.tls_cert) != bool(options.tls_key):
        raise InvalidInput("TLS: a certificate needs its key, and a key its certificate")
    if options.tls_cert and options.tls_key:
        return given_certificate(options.tls_cert, options.tls_key)
    data_dir = options.data_dir or default_data_dir()
    shared = None if store is None else shared_signer(store, data_dir)
    return ensure_serving_certificate(data_dir, host, extra_names=options.tls_names, shared=shared)


def _placement_listen(options: ServeOptions, host: str, port: int) -> tuple[str, int]:
    """The Placement listener's address: HOST:PORT as --listen takes it, on
    another port than the main listener, plain HTTP only on loopback."""
    assert options.placement_listen is not None
    try:
        phost, pport = parse_listen(options.placement_listen)
    except InvalidInput as exc:
        raise InvalidInput(f"placement-{exc}") from None
    if pport != 0 and pport == port:
        raise InvalidInput(f"placement-listen: {options.placement_listen!r} is the port of listen "
                           f"({options.listen}); the Placement API needs a port of its own")
    if options.insecure_http and not is_loopback(phost):
        raise InvalidInput(f"placement-listen: plain HTTP is served only on a loopback address "
                           f"(127.0.0.1, ::1, localhost), not {phost}")
    return phost, pport


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if host == "localhost":
        host = "127.0.0.1"
    # IPPROTO_TCP explicitly: asyncio turns Nagle off (TCP_NODELAY) only for sockets
    # whose protocol says TCP; with proto 0 every small response waited ~40 ms for
    # the client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise Unavailable(f"listen: cannot bind {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


LOOPS = ("auto", "asyncio", "uvloop")


# The longest pace of the shared stream `--follow-pace` takes (seconds).
MAX_FOLLOW_PACE_S = 1.0


def follow_pace(seconds: float | None) -> float | None:
    """`--follow-pace` checked: a number of seconds in [0, MAX_FOLLOW_PACE_S]."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) \
            or not 0 <= seconds <= MAX_FOLLOW_PACE_S:
        raise InvalidInput(f"follow-pace: {seconds!r} is not a number of seconds from 0 "
                           f"to {MAX_FOLLOW_PACE_S:g}")
    return float(seconds)


def event_loop(choice: str) -> str:
    """uvicorn's loop setting for `choice`: uvloop when asked for or, for
    "auto", when installed; else asyncio's own."""
    if choice not in LOOPS:
        raise InvalidInput(f"loop: {choice!r} is not one of {', '.join(LOOPS)}")
    if choice == "asyncio":
        return "asyncio"
    if importlib.util.find_spec("uvloop") is not None:
        return "uvloop"
    if choice == "uvloop":
        raise InvalidInput("loop: uvloop is not installed (pip install uvloop)")
    return "asyncio"


@contextlib.contextmanager
def _sigterm_exits_0() -> Iterator[None]:
    """Once uvicorn has shut down on SIGTERM it raises the signal again, which
    by default kills the process (exit -15) before the store is closed: here
    that SIGTERM ends `serve` as SystemExit(0), through its cleanup. (Only the
    main thread can handle signals; elsewhere uvicorn leaves them alone too.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stopped(signum: int, frame: object) -> None:
        raise SystemExit(0)

    previous = signal.signal(signal.SIGTERM, stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def serve(options: ServeOptions, announce: Callable[[str], None] | None = None) -> None:
    """Run the API server until SIGINT/SIGTERM."""
    import uvicorn

    from hvfleet.server.connection import http_protocol

    say = announce or (lambda line: print(line, flush=True))
    host, port = parse_listen(options.listen)
    placement_at: tuple[str, int] | None = None
    if options.placement_listen is not None:
        placement_at = _placement_listen(options, host, port)
        # One TLS identity for both listeners: the certificate names both hosts.
        options = replace(options, tls_names=(*options.tls_names, placement_at[0]))
    history = HistorySettings.parse(options.history_tiers, options.history_retention)
    protocol = http_protocol(options.http)
    loop = event_loop(options.loop)
    pace = follow_pace(options.follow_pace)
    store = open_store(options.store)
    # Before the token watch below starts (create_app says it again).
    store.share_watches(pace)
    if options.rotate_ca is not None:
        try:
            say(f"hvfleet serve: rotate-ca {options.rotate_ca}: "
                + rotate_shared_ca(store, options.rotate_ca))
        finally:
            store.close()
        return
    placement_sock: socket.socket | None = None
    try:
        tls = plan_tls(options, host, store)
        sock = bind(host, port)
        if placement_at is not None:
            try:
                placement_sock = bind(*placement_at)
            except BaseException:
                sock.close()
                raise
    except BaseException:
        store.close()
        raise
    authenticator: TokenAuthenticator | None = None
    try:
        configure_audit_log(options.audit_log)
        authenticator = TokenAuthenticator(store, max_age=options.token_cache_seconds, follow=True)
        app = create_app(
            store,
            authenticator,
            RoleAuthorizer(),
            audit=JsonAuditLog(),
            history=history,
        )
        real_port = sock.getsockname()[1]
        scheme = "http" if tls is None else "https"
        shown = f"[{host}]" if ":" in host else host
        say(f"hvfleet serve: {scheme}://{shown}:{real_port} over {store.url}")
        served: Any = app
        sockets = [sock]
        if placement_sock is not None and placement_at is not None:
            placement_port = placement_sock.getsockname()[1]
            served = ByListener(app, placement_port)
            sockets.append(placement_sock)
            phost = f"[{placement_at[0]}]" if ":" in placement_at[0] else placement_at[0]
            say(f"hvfleet serve: Placement API at {scheme}://{phost}:{placement_port}/")
        if tls is not None and tls.ca is not None:
            say(f"CA certificate: {tls.ca.resolve()}")
        config = uvicorn.Config(
            served,
            ssl_certfile=None if tls is None else str(tls.cert),
            ssl_keyfile=None if tls is None else str(tls.key),
            log_level="warning",
            access_log=False,
            # httptools or h11, with a deadline for each request's head (server/connection.py).
            http=protocol,
            loop=loop,
            # No X-Forwarded-* rewriting of the client address (one middleware
            # less per request): nothing here reads that address, and a load
            # balancer in front passes TCP through (docs/scaling.md).
            proxy_headers=False,
            timeout_keep_alive=30,
            # On SIGTERM, open streams end at once (ApiContext.stopping) and in-flight
            # requests get this long; then what is left (TLS connections whose client
            # never says goodbye) is closed, not waited on.
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            # The server's own line above is the address; uvicorn's would say :0.
            server_header=False,
        )
        stopping = app.state.ctx.stopping

        class Server(uvicorn.Server):
            async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
                # Open streams (watches, dashboard event streams) end their
                # answers first: uvicorn then waits only for requests in flight.
                stopping.set()
                await super().shutdown(sockets)

        with _sigterm_exits_0():
            Server(config).run(sockets=sockets)
    finally:
        sock.close()
        if placement_sock is not None:
            placement_sock.close()
        if authenticator is not None:
            authenticator.close()  # its token watch ends before the store closes
        store.close()
        sys.stdout.flush()
