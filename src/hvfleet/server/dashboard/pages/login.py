"""The login and logout pages: a token pasted into the login form becomes the
session cookie (session.py) once the server's TokenAuthenticator knows it;
logout clears the cookie."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from hvfleet.model.errors import HvfleetError, Unauthorized
from hvfleet.server.dashboard.pages.common import (
    ANONYMOUS_FORM_MAX,
    ctx_of,
    error_page,
    page,
    read_form,
)
from hvfleet.server.dashboard.session import check_csrf, check_origin, clear_session, set_session


def _login_page(request: Request, message: str = "", next_: str = "/", status: int = 200,
                ended: bool = False) -> Response:
    errors = {"token": message} if message else {}
    return page(request, "login.html", None, status, title="Log in", errors=errors, next=next_,
                ended=ended, resuming="resume=1" in next_)


def _safe_next(value: str) -> str:
    return value if value.startswith("/") and not value.startswith("//") else "/"


async def login(request: Request) -> Response:
    if request.method == "GET":
        q = request.query_params
        return _login_page(request, next_=_safe_next(q.get("next", "/")), ended=q.get("ended") == "1")
    try:
        check_origin(request)
        form = await read_form(request, ANONYMOUS_FORM_MAX)
    except HvfleetError as exc:
        return error_page(None, request, exc)
    token = form.get("token", "").strip()
    next_ = _safe_next(form.get("next", "/"))
    if not token:
        return _login_page(request, "required: paste your token", next_, 422)
    try:
        await run_in_threadpool(ctx_of(request).authenticator.authenticate, f"Bearer {token}")
    except Unauthorized:
        return _login_page(request, "this token is unknown, expired or revoked", next_, 401)
    response = RedirectResponse(next_, status_code=303)
    set_session(response, request, token)
    return response


async def logout(request: Request) -> Response:
    try:
        check_csrf(request, await read_form(request, ANONYMOUS_FORM_MAX))
    except HvfleetError as exc:
        return error_page(None, request, exc)
    response = RedirectResponse("/login", status_code=303)
    clear_session(response, request)
    return response
