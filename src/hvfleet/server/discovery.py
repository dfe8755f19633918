"""API discovery: /version, /api, /apis, /apis/hvfleet.io and the v1 resource list.

Everything is derived from the CustomResourceDefinitions `hvfleet crd` prints
(`hvfleet.model.crd`), so names, short names and printer columns have one home
and kubectl sees the same resources here as on a cluster that has the CRDs.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any

from hvfleet import __version__
from hvfleet.model.crd import crds
from hvfleet.model.meta import API_GROUP, API_VERSION

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
STATUS_VERBS = ["get", "patch", "update"]


@dataclass(frozen=True)
class ResourceInfo:
    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    crd: dict[str, Any]

    @property
    def printer_columns(self) -> list[dict[str, Any]]:
        cols: list[dict[str, Any]] = self.crd["spec"]["versions"][0].get("additionalPrinterColumns", [])
        return cols

    @property
    def has_status(self) -> bool:
        """Whether the kind has a /status subresource (a Lease has no status)."""
        return "status" in self.crd["spec"]["versions"][0].get("subresources", {})

    @property
    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = self.crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        return out


def _resources() -> dict[str, ResourceInfo]:
    out = {}
    for crd in crds():
        names = crd["spec"]["names"]
        out[names["plural"]] = ResourceInfo(
            kind=names["kind"], plural=names["plural"], singular=names["singular"],
            short_names=tuple(names.get("shortNames", [])), crd=crd,
        )
    return out


RESOURCES: dict[str, ResourceInfo] = _resources()
BY_KIND: dict[str, ResourceInfo] = {r.kind: r for r in RESOURCES.values()}


def version() -> dict[str, Any]:
    major, minor = "1", "30"
    return {
        "major": major, "minor": minor, "gitVersion": f"v{major}.{minor}.0+hvfleet-{__version__}",
        "gitCommit": "", "gitTreeState": "clean", "buildDate": "", "goVersion": "",
        "compiler": "cpython", "platform": f"{platform.system().lower()}/{platform.machine()}",
    }


def api_versions() -> dict[str, Any]:
    # No core group: an empty APIVersions tells clients there is nothing under /api.
    return {"kind": "APIVersions", "versions": [], "serverAddressByClientCIDRs": []}


def api_group() -> dict[str, Any]:
    gv = {"groupVersion": API_VERSION, "version": "v1"}
    return {"kind": "APIGroup", "apiVersion": "v1", "name": API_GROUP, "versions": [gv],
            "preferredVersion": gv}


# authorization.k8s.io/v1 serves only the self reviews (hvfleet.server.access_review).
AUTHORIZATION_GROUP = "authorization.k8s.io"


def api_group_list() -> dict[str, Any]:
    group = api_group()
    del group["kind"], group["apiVersion"]
    authz = {"groupVersion": f"{AUTHORIZATION_GROUP}/v1", "version": "v1"}
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        group, {"name": AUTHORIZATION_GROUP, "versions": [authz], "preferredVersion": authz}]}


def api_resource_list() -> dict[str, Any]:
    resources: list[dict[str, Any]] = []
    for r in RESOURCES.values():
        resources.append({
            "name": r.plural, "singularName": r.singular, "namespaced": False, "kind": r.kind,
            "verbs": VERBS, "shortNames": list(r.short_names), "categories": ["hvfleet"],
        })
        if not r.short_names:
            del resources[-1]["shortNames"]
        if r.has_status:
            resources.append({
                "name": f"{r.plural}/status", "singularName": "", "namespaced": False,
                "kind": r.kind, "verbs": STATUS_VERBS,
            })
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": API_VERSION,
            "resources": resources}
