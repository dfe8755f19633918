"""`hvfleet serve --placement-listen HOST:PORT`: the Placement API at the root
of a listener of its own (Placement's usual endpoint form, Nova's
`[placement] endpoint_override`), with the same TLS identity and tokens as
the main listener, whose `/placement` stays. One real server process for the
module; bad addresses are refused before anything is served (exit 2)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests

from hvfleet.store import open_store
from hvfleet.store.tokens import issue_token

HVFLEET = str(Path(sys.executable).parent / "hvfleet")
MV = {"OpenStack-API-Version": "placement 1.39"}


@dataclass
class Listeners:
    main: str  # https://127.0.0.1:PORT
    placement: str  # https://127.0.0.1:PORT, the Placement API at /
    ca: Path
    token: str
    proc: subprocess.Popen[str]

    def get(self, url: str, token: str | None = None, **kw: object) -> requests.Response:
        headers = {**MV, **({"X-Auth-Token": token} if token else {})}
        return requests.get(url, headers=headers, verify=str(self.ca), timeout=60, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def listeners(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listeners]:
    tmp = tmp_path_factory.mktemp("placement-listen")
    store_url = f"sqlite:///{tmp}/hvfleet.db"
    with open_store(store_url) as store:
        _, token = issue_token(store, "admin", manager="test", now=datetime.now(UTC), ttl=None, name="a")
    proc = subprocess.Popen(
        [HVFLEET, "serve", "--store", store_url, "--listen", "127.0.0.1:0", "--placement-listen",
         "127.0.0.1:0", "--data-dir", str(tmp / "data"), "--audit-log", str(tmp / "audit.log")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        text = "".join(lines)
        main = re.search(r"hvfleet serve: (https://127\.0\.0\.1:\d+) over ", text)
        ca = re.search(r"CA certificate: (\S+)", text)
        placement = re.search(r"Placement API at (https://127\.0\.0\.1:\d+)/", text)
        assert main and ca and placement, text
        got = Listeners(main[1], placement[1], Path(ca[1]), token, proc)
        deadline = time.monotonic() + 60
        while True:
            try:
                if got.get(got.main + "/readyz").status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "serve did not become ready"
            time.sleep(0.1)
        yield got
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_placement_listener_serves_placement_at_its_root_with_the_same_ca(listeners: Listeners) -> None:
    root = listeners.get(listeners.placement + "/")
    assert root.status_code == 200
    assert root.json()["versions"][0]["max_version"] == "1.39"
    assert listeners.get(listeners.main + "/placement/").json() == root.json()


def test_a_provider_made_at_the_root_has_root_links_there_and_placement_links_on_the_main_listener(
    listeners: Listeners,
) -> None:
    u = str(uuid.uuid4())
    made = requests.post(listeners.placement + "/resource_providers", json={"name": u, "uuid": u},
                         headers={**MV, "X-Auth-Token": listeners.token}, verify=str(listeners.ca),
                         timeout=60)
    assert made.status_code == 200, made.text
    assert made.headers["location"] == f"{listeners.placement}/resource_providers/{u}"
    assert {link["href"] for link in made.json()["links"]} >= {f"/resource_providers/{u}",
                                                                f"/resource_providers/{u}/inventories"}
    main = listeners.get(f"{listeners.main}/placement/resource_providers/{u}", listeners.token)
    assert main.status_code == 200
    assert main.json()["links"][0] == {"rel": "self", "href": f"/placement/resource_providers/{u}"}


def test_the_placement_listener_takes_the_same_tokens_and_nothing_else_of_the_api(
    listeners: Listeners,
) -> None:
    assert listeners.get(listeners.placement + "/resource_providers").status_code == 401
    assert listeners.get(listeners.placement + "/resource_providers", "hvf_nope").status_code == 401
    assert listeners.get(listeners.placement + "/resource_providers", listeners.token).status_code == 200
    # The Kubernetes-shaped API is the main listener's only: here it is Placement's 404.
    other = listeners.get(listeners.placement + "/apis/hvfleet.io/v1/hypervisors", listeners.token)
    assert other.status_code == 404
    assert other.json()["errors"][0]["title"] == "Not Found"


@pytest.mark.parametrize(("value", "says"), [
    ("8778", "placement-listen: '8778' is not HOST:PORT"),
    ("127.0.0.1:18443", "is the port of listen"),
])
def test_a_bad_placement_listen_address_is_refused_with_exit_2(tmp_path: Path, value: str, says: str) -> None:
    run = subprocess.run(
        [HVFLEET, "serve", "--store", f"sqlite:///{tmp_path}/h.db", "--listen", "127.0.0.1:18443",
         "--placement-listen", value, "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert says in run.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was made
