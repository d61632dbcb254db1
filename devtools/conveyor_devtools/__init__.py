"""Conveyor's development tools, for a checkout: ``bench`` (the benchmarks), ``chaos`` (the
fault-injection runs and their history checker) and ``cli`` (``conveyor bench|chaos``). Not part
of the ``conveyor`` package; ``make`` installs it, editable, into the checkout's .venv."""
