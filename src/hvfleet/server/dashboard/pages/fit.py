"""Where does it fit (`/fit`): the request form, read into the API's fit
request, and the API's warm `fit` with `why` (`server/actions.py`, the same
core as `hvfleet fit --why`): the ranked hosts and why every other host is
out."""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from hvfleet.model.errors import Forbidden, InvalidInput
from hvfleet.ops.fit import FitQuery
from hvfleet.server import actions
from hvfleet.server.bodies import whole_number
from hvfleet.server.dashboard.pages.common import (
    ctx_of,
    error_page,
    field_of,
    page,
    selector_error,
    signed_in,
)
from hvfleet.server.identity import Identity

_FIT_FIELDS = {k: k for k in ("cpu", "memory", "resources", "count", "weigher")}


def _fit_body(q: dict[str, str]) -> tuple[FitQuery, dict[str, str]]:
    resources: dict[str, str | int] = {}
    errors: dict[str, str] = {}
    for part in (p.strip() for p in q.get("resources", "").split(",")):
        if not part:
            continue
        k, sep, v = part.partition("=")
        if not sep or not k.strip() or not v.strip():
            errors["resources"] = f"{part!r}: expected RESOURCE=QUANTITY, e.g. VGPU=1"
            continue
        resources[k.strip()] = v.strip()
    count = q.get("count", "1").strip() or "1"
    instances = whole_number(count, 1)
    if instances is None:
        errors["count"] = f"{count[:40]!r} is not a whole number of at least 1"
    weigher = q.get("weigher", "binpack")
    if weigher not in ("binpack", "spread"):
        errors["weigher"] = f"{weigher!r} is not binpack or spread"
    cpu, memory = q.get("cpu", "").strip(), q.get("memory", "").strip()
    if not resources and not cpu and not memory and not errors:
        errors["cpu"] = "give at least one resource (cpu, memory or others)"
    body = FitQuery.from_plain({
        "cpu": cpu or None, "memory": memory or None, "resources": resources,
        "count": instances or 1,
        "labelSelector": q.get("selector", ""),
        "weigher": "spread" if weigher == "spread" else "binpack", "why": True})
    return body, errors


# How many ranked hosts and "why not" rows the page lists (`show`); the
# summary of reasons always counts every host.
SHOW = (10, 25, 100, 1000)
_DEFAULT_SHOW = 25
_REASON_WORDS = {
    "maintenance": "in maintenance", "not-ready": "not ready", "stale": "stale heartbeat",
    "invalid-annotation": "invalid scheduling annotation", "agent-lease-expired": "agent lease expired",
    "insufficient": "not enough {resource}", "max-unit": "{resource} above the largest single unit",
    "min-unit": "{resource} below the smallest unit", "step-size": "{resource} not a multiple of the step",
}


def reason_words(r: dict[str, Any]) -> str:
    """A rejection's reason as a phrase that is the same for every host it
    applies to (its message carries the host's own figures)."""
    words = _REASON_WORDS.get(str(r.get("reason")), str(r.get("reason")))
    return words.format(resource=r.get("resource", "resources"))


def reason_summary(rejected: dict[str, list[dict[str, Any]]]) -> list[tuple[int, str]]:
    """Each reason with the number of hosts it rules out, most first."""
    counts: dict[str, int] = {}
    for found in rejected.values():
        for words in dict.fromkeys(reason_words(r) for r in found):
            counts[words] = counts.get(words, 0) + 1
    return sorted(((n, w) for w, n in counts.items()), key=lambda x: (-x[0], x[1]))


def _result_values(doc: dict[str, Any], show: int) -> dict[str, Any]:
    """The fit answer as the page's summary and (at most `show` rows) tables."""
    rejected = doc.get("rejected", {})
    return {
        "result": doc,
        "show": show,
        "summary": [(f"{n:,}", words) for n, words in reason_summary(rejected)],
        "candidates": [(str(i + 1), c["name"], f'{c["score"]:.6g}',
                        ", ".join(f"{k}={v}" for k, v in c["free"].items()))
                       for i, c in enumerate(doc["candidates"][:show])],
        "rejected": [(n, "; ".join(r["message"] for r in found))
                     for n, found in list(rejected.items())[:show]],
        "rejected_count": len(rejected),
    }


def _show(q: dict[str, str], errors: dict[str, str]) -> int:
    text = q.get("show", "") or str(_DEFAULT_SHOW)
    shown = whole_number(text)
    if shown is None or shown not in SHOW:
        errors["show"] = f"{text[:40]!r} is not one of {', '.join(map(str, SHOW))}"
        return _DEFAULT_SHOW
    return shown


@signed_in
async def fit_page(request: Request, who: Identity) -> Response:
    ctx = ctx_of(request)
    q = dict(request.query_params)
    errors: dict[str, str] = {}
    result: dict[str, Any] = {"result": None}
    if any(q.get(k) for k in ("cpu", "memory", "resources")) or "go" in q:
        body, errors = _fit_body(q)
        show = _show(q, errors)
        wrong = await selector_error(ctx, q.get("selector", ""), must_match=False)
        if wrong:
            errors["selector"] = wrong
        if not errors:
            try:
                answer = await run_in_threadpool(actions.fit_answer, ctx, who, body)
                doc = answer.document("human")
                result = _result_values(doc, show)
            except InvalidInput as exc:
                errors[field_of(exc, _FIT_FIELDS)] = str(exc)
            except Forbidden as exc:
                return error_page(who, request, exc)
    return page(request, "fit.html", who, 422 if errors else 200, title="Fit", current="fit", q=q,
                errors=errors, shows=[(str(n), f"{n:,}") for n in SHOW], **result)
