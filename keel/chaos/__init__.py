"""Fault injection and the crash harness."""
