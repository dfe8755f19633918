"""The Kubernetes Status (HTTP code and `reason`) that stands for each of the
model's error classes on the wire. `hvfleet serve` answers an error with it
(`hvfleet.server.errors`, which adds the classes of the layers above the store)
and the remote store reads it back into the class (`hvfleet.store.remote`,
with `ERROR_OF_REASON` and `ERROR_OF_CODE`):
one table, so the two ends of the API cannot drift apart. The error classes
themselves carry no transport code (ARCHITECTURE.md).
"""

from __future__ import annotations

from hvfleet.model import errors

# class → (HTTP status, Status reason), by code, looked up along a class's MRO, so a
# subclass answers as its nearest listed ancestor (`TooLarge` as itself before
# `InvalidInput`).
STATUS_OF: dict[type[errors.HvfleetError], tuple[int, str]] = {
    errors.BadRequest: (400, "BadRequest"),
    errors.Unauthorized: (401, "Unauthorized"),
    errors.Forbidden: (403, "Forbidden"),
    errors.NotFound: (404, "NotFound"),
    errors.AlreadyExists: (409, "AlreadyExists"),
    errors.Conflict: (409, "Conflict"),
    # Kubernetes says "Expired" for a watch or continue token past compaction.
    errors.Gone: (410, "Expired"),
    errors.TooLarge: (413, "RequestEntityTooLarge"),
    errors.UnsupportedMediaType: (415, "UnsupportedMediaType"),
    errors.InvalidInput: (422, "Invalid"),
    errors.TooManyRequests: (429, "TooManyRequests"),
    errors.HvfleetError: (500, "InternalError"),
    errors.Unavailable: (503, "ServiceUnavailable"),
}

# A Status reason (as kube-apiserver and hvfleet serve name them) → the error
# the remote store's caller gets: the table above read back by name, not by
# class, with the reasons only kube-apiserver gives.
ERROR_OF_REASON: dict[str, type[errors.HvfleetError]] = {
    **{reason: cls for cls, (_code, reason) in STATUS_OF.items() if cls is not errors.HvfleetError},
    "Gone": errors.Gone,
    "Timeout": errors.Unavailable,
}

# An answer with a code but no reason, read back by its code (404, 409 and 422
# are read with their details, and a 5xx says what the server answered).
ERROR_OF_CODE: dict[int, type[errors.HvfleetError]] = {
    code: cls for cls, (code, _reason) in STATUS_OF.items() if code in (400, 401, 403, 410, 413, 415, 429)
}
