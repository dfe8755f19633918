"""The real clients the API tests drive against make_api's servers: kubectl
(either binary, through a kubeconfig with the test CA) and the official
`kubernetes` Python client."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from tests.server.running import Api, write_kubeconfig

GROUP, VERSION, PLURAL = "hvfleet.io", "v1", "hypervisors"


class Kubectl:
    def __init__(self, binary: str, version: str, api: Api, tmp: Path) -> None:
        self.binary, self.version, self.api, self.tmp = binary, version, api, tmp

    def argv(self, token: str, *args: str) -> list[str]:
        assert self.api.ca is not None
        config = write_kubeconfig(self.tmp / f"kubeconfig-{token}", self.api.url, token, self.api.ca)
        return [self.binary, f"--kubeconfig={config}", f"--cache-dir={self.tmp}/cache-{token}", *args]

    def __call__(self, *args: str, token: str = "ops-token") -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(token, *args), capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HOME": str(self.tmp)})

    def apply(self, path: Path, *flags: str, token: str = "ops-token") -> subprocess.CompletedProcess[str]:
        return self("apply", "--server-side", *flags, "-f", str(path), token=token)


def manifest(tmp: Path, name: str, **spec: object) -> Path:
    path = tmp / f"{name}-{len(list(tmp.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "hvfleet.io/v1", "kind": "Hypervisor",
                                    "metadata": {"name": name}, "spec": spec}))
    return path


def api_client(api: Api, tmp_path: Path, token: str = "ops-token") -> k8s.ApiClient:
    assert api.ca is not None
    path = write_kubeconfig(tmp_path / f"kc-{token}", api.url, token, api.ca)
    return k8s_config.new_client_from_config(config_file=str(path))
