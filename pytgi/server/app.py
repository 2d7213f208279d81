"""`create_app`: the FastAPI application serving TGI's HTTP API (TGI_COMPATIBILITY.md §3-§10) on an
`Infer`.

The launcher builds the engine, the router's `Infer` and the configs, calls `create_app`, flips
`app.state.health` (`HealthState`) through `starting → ready → draining/dead`, and runs uvicorn.
Middleware, outermost first: CORS → API key → drain gate → body limit → routes. The OpenAPI
document is generated from the routes, titled and versioned as TGI's, at `/api-doc/openapi.json`
(also `/openapi.json`), with Swagger UI at `/docs`, served from the `swagger-ui-bundle` package's
assets (no CDN: it renders offline), and the playground at `/playground` unless
`--disable-playground`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import swagger_ui_bundle
from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from pytgi import metrics
from pytgi.config import CacheInfo, ServerConfig
from pytgi.engine.client import EngineClient
from pytgi.server import completions, openai_routes, sagemaker, tgi_routes, vertex
from pytgi.server.context import TGI_VERSION, ServerContext
from pytgi.server.errors import install_error_handlers
from pytgi.server.health import Health, HealthState
from pytgi.server.middleware import (
    ApiKeyMiddleware,
    BodyLimitMiddleware,
    CloseOn5xx,
    GateMiddleware,
    TracingMiddleware,
)
from pytgi.server.playground import add_playground
from pytgi.server.sse import DEFAULT_KEEP_ALIVE_S
from pytgi.utils import tracing

if TYPE_CHECKING:  # the router is only called through these methods
    from pytgi.router.infer import Infer

OPENAPI_URL = "/api-doc/openapi.json"
DOCS_ASSETS_URL = "/docs/assets"


class _App(FastAPI):
    """FastAPI with `CloseOn5xx` outside Starlette's error middleware (which sends the 500s)."""

    def build_middleware_stack(self) -> ASGIApp:
        return CloseOn5xx(super().build_middleware_stack())


def create_app(
    infer: Infer,
    engine: EngineClient,
    config: ServerConfig,
    cache_info: CacheInfo,
    *,
    model_info: dict[str, Any],
    health: HealthState | None = None,
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S,
) -> FastAPI:
    """Build the app. `health` defaults to `ready` (the launcher opens the port after warm-up)."""
    ctx = ServerContext(
        infer=infer,
        engine=engine,
        config=config,
        cache_info=cache_info,
        model_info=dict(model_info),
        health=health or HealthState(Health.READY),
        keep_alive_s=keep_alive_s,
    )
    metrics.configure(ctx.max_input_tokens, ctx.max_total_tokens)
    metrics.tgi_batch_max_total_tokens.set(cache_info.max_batch_total_tokens)
    app = _App(
        title="Text Generation Inference",
        description="Text Generation Webserver",
        version=TGI_VERSION,
        license_info={"name": "Apache 2.0", "url": "https://www.apache.org/licenses/LICENSE-2.0"},
        openapi_url=OPENAPI_URL,
        docs_url=None,  # served by _add_docs from bundled assets
        redoc_url=None,
    )
    app.state.ctx = ctx
    app.state.health = ctx.health
    for module in (tgi_routes, openai_routes, completions, sagemaker, vertex):
        app.include_router(module.router)
    app.add_api_route("/openapi.json", app.openapi, methods=["GET"], include_in_schema=False)
    _add_docs(app)
    if config.playground:
        add_playground(app)
    install_error_handlers(app)
    _add_middleware(app, config, ctx.health)
    return app


def _add_docs(app: FastAPI) -> None:
    assets = StaticFiles(directory=swagger_ui_bundle.swagger_ui_path)
    app.mount(DOCS_ASSETS_URL, assets, name="swagger-ui-assets")

    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=OPENAPI_URL,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{DOCS_ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS_URL}/favicon-32x32.png",
        )

    app.add_api_route("/docs", docs, methods=["GET"], include_in_schema=False)


def _add_middleware(app: FastAPI, config: ServerConfig, health: HealthState) -> None:
    # Starlette wraps in reverse order of addition: the last added is the outermost.
    app.add_middleware(BodyLimitMiddleware, limit_bytes=config.limits.payload_limit)
    app.add_middleware(GateMiddleware, health=health)
    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=list(config.cors_allow_origin) or ["*"],
        allow_methods=["GET", "POST"],
        allow_headers=["content-type", "authorization"],
    )
    if tracing.enabled():
        app.add_middleware(TracingMiddleware)


def create_metrics_app(engine: EngineClient, cache_info: CacheInfo) -> ASGIApp:
    """The `--prometheus-port` listener: the Prometheus exposition on any GET path (as TGI)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] != "GET":
            await PlainTextResponse("Method Not Allowed", status_code=405)(scope, receive, send)
            return
        metrics.refresh(engine.stats(), cache_info.max_batch_total_tokens)
        response = Response(metrics.render(), media_type=metrics.CONTENT_TYPE)
        await response(scope, receive, send)

    return app
