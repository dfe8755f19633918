"""Watch events' objects decoded once per store, however many of its watches
see them.

A value stored at a revision never changes, so the object a watch decodes
from it (or the one the store's own write read back when it checked the
encoding, `encoding.encode_and_read`) serves every other watch of the same
store that receives that write: the API's fan-out of a kind, the garbage
collector's all-kinds watch, the fleet index and the Placement snapshot each
receive every host write. Kept for the most recent writes only; a watch far
behind decodes again. Shared read-only, as watch events' objects already are.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

from hvfleet.model.hypervisor import Resource

# Watch events decoded lately, per store.
KEPT = 4096


class DecodedAt:
    """Objects by where they were stored (a key or kind and name, and the
    revision that wrote them), the newest `size` of them."""

    def __init__(self, size: int = KEPT) -> None:
        self.size = size
        self._objects: OrderedDict[Hashable, Resource] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, at: Hashable) -> Resource | None:
        with self._lock:
            return self._objects.get(at)

    def put(self, at: Hashable, obj: Resource) -> None:
        with self._lock:
            self._objects[at] = obj
            while len(self._objects) > self.size:
                self._objects.popitem(last=False)

    def decode(self, at: Hashable, decode: Callable[[], Resource]) -> Resource:
        """The object kept at `at`, else `decode()`'s, then kept (an exception
        of `decode`, Undecodable, reaches every caller: nothing is kept)."""
        hit = self.get(at)
        if hit is not None:
            return hit
        obj = decode()
        self.put(at, obj)
        return obj
