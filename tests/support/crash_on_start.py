"""`python -m tests.support.crash_on_start`: a process that dies of an uncaught exception."""

raise RuntimeError("crashed on purpose")
