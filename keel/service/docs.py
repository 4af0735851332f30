"""The API's Swagger page, served with its assets from this machine (no CDN).

FastAPI's default `/docs` page loads Swagger UI from a public CDN, so it is blank on a machine
without internet. Keel serves the files of the `swagger-ui-bundle` package instead, and turns
off what would still reach out (the online validator badge). ReDoc ships no such package and is
not served: `/docs` and `/openapi.json` cover the same ground.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

ASSETS = "/docs-assets"


def install_docs(api: FastAPI) -> None:
    """Serve `/docs` from local assets; `create_app` builds the API with docs_url=None."""
    api.mount(ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    @api.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=api.openapi_url or "/openapi.json",
            title=f"{api.title} API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
            swagger_ui_parameters={"validatorUrl": None},
        )
