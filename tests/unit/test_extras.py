"""A part used without the extra that installs it says which extra, and how to install it.

Each case runs in a fresh interpreter where the extra's package cannot be imported
(``sys.modules[name] = None`` makes both ``import name`` and ``find_spec(name)`` find nothing,
as in an install without it). The command must fail before it starts anything, with one line
naming the extra and the usage exit status.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.cli.exits import USAGE
from conveyor.extras import MissingExtra, extra_of, missing, require

CLI = "import sys\nsys.modules[{module!r}] = None\nfrom conveyor.cli import main\nmain()"


def without(module: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    """``conveyor *args`` where ``module`` cannot be imported."""
    return subprocess.run(
        [sys.executable, "-c", CLI.format(module=module), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("module", "args", "said"),
    [
        ("rocksdict", ["node"], "conveyor node needs the server extra"),
        ("pgserver", ["dev", "--app", "examples.shop:app"], "conveyor dev needs the server extra"),
        ("aiokafka", ["dev", "--app", "examples.shop:app", "--kafka"], "needs the kafka extra"),
        (
            "aiokafka",
            ["node", "--kafka", "127.0.0.1:1", "--node-id", "a", "--cluster-secret", "s" * 20],
            "--kafka needs the kafka extra",
        ),
        ("boto3", ["node", "--blobs-url", "s3://bucket/p"], "--blobs-url s3://... needs the s3"),
        # a command with no check of its own: the console script names the command and extra
        ("fastavro", ["keys", "list"], "conveyor keys list needs the server extra"),
    ],
    ids=["node", "dev", "dev-kafka", "node-kafka", "s3-blobs", "keys-list"],
)
def test_a_command_names_the_extra_it_needs(
    module: str, args: list[str], said: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    out = without(module, [*args, "--home", str(home)])
    extra = extra_of(module)
    assert out.returncode == USAGE, out.stderr
    assert said in out.stderr
    assert f"pip install 'conveyor[{extra}]'" in out.stderr
    assert f"({module} is not installed)" in out.stderr
    assert "Traceback" not in out.stderr
    assert not home.exists()  # it failed before it made anything


def test_a_client_command_needs_no_extra(tmp_path: Path) -> None:
    """``conveyor list`` is a client command: without the server it reaches its own check."""
    out = without("rocksdict", ["list", "--home", str(tmp_path), "--url", "http://127.0.0.1:1"])
    assert "extra" not in out.stderr
    assert "no API key" in out.stderr


def test_a_missing_module_no_extra_installs_is_not_called_an_extra() -> None:
    """A module of no extra missing (a broken install, a bug) keeps its traceback."""
    out = without("conveyor.streams.gateway.auth", ["keys", "list"])
    assert out.returncode == 1
    assert "ModuleNotFoundError" in out.stderr
    assert "extra" not in out.stderr


def test_conveyor_testing_names_the_server_extra() -> None:
    code = "import sys\nsys.modules['rocksdict'] = None\nimport conveyor.testing"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert "MissingExtra: conveyor.testing needs the server extra" in out.stderr
    assert "pip install 'conveyor[server]'" in out.stderr


def test_require_and_missing() -> None:
    require("server", what="conveyor node")  # this checkout's venv has every extra
    require("s3", "boto3", what="S3")
    with pytest.raises(MissingExtra) as caught:
        require("kafka", "no_such_module_here", what="--kafka")
    assert str(caught.value) == (
        "--kafka needs the kafka extra: pip install 'conveyor[kafka]' "
        "(no_such_module_here is not installed)"
    )
    assert isinstance(caught.value, ModuleNotFoundError)  # what callers catching imports expect
    said = missing(ModuleNotFoundError(name="botocore.exceptions"), "an S3 blob store")
    assert said is not None and said.extra == "s3" and "(botocore is not installed)" in str(said)
    assert missing(ModuleNotFoundError(name="yaml"), "x") is None
    assert extra_of(None) is None
