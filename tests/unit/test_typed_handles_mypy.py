"""mypy sees a handle's result type: ``enqueue`` of a typed task is a ``TaskHandle[R]`` of
the handler's return type (for ``async def``: what it awaits), and misuse is a type error.
The workflow and webhook replies are typed too (the contract's reply models)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SNIPPET = """
import dataclasses
import conveyor

app = conveyor.App("t")

@dataclasses.dataclass
class Receipt:
    total: int

@app.task
def add(x: int, y: int) -> int:
    return x + y

@app.task
async def pay(ctx: conveyor.Context, amount: int) -> Receipt:
    return Receipt(amount)

async def main(client: conveyor.Client, aclient: conveyor.AsyncClient) -> None:
    reveal_type(client.enqueue(add, (1, 2)).result())
    reveal_type(client.enqueue(pay, 5).result())
    reveal_type(client.enqueue("add", (1, 2)).result())
    reveal_type(await (await aclient.enqueue(pay, 5)).result())
    wrong: str = client.enqueue(add, (1, 2)).result()
    reveal_type(client.get_workflow("w").parallel[0].counts)
    reveal_type((await aclient.workflow_history("w")).steps[0].value)
    reveal_type(client.webhooks())
    client.get_workflow("w").parallels
"""


def _namespace(tree: Path) -> Path:
    """The ``conveyor`` namespace as Python imports it (setuptools' package-dir), as links."""
    pkg = tree / "conveyor"
    pkg.mkdir(parents=True)
    for entry in (ROOT / "sdk").iterdir():
        (pkg / entry.name).symlink_to(entry)
    for name in ("streams", "store", "agents", "schemas"):
        (pkg / name).symlink_to(ROOT / name)
    return tree


def test_mypy_types_the_result_of_a_handle_by_its_task(tmp_path: Path) -> None:
    tree = _namespace(tmp_path / "tree")
    (tree / "snippet.py").write_text(textwrap.dedent(SNIPPET))
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "snippet.py"],
        cwd=tree,
        env={**os.environ, "MYPY_CACHE_DIR": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = done.stdout
    revealed = [
        line.split("Revealed type is ")[1] for line in out.splitlines() if "Revealed" in line
    ]
    assert revealed == [
        '"int"',
        '"snippet.Receipt"',
        '"Any"',
        '"snippet.Receipt"',
        '"dict[str, int]"',
        '"Any"',
        '"tuple[conveyor.contract.replies.Webhook, ...]"',
    ], out
    assert (
        'Incompatible types in assignment (expression has type "int", variable has type "str")'
        in out
    ), out
    assert '"Workflow" has no attribute "parallels"' in out, out
