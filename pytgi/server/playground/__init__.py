"""The playground at `/playground`: a chat page and a live engine dashboard (pytgi only; TGI leaves
this to chat-ui).

The page and its assets are static files bundled in the package (no CDN: it works offline). It
calls only the public API: `POST /v1/chat/completions` (streamed) and `GET /metrics`, `GET /info`.
The page itself is served without a key, like every GET route; with `--api-key` it asks for the key
and sends it as `Authorization: Bearer`, which the API-key middleware checks on the POST, so the
page gives an unauthenticated client nothing the API does not. `--disable-playground` removes it.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.responses import FileResponse, RedirectResponse
from starlette.staticfiles import StaticFiles

PLAYGROUND_URL = "/playground"
ASSETS_URL = f"{PLAYGROUND_URL}/assets"
STATIC_DIR = Path(__file__).parent / "static"


def add_playground(app: FastAPI) -> None:
    app.mount(ASSETS_URL, StaticFiles(directory=STATIC_DIR), name="playground-assets")

    async def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    async def slash() -> RedirectResponse:
        return RedirectResponse(PLAYGROUND_URL)

    app.add_api_route(PLAYGROUND_URL, page, methods=["GET"], include_in_schema=False)
    app.add_api_route(f"{PLAYGROUND_URL}/", slash, methods=["GET"], include_in_schema=False)
