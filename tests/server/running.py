"""A real uvicorn server in a background thread of the test process, on a free
127.0.0.1 port, plus a kubeconfig for it and a small HTTP helper."""

from __future__ import annotations

import base64
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import uvicorn
import yaml

from hvfleet.store import Store
from tests.server.static_auth import AllowAll
from tests.server.tls_files import TlsFiles


class ServerThread:
    def __init__(self, app: Any, tls: TlsFiles | None = None, http: Any = "auto") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2,
                                ssl_certfile=str(tls.cert) if tls else None,
                                ssl_keyfile=str(tls.key) if tls else None, http=http)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name=f"uvicorn-{self.port}", daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.join()

    def stop(self) -> None:
        """Ask uvicorn to stop: it notices within 0.1 s, asks each connection to
        close, sleeps 0.1 s and runs the app's shutdown."""
        self.server.should_exit = True

    def join(self) -> None:
        self.thread.join(timeout=10)
        self.sock.close()


_stopping: list[threading.Thread] = []


def stop_in_background(servers: list[ServerThread], then: Callable[[], None]) -> None:
    """Stop `servers` and run `then` (closing their stores) once they have stopped,
    in a thread: a test's teardown need not wait out uvicorn's ~0.2 s of shutdown
    sleeps, the next test runs meanwhile. A test that needs a server gone (a
    replica dying) uses __exit__. wait_stopped() joins them all."""
    for server in servers:
        server.stop()

    def finish() -> None:
        for server in servers:
            server.join()
        then()

    thread = threading.Thread(target=finish, name="uvicorn-stopping", daemon=True)
    thread.start()
    _stopping[:] = [t for t in _stopping if t.is_alive()] + [thread]


def wait_stopped() -> None:
    for thread in _stopping:
        thread.join(timeout=15)


class Client:
    """requests against one server with one bearer token."""

    def __init__(self, url: str, token: str | None, ca: Path | None = None) -> None:
        self.url = url
        self.session = requests.Session()
        # Per request: a session's verify loses to $REQUESTS_CA_BUNDLE.
        self.verify: str | bool = str(ca) if ca is not None else True
        if token is not None:
            self.session.headers["Authorization"] = f"Bearer {token}"

    def call(self, method: str, path: str, **kw: Any) -> requests.Response:
        kw.setdefault("timeout", 30)
        kw.setdefault("verify", self.verify)
        return self.session.request(method, self.url + path, **kw)

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.call("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> requests.Response:
        return self.call("POST", path, **kw)

    def put(self, path: str, **kw: Any) -> requests.Response:
        return self.call("PUT", path, **kw)

    def delete(self, path: str, **kw: Any) -> requests.Response:
        return self.call("DELETE", path, **kw)

    def patch(self, path: str, body: Any, content_type: str = "application/merge-patch+json",
              **kw: Any) -> requests.Response:
        data = body if isinstance(body, (str, bytes)) else __import__("json").dumps(body)
        return self.call("PATCH", path, data=data, headers={"Content-Type": content_type}, **kw)


def write_kubeconfig(path: Path, server: str, token: str, ca: Path | None = None,
                     name: str = "hvfleet") -> Path:
    """A kubeconfig as kubectl and the client libraries read it. kubectl sends the
    token only over HTTPS, so tests with it serve TLS and pass the CA."""
    cluster: dict[str, Any] = {"server": server}
    if ca is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca.read_bytes()).decode()
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@dataclass
class Api:
    url: str
    store: Store
    authorizer: AllowAll
    server: ServerThread
    ca: Path | None = None

    def client(self, token: str | None = "ops-token") -> Client:
        return Client(self.url, token, self.ca)
