"""The `keel` command."""

from keel.cli.commands import cli, main

__all__ = ["cli", "main"]
