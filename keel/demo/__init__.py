"""`keel demo`: the support-ticket app (shipped inside the package) survives SIGKILLs mid-send."""

from keel.demo.story import run_demo

__all__ = ["run_demo"]
