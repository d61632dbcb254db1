"""The ``conveyor`` command line (entry point ``conveyor.cli:main``)."""

from conveyor.cli.main import app, main

__all__ = ["app", "main"]
