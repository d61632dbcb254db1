"""``make docs``: the docs site builds in strict mode (a broken link, a missing page or a
reference to a name that does not resolve fails it), and its API reference documents every
public name. mkdocs comes with the dev extra; without it the test skips locally and fails
under CI=true."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import conveyor

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_build_strictly_with_every_public_name(tmp_path: Path) -> None:
    missing = [m for m in ("mkdocs", "mkdocstrings") if importlib.util.find_spec(m) is None]
    if missing:
        reason = f"{' and '.join(missing)} not installed (pip install -e '.[dev]' or '.[docs]')"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the docs build needs them under CI: {reason}")
        pytest.skip(reason)
    subprocess.run([str(ROOT / "tools" / "typecheck-tree.sh")], check=True, capture_output=True)
    site = tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    for page in ("architecture", "glossary", "promise", "codecs"):
        assert (site / page / "index.html").exists(), page
    # The glossary and the promise are built from the repo's own text, not copies of it.
    assert "epoch" in (site / "glossary" / "index.html").read_text()
    assert "P1" in (site / "promise" / "index.html").read_text()
    reference = (site / "reference" / "conveyor" / "index.html").read_text()
    for name in conveyor.__all__:
        obj = getattr(conveyor, name)
        if name in ("testing", "codecs"):
            continue  # pages of their own, checked below
        home = getattr(obj, "__module__", None) or ""
        anchor = f'id="{home}.{name}"' if home.startswith("conveyor") else f'.{name}"'
        assert anchor in reference, f"conveyor.{name} is not in the API reference"
    testing = (site / "reference" / "testing" / "index.html").read_text()
    codecs = (site / "reference" / "codecs" / "index.html").read_text()
    for module, page in ((conveyor.testing, testing), (conveyor.codecs, codecs)):
        for name in module.__all__:
            assert f'.{name}"' in page, f"{module.__name__}.{name} is not in the API reference"
