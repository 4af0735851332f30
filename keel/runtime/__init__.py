"""The composition root: the Runtime (async core), the App (sync facade), the worker."""

from keel.runtime.aio import AsyncApp
from keel.runtime.app import App
from keel.runtime.runtime import DEFAULT_URL, RunDetails, Runtime, Submission
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
