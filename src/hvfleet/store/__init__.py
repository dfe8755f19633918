"""The Store: one contract (`hvfleet.store.base.Store`), several backends.

`open_store(url)` picks the backend from the URL: `sqlite:///path` (embedded
default, `./hvfleet.db`), `etcd://host:port[,host:port][?prefix=/p]`
(distributed; see docs/etcd.md) or `https://host:port` (an `hvfleet serve`,
through its API; see docs/store.md).
"""

from __future__ import annotations

import os

from hvfleet.model.errors import InvalidInput
from hvfleet.store.base import ListResult, Store, WatchEvent

DEFAULT_URL = "sqlite:///hvfleet.db"

__all__ = ["DEFAULT_URL", "ListResult", "Store", "WatchEvent", "open_store", "store_url"]


def store_url(explicit: str | None = None) -> str:
    return explicit or os.environ.get("HVFLEET_STORE") or DEFAULT_URL


def open_store(url: str | None = None, prefix: str | None = None) -> Store:
    """The store at `url` (else $HVFLEET_STORE, else ./hvfleet.db). An etcd store
    lives under a key prefix, so several fleets can share one cluster: `prefix`,
    else `?prefix=` in the URL, else $HVFLEET_STORE_PREFIX (`--store-prefix`),
    else /hvfleet."""
    url = store_url(url)
    if url.startswith("etcd://"):
        from hvfleet.store.etcd import EtcdStore

        return EtcdStore.from_url(url, prefix, default_prefix=os.environ.get("HVFLEET_STORE_PREFIX"))
    if url.startswith("sqlite:///"):
        from hvfleet.store.sqlite import SqliteStore

        path = url.removeprefix("sqlite:///")
        if not path:
            raise InvalidInput(f"store: {url!r} names no file (sqlite:///path/to/hvfleet.db)")
        return SqliteStore(path)
    if url.startswith(("https://", "http://")):
        from hvfleet.store.remote import RemoteStore

        return RemoteStore.from_url(url)
    raise InvalidInput(
        f"store: unsupported URL {url!r} (expected sqlite:///PATH, etcd://HOST:PORT[,HOST:PORT] "
        "or https://HOST:PORT)"
    )
