"""The composition root (Runtime), the operations on runs (AsyncApp), the sync facade (App),
the worker."""

from keel.runtime.aio import AsyncApp
from keel.runtime.app import App
from keel.runtime.records import RunDetails, Submission
from keel.runtime.runtime import DEFAULT_URL, Runtime
from keel.runtime.worker import Worker, WorkerStats

__all__ = [
    "DEFAULT_URL",
    "App",
    "AsyncApp",
    "RunDetails",
    "Runtime",
    "Submission",
    "Worker",
    "WorkerStats",
]
