"""Options and parsers shared by every command family."""

from __future__ import annotations

from typing import Annotated

import typer

from hvfleet.model.errors import InvalidInput
from hvfleet.model.hypervisor import check_ratio
from hvfleet.model.quantity import Quantity
from hvfleet.model.resources import ResourceName
from hvfleet.store import Store, open_store

StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store", envvar="HVFLEET_STORE",
        help="Store URL: sqlite:///PATH (default ./hvfleet.db), etcd://HOST:PORT[,HOST:PORT] "
        "or https://HOST:PORT[,https://HOST:PORT] (hvfleet serve replicas; with --token, --ca "
        "or --kubeconfig).",
    ),
]
SelectorOpt = Annotated[
    str | None, typer.Option("-l", "--selector", help="Label selector, e.g. az=a,gen in (x,y).")
]
ManagerOpt = Annotated[
    str, typer.Option("--manager", help="Field manager recorded as owner of what you set.")
]
ForceOpt = Annotated[
    bool, typer.Option("--force", help="Take over fields owned by another manager.")
]
DEFAULT_MANAGER = "hvfleet-cli"


def connect(url: str | None) -> Store:
    return open_store(url)


def split_assignment(text: str, where: str) -> tuple[ResourceName, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise InvalidInput(f"{where}: expected RESOURCE=VALUE, got {text!r}")
    return ResourceName.parse(key.strip(), where=where), value.strip()


def parse_ratio(text: str, where: str) -> tuple[ResourceName, float]:
    name, value = split_assignment(text, where)
    try:
        number = float(value)
    except ValueError:
        raise InvalidInput(f"{where}.{name}: {value!r} is not a number") from None
    try:
        return name, check_ratio(f"{name}", number)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def parse_quantity_assignment(text: str, where: str) -> tuple[ResourceName, Quantity]:
    name, value = split_assignment(text, where)
    q = Quantity.parse(value, where=f"{where}.{name}")
    if q < 0:
        raise InvalidInput(f"{where}.{name}: {value} must not be negative")
    return name, q
