"""The dashboard's login: a token typed into a form, kept in an HttpOnly,
SameSite=Strict cookie (Secure over TLS), and checked on every request by the
same Authenticator as the API's bearer tokens (so a revoked token stops working
in the browser as fast as anywhere). The API never reads this cookie: it only
serves the dashboard's own pages and feeds.

Every form that writes carries a CSRF token in a hidden field: a keyed hash of
the session's token under the dashboard's secret, which a page from another
site can neither read nor compute. The secret is kept in the store
(a server secret, Store.server_secret, made by the first server that needs it), so
a form rendered by one replica posts to any other, and survives restarts.
Writes also refuse a request whose Origin (or, without one, Referer) is not
this server's own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
from typing import Any
from urllib.parse import urlsplit

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from hvfleet.model.errors import Forbidden, Unauthorized, Unavailable
from hvfleet.server.context import ApiContext
from hvfleet.server.identity import Identity
from hvfleet.store.base import Store

COOKIE = "hvfleet_session"
# Set beside the session for longer than it lasts: a request with this and no
# (valid) session is one whose session ended, and the login page says so.
SEEN = "hvfleet_seen"
SEEN_MAX_AGE_S = 30 * 86400
# The outcome of a form, carried across its redirect (post/redirect/get) to the
# page that shows it: signed with the dashboard's secret, bound to the session.
FLASH = "hvfleet_flash"
FLASH_MAX_AGE_S = 120
CSRF_FIELD = "csrf"
# A browser session lasts a working day at most; the token's own expiry still applies.
MAX_AGE_S = 12 * 3600

SECRET_NAME = "dashboard-key"
_key_lock = threading.Lock()


def load_key(store: Store) -> bytes:
    """The dashboard's secret from the store's server secrets (Store.server_secret:
    no kind, no API role reads it), made there by whoever needs it first (two
    replicas starting together agree: the second write loses and reads)."""
    for _ in range(3):
        found = store.server_secret(SECRET_NAME)
        if found is not None:
            return found[0]
        store.put_server_secret(SECRET_NAME, secrets.token_bytes(32), None)
    raise Unavailable("the dashboard's secret could not be read from the store")


def signing_key(request: Request) -> bytes:
    """The secret, read once per server process (it never changes)."""
    app_state = request.app.state
    key: bytes | None = getattr(app_state, "dashboard_key", None)
    if key is None:
        with _key_lock:
            key = getattr(app_state, "dashboard_key", None)
            if key is None:
                ctx: ApiContext = app_state.ctx
                key = app_state.dashboard_key = load_key(ctx.store)
    return key


def csrf_token(key: bytes, token: str) -> str:
    return hmac.new(key, b"csrf:" + token.encode(), hashlib.sha256).hexdigest()


def csrf_for(request: Request) -> str:
    """The CSRF token of this request's session ("" without one)."""
    token = session_token(request)
    return csrf_token(signing_key(request), token) if token else ""


def session_token(request: Request) -> str | None:
    value = request.cookies.get(COOKIE)
    return value or None


async def identify(ctx: ApiContext, request: Request) -> Identity:
    """The caller of a dashboard request, from its session cookie (Unauthorized
    without a valid one)."""
    token = session_token(request)
    if token is None:
        raise Unauthorized("not logged in")
    return await run_in_threadpool(ctx.authenticator.authenticate, f"Bearer {token}")


def set_session(response: Response, request: Request, token: str) -> None:
    secure = request.url.scheme == "https"
    response.set_cookie(COOKIE, token, max_age=MAX_AGE_S, path="/", httponly=True,
                        samesite="strict", secure=secure)
    response.set_cookie(SEEN, "1", max_age=SEEN_MAX_AGE_S, path="/", httponly=True,
                        samesite="strict", secure=secure)


def clear_session(response: Response, request: Request, *, ended: bool = False) -> None:
    """Forget the session; `ended` (it expired or was revoked, rather than a
    log out) keeps the mark that this browser had one."""
    secure = request.url.scheme == "https"
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict", secure=secure)
    if not ended:
        response.delete_cookie(SEEN, path="/", httponly=True, samesite="strict", secure=secure)


def session_ended(request: Request) -> bool:
    """Whether this browser had a session that is not valid any more (expired,
    revoked, or past the cookie's age) rather than never logging in."""
    return session_token(request) is not None or request.cookies.get(SEEN) == "1"


def _flash_mac(request: Request, payload: bytes) -> str:
    token = (session_token(request) or "").encode()
    return hmac.new(signing_key(request), b"flash:" + token + b":" + payload, hashlib.sha256).hexdigest()


def set_flash(response: Response, request: Request, path: str, doc: dict[str, Any]) -> None:
    """Carry `doc` to the next GET of `path` (one use, two minutes at most)."""
    payload = base64.urlsafe_b64encode(json.dumps(doc, separators=(",", ":")).encode())
    response.set_cookie(FLASH, f"{payload.decode()}.{_flash_mac(request, payload)}", max_age=FLASH_MAX_AGE_S,
                        path=path, httponly=True, samesite="strict", secure=request.url.scheme == "https")


def clear_flash(response: Response, request: Request, path: str) -> None:
    if request.cookies.get(FLASH):
        response.delete_cookie(FLASH, path=path, httponly=True, samesite="strict",
                               secure=request.url.scheme == "https")


def read_flash(request: Request) -> dict[str, Any] | None:
    """The flash carried to this request (None: none, or not signed for this
    session); the page clears it (`clear_flash`) once shown."""
    value = request.cookies.get(FLASH)
    if not value:
        return None
    payload, _, mac = value.rpartition(".")
    if not payload or not hmac.compare_digest(mac, _flash_mac(request, payload.encode())):
        return None
    try:
        doc = json.loads(base64.urlsafe_b64decode(payload.encode()))
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _own_origin(request: Request) -> str:
    host = request.headers.get("host", "")
    return f"{request.url.scheme}://{host}"


def check_origin(request: Request) -> None:
    """A write must come from a page of this server: Origin, else Referer, must
    name it. Browsers send Origin on every cross-site POST."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        referer = request.headers.get("referer")
        if referer is None:
            if origin == "null":
                raise Forbidden("this form was not sent from a page of this server (Origin: null)")
            return  # neither header: not a browser's cross-site request; the CSRF token decides
        parts = urlsplit(referer)
        origin = f"{parts.scheme}://{parts.netloc}"
    if origin != _own_origin(request):
        raise Forbidden(f"this form was sent from {origin}, not from this server")


def check_csrf(request: Request, form: dict[str, str]) -> None:
    """The form's hidden CSRF field must match the session (and the Origin this server)."""
    check_origin(request)
    token = session_token(request)
    sent = form.get(CSRF_FIELD, "")
    if token is None or not hmac.compare_digest(sent, csrf_for(request)):
        raise Forbidden("the form's CSRF token is missing or does not match this session; reload the page")
