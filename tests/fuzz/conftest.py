"""Fuzz tests run against a real ``conveyor node``: reuse the gateway integration helpers.

Each fuzz module gets its own node (the fixture is module-scoped), so one module's generated
data (schedules, tasks) never shows up in another module's before/after counts.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from test_gateway import node

__all__ = ["node"]
