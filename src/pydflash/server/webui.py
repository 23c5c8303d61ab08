"""The chat page at ``GET /`` (``--no-webui`` turns it off, as llama-server's flag): plain
HTML, CSS and JavaScript shipped in ``webui/`` beside this module, no build step, nothing
loaded from elsewhere. Like llama-server's, the page and its files need no API key (the
page asks for the key and sends it with its API requests).

The files are read once, when the server starts, and answered from memory with an
ETag (304 when unchanged) and a Content-Security-Policy that lets the page run only its
own scripts: model output that slipped into the page as markup still could not run."""

from __future__ import annotations

import hashlib
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["PATHS", "WebUI"]

# path: (file in webui/, content type)
_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/webui/style.css": ("style.css", "text/css; charset=utf-8"),
    "/webui/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/webui/chat.js": ("chat.js", "text/javascript; charset=utf-8"),
    "/webui/markdown.js": ("markdown.js", "text/javascript; charset=utf-8"),
    "/webui/view.js": ("view.js", "text/javascript; charset=utf-8"),
}
PATHS = frozenset(_FILES)  # the page's paths: public, as llama-server's UI assets are

_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidated each time: a new pydflash's page is seen at once
}


class WebUI:
    """The page's files, read from the package, and their routes."""

    def __init__(self) -> None:
        folder = resources.files(__package__ or "pydflash.server").joinpath("webui")
        self.files: dict[str, tuple[bytes, str, str]] = {}
        for path, (name, kind) in _FILES.items():
            data = folder.joinpath(name).read_bytes()
            self.files[path] = (data, kind, '"' + hashlib.sha256(data).hexdigest()[:32] + '"')

    def routes(self) -> list[Route]:
        """``GET`` (and ``HEAD``) of each of the page's paths."""
        return [Route(path, self._answer, methods=["GET"]) for path in self.files]

    async def _answer(self, request: Request) -> Response:
        data, kind, etag = self.files[request.url.path]
        headers = {**_HEADERS, "ETag": etag}
        if etag in (t.strip().removeprefix("W/") for t in request.headers.get("if-none-match", "").split(",")):
            return Response(status_code=304, headers=headers)
        return Response(data, headers=headers, media_type=kind)
