"""Keel's HTTP service: `create_app(keel_app)` builds the FastAPI app, `serve()` runs it.

See docs/http.md for the endpoints, authentication and configuration.
"""

from keel.runtime.loading import load_app
from keel.service.api import create_app
from keel.service.server import serve

__all__ = ["create_app", "load_app", "serve"]
