"""Starts a real OpenStack Placement (`openstack-placement` from PyPI) for tests
and benchmarks: its own WSGI application (placement.wsgi.init_application) in a
child process, on SQLite in a temporary directory, with the noauth2 strategy,
served on 127.0.0.1 on a free port. Stopped by its PID.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from types import TracebackType

from hvfleet.scheduling.placement_client import PlacementClient

_SERVER = textwrap.dedent(
    """
    import os, sys
    os.environ["OS_PLACEMENT_CONFIG_DIR"] = sys.argv[1]
    from wsgiref import simple_server
    from placement.wsgi import init_application

    class Handler(simple_server.WSGIRequestHandler):
        def log_message(self, *args):
            pass

    app = init_application()
    server = simple_server.make_server("127.0.0.1", 0, app, handler_class=Handler)
    print(server.server_port, flush=True)
    server.serve_forever()
    """
)


class RealPlacement:
    """`with RealPlacement() as p: p.client.get("/")`"""

    def __init__(self, workdir: Path | None = None) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="hvfleet-placement-")
            workdir = Path(self._tmp.name)
        self.workdir = workdir
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> RealPlacement:
        conf = self.workdir / "placement.conf"
        conf.write_text(
            textwrap.dedent(
                f"""
                [DEFAULT]
                debug = False
                log_file = {self.workdir / "placement.log"}
                [api]
                auth_strategy = noauth2
                [placement_database]
                connection = sqlite:///{self.workdir / "placement.db"}
                sync_on_startup = True
                """
            )
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER, str(self.workdir)],
            stdout=subprocess.PIPE,
            stderr=open(self.workdir / "stderr.log", "w"),  # noqa: SIM115
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if not line.isdigit():
            self.stop()
            err = (self.workdir / "stderr.log").read_text()[-2000:]
            raise RuntimeError(f"placement did not start: {err}")
        self.url = f"http://127.0.0.1:{line}"
        deadline = time.monotonic() + 30
        while True:
            try:
                with PlacementClient(self.url) as c:
                    c.get("/")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        return self

    def client(self, microversion: str | None = None) -> PlacementClient:
        if microversion is None:
            return PlacementClient(self.url)
        return PlacementClient(self.url, microversion=microversion)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> RealPlacement:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


if __name__ == "__main__":  # manual use: python tests/scheduling/real_placement.py
    with RealPlacement() as p:
        print(p.url, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    os._exit(0)
