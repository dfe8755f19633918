"""A replica stopped (SIGTERM) while streams are open: its API watches and
dashboard event streams end at once, each as a complete HTTP answer (the last
chunk sent), so a Kubernetes client sees its watch end and watches again on
another replica; the process exits 0 within about a second, with nothing on
stderr (no "graceful shutdown exceeded", no traceback, no token watch
reading the closed store)."""

from __future__ import annotations

import http.client
import signal
import ssl
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from hvfleet.model import Hypervisor
from hvfleet.store import open_store
from hvfleet.store.ownership import agent_manager
from tests.support.serve import GV, start_server, stop_server

# SIGTERM to exit: uvicorn's own steps (0.1 s of waiting for connections, the
# app's shutdown) and the process's exit, with room for a loaded machine.
PROMPT_S = 1.5


@pytest.mark.parametrize("stream", ["watch", "dashboard events"])
def test_a_stopped_server_ends_its_open_streams_cleanly_and_exits_at_once(tmp_path: Path,
                                                                          stream: str) -> None:
    srv = start_server(tmp_path)
    try:
        with open_store(srv.store_url) as store:
            store.create(Hypervisor.model_validate({"metadata": {"name": "hv1"}}), agent_manager("hv1"))
        where = urlsplit(srv.url)
        assert where.hostname is not None and where.port is not None
        conn = http.client.HTTPSConnection(where.hostname, where.port, timeout=30,
                                           context=ssl.create_default_context(cafile=str(srv.ca)))
        if stream == "watch":
            conn.request("GET", f"{GV}/hypervisors?watch=true&timeoutSeconds=300",
                         headers={"Authorization": f"Bearer {srv.tokens['viewer']}"})
        else:
            conn.request("GET", "/dashboard/events",
                         headers={"Cookie": f"hvfleet_session={srv.tokens['viewer']}"})
        resp = conn.getresponse()
        assert resp.status == 200
        first = resp.readline()
        assert (b'"ADDED"' in first and b'"hv1"' in first) if stream == "watch" else \
            first.startswith(b"event: hello")

        stopped = time.monotonic()
        srv.process.send_signal(signal.SIGTERM)
        # The rest of the answer, to its last chunk: http.client raises
        # IncompleteRead if the connection closes before it.
        resp.read()
        ended = time.monotonic() - stopped
        assert resp.isclosed()
        code = srv.process.wait(timeout=30)
        exited = time.monotonic() - stopped
        _, err = srv.process.communicate()
    finally:
        stop_server(srv)
    assert code == 0, err
    assert "graceful shutdown exceeded" not in err and "Traceback" not in err, err
    assert "token watch failed" not in err, err  # the token watch ended before the store closed
    assert ended < PROMPT_S, f"the {stream} stream ended {ended:.2f} s after SIGTERM"
    assert exited < PROMPT_S, f"the server exited {exited:.2f} s after SIGTERM"
