"""The dashboard's own scripts and styles (`/static/NAME`), served from the
package: nothing is fetched from elsewhere."""

from __future__ import annotations

from importlib.resources import files

from starlette.requests import Request
from starlette.responses import Response

_STATIC = {"dashboard.js": "text/javascript", "dashboard.css": "text/css", "host.js": "text/javascript",
           "guests.js": "text/javascript", "history.js": "text/javascript"}
_CACHE: dict[str, bytes] = {}


async def static(request: Request) -> Response:
    name = request.path_params["name"]
    media = _STATIC.get(name)
    if media is None:
        return Response("not found", status_code=404, media_type="text/plain")
    data = _CACHE.get(name)
    if data is None:
        data = _CACHE[name] = files("hvfleet.server").joinpath("static", name).read_bytes()
    return Response(data, media_type=media, headers={"Cache-Control": "max-age=300",
                                                     "X-Content-Type-Options": "nosniff"})
