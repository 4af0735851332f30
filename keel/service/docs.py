"""The API's Swagger and ReDoc pages, served with their assets from this machine (no CDN).

FastAPI's default `/docs` and `/redoc` pages load their scripts from a public CDN (and ReDoc its
fonts from Google), so they are blank on a machine without internet. Keel serves the files the
`fastapi-offline` package ships (Swagger UI 5, which reads FastAPI's OpenAPI 3.1, and ReDoc 2)
and turns off what would still reach out: Swagger's online validator badge, ReDoc's web fonts.
ReDoc's attribution logo comes from its vendor's CDN whatever the options, so the ReDoc page
carries a Content-Security-Policy that lets it load nothing from elsewhere.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs-assets"
# ReDoc styles itself at run time (styled-components) and searches in a blob: worker.
_REDOC_CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "worker-src 'self' blob:; frame-ancestors 'none'"
)


def install_docs(api: FastAPI) -> None:
    """Serve `/docs` and `/redoc` from local assets; `create_app` turns FastAPI's own off."""
    api.mount(ASSETS, StaticFiles(packages=[("fastapi_offline", "static")]), name="docs-assets")
    openapi = api.openapi_url or "/openapi.json"

    @api.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi,
            title=f"{api.title} API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon.png",
            swagger_ui_parameters={"validatorUrl": None},
        )

    @api.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        page = get_redoc_html(
            openapi_url=openapi,
            title=f"{api.title} API",
            redoc_js_url=f"{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS}/favicon.png",
            with_google_fonts=False,
        )
        page.headers["Content-Security-Policy"] = _REDOC_CSP
        return page
