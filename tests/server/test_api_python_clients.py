"""The official `kubernetes` Python client and lightkube, unmodified, against
the API (TLS with a test CA, through a kubeconfig)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import dynamic, watch
from kubernetes.client.rest import ApiException

from tests.server.clients import GROUP, PLURAL, VERSION, api_client
from tests.server.conftest import Api
from tests.server.objects import agent_reports
from tests.server.running import write_kubeconfig


def hv(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor",
            "metadata": {"name": name, "labels": {"rack": "a"}}, "spec": spec}


@pytest.fixture
def tls_api(make_api: Callable[..., Api]) -> Api:
    return make_api(tls=True)


def test_custom_objects_api_list_get_patch_watch(tls_api: Api, tmp_path: Path) -> None:
    objects = k8s.CustomObjectsApi(api_client(tls_api, tmp_path))
    objects.create_cluster_custom_object(GROUP, VERSION, PLURAL, hv("hv1", overcommit={"cpu": 2}))
    objects.create_cluster_custom_object(GROUP, VERSION, PLURAL, {**hv("hv2"), "metadata": {"name": "hv2"}})
    listed = objects.list_cluster_custom_object(GROUP, VERSION, PLURAL, label_selector="rack=a")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["hv1"]
    got = objects.get_cluster_custom_object(GROUP, VERSION, PLURAL, "hv1")
    assert got["spec"]["overcommit"] == {"cpu": 2}
    patched = objects.patch_cluster_custom_object(GROUP, VERSION, PLURAL, "hv1",
                                                  {"spec": {"maintenance": "drain"}})
    assert patched["spec"]["maintenance"] == "drain"
    with pytest.raises(ApiException) as err:
        objects.get_cluster_custom_object(GROUP, VERSION, PLURAL, "nope")
    assert err.value.status == 404

    rv = listed["metadata"]["resourceVersion"]
    seen: list[tuple[str, str]] = []
    done = threading.Event()

    def follow() -> None:
        w = watch.Watch()
        for event in w.stream(objects.list_cluster_custom_object, GROUP, VERSION, PLURAL,
                              resource_version=rv, timeout_seconds=30):
            seen.append((event["type"], event["object"]["metadata"]["name"]))
            if len(seen) >= 2:
                w.stop()
        done.set()

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    agent_reports(tls_api, "hv1", "2")
    assert done.wait(45)
    # The maintenance patch (after the list), then the agent's status write.
    assert seen == [("MODIFIED", "hv1"), ("MODIFIED", "hv1")]


def test_dynamic_client_server_side_apply(tls_api: Api, tmp_path: Path) -> None:
    dyn = dynamic.DynamicClient(api_client(tls_api, tmp_path))
    hypervisors = dyn.resources.get(api_version="hvfleet.io/v1", kind="Hypervisor")
    made = hypervisors.server_side_apply(body=hv("hv1", overcommit={"cpu": 4}), name="hv1",
                                         field_manager="python")
    assert made.spec.overcommit.cpu == 4
    other = dynamic.DynamicClient(api_client(tls_api, tmp_path, "ops2-token"))
    theirs = other.resources.get(api_version="hvfleet.io/v1", kind="Hypervisor")
    with pytest.raises(dynamic.exceptions.ConflictError) as err:
        theirs.server_side_apply(body=hv("hv1", overcommit={"cpu": 8}), name="hv1", field_manager="python")
    assert "FieldManagerConflict" in str(err.value.body)
    forced = theirs.server_side_apply(body=hv("hv1", overcommit={"cpu": 8}), name="hv1",
                                      field_manager="python", force_conflicts=True)
    assert forced.spec.overcommit.cpu == 8
    status = hypervisors.status.get(name="hv1")
    assert status.metadata.name == "hv1"


def test_lightkube_list_get_apply_watch(tls_api: Api, tmp_path: Path) -> None:
    from lightkube import Client, KubeConfig
    from lightkube.generic_resource import create_global_resource

    assert tls_api.ca is not None
    config = KubeConfig.from_file(str(write_kubeconfig(tmp_path / "kc", tls_api.url, "ops-token",
                                                       tls_api.ca)))
    lk = Client(config=config, field_manager="lightkube")
    Hypervisor = create_global_resource("hvfleet.io", "v1", "Hypervisor", "hypervisors")
    applied = lk.apply(Hypervisor(hv("hv1", overcommit={"cpu": 3})))
    assert applied.metadata is not None and applied.metadata.name == "hv1"
    assert [o.metadata.name for o in lk.list(Hypervisor)] == ["hv1"]  # type: ignore[union-attr]
    got = lk.get(Hypervisor, "hv1")
    assert got["spec"]["overcommit"] == {"cpu": 3}
    rv = got.metadata.resourceVersion  # type: ignore[union-attr]
    agent_reports(tls_api, "hv1", "1")
    for event_type, obj in lk.watch(Hypervisor, resource_version=rv):
        assert (event_type, obj.metadata.name) == ("MODIFIED", "hv1")
        assert obj["status"]["allocation"] == {"cpu": "1"}
        break
