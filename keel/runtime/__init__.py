"""The composition root: the Runtime (async core), the App (sync facade), the worker."""

from keel.runtime.app import App, Submission
from keel.runtime.runtime import DEFAULT_URL, RunDetails, Runtime
from keel.runtime.worker import Worker, WorkerStats

__all__ = ["DEFAULT_URL", "App", "RunDetails", "Runtime", "Submission", "Worker", "WorkerStats"]
