"""Keel's core: the rules of durable runs, in the standard library only.

Nothing here imports LangGraph, a database driver or a web framework; the layers above hand the
core what it needs (a connector, a clock, notifiers) through `keel.core.services.Services`.
"""
