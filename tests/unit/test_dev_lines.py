"""``conveyor dev``'s pieces without a node: the line of each task event, the app's files that
``--reload`` watches, and the few lines that say why the app cannot be imported."""

from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path

import pytest

from conveyor.agents.startup import INSTALLED, import_failure, shadowing
from conveyor.cli.dev_loop import AppFiles, EventLines
from conveyor.schemas.types import EventKind, TaskEvent

TASK_ID = "0003019a2b3c4d5e6f708192a3b4c5d6"
T0 = 1_765_000_000_000


def event(kind: EventKind, attempt: int, ms: int, **fields: str) -> TaskEvent:
    return TaskEvent(
        kind=kind,
        task_id=TASK_ID,
        tenant="default",
        app="shop",
        task_type="charge_card",
        queue="default",
        status="x",
        attempt=attempt,
        ts_ms=T0 + ms,
        version=ms,
        **fields,  # type: ignore[arg-type]
    )


def clock(ms: int) -> str:
    return datetime.fromtimestamp((T0 + ms) / 1000).strftime("%H:%M:%S.%f")[:-3]


def test_a_task_s_lines_say_what_happened_how_long_and_why() -> None:
    lines = EventLines()
    boom = {"error_class": "ValueError", "error_message": "card declined [3]\nsecond line"}
    said = [
        lines.line(event(EventKind.TaskEnqueued, 1, 0)),
        lines.line(event(EventKind.TaskLeased, 1, 5)),
        lines.line(event(EventKind.CheckpointSaved, 1, 7)),
        lines.line(event(EventKind.TaskRetryScheduled, 2, 25, **boom)),
        lines.line(event(EventKind.TaskRequeued, 2, 1_025)),
        lines.line(event(EventKind.TaskLeased, 2, 1_030)),
        lines.line(event(EventKind.TaskSucceeded, 2, 13_530)),
    ]
    assert [line.plain if line is not None else None for line in said] == [
        f"{clock(0)} charge_card          a3b4c5d6 enqueued #1",
        f"{clock(5)} charge_card          a3b4c5d6 leased #1",
        None,  # a checkpoint is no change of state
        f"{clock(25)} charge_card          a3b4c5d6 failed, will retry #1  20 ms  "
        "ValueError: card declined [3]",
        f"{clock(1_025)} charge_card          a3b4c5d6 requeued #2",
        f"{clock(1_030)} charge_card          a3b4c5d6 leased #2",
        f"{clock(13_530)} charge_card          a3b4c5d6 succeeded #2  12.5 s",
    ]


def test_a_long_error_is_cut_to_its_first_line_and_a_bounded_length() -> None:
    lines = EventLines()
    failed = event(EventKind.TaskFailed, 1, 0, error_class="E", error_message="x" * 500)
    text = lines.line(failed)
    assert text is not None
    assert text.plain.endswith("FAILED #1  E: " + "x" * (120 - 3))


def test_reload_sees_a_changed_an_added_and_a_removed_file_of_the_app_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "shopapp"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text("import conveyor\napp = conveyor.App('shop')\n")
    (package / "sub" / "helpers.py").write_text("")
    (package / "__pycache__").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("shopapp.tasks")
    try:
        files = AppFiles("shopapp.tasks:app")
        assert files.changed() == []
        os.utime(package / "sub" / "helpers.py", ns=(1, 10**18))
        (package / "new.py").write_text("")
        (package / "__pycache__" / "tasks.cpython.pyc.py").write_text("")  # not a source
        (package / "tasks.py").unlink()
        assert files.changed() == [
            package / "new.py",
            package / "sub" / "helpers.py",
            package / "tasks.py",
        ]
        assert files.changed() == []
        files.forget_modules()
        assert "shopapp.tasks" not in sys.modules and "shopapp" not in sys.modules
        assert "conveyor.app" in sys.modules
    finally:
        for name in ("shopapp", "shopapp.tasks"):
            sys.modules.pop(name, None)


def test_a_folder_named_conveyor_ahead_on_the_path_is_named(tmp_path: Path) -> None:
    assert shadowing([str(tmp_path)]) is None
    (tmp_path / "conveyor").mkdir()
    problem = shadowing([str(tmp_path)])
    assert problem is not None
    assert problem.startswith(f"the folder {tmp_path / 'conveyor'} shadows the installed")
    assert problem.endswith("Rename or move that folder, or run from a directory without it.")


def test_a_regular_package_named_conveyor_is_named_but_links_to_this_one_are_not(
    tmp_path: Path,
) -> None:
    links = tmp_path / "links" / "conveyor"  # how an editable install may lay it out
    links.mkdir(parents=True)
    for name in os.listdir(INSTALLED):
        (links / name).symlink_to(Path(INSTALLED) / name)
    assert shadowing([str(tmp_path / "links")]) is None
    clone = tmp_path / "clone" / "conveyor"
    clone.mkdir(parents=True)
    (clone / "__init__.py").write_text("")
    problem = shadowing([str(tmp_path / "clone")])
    assert problem is not None and problem.startswith(f"the folder {clone} shadows")


def test_an_import_error_is_the_exception_and_the_app_s_line(tmp_path: Path) -> None:
    source = tmp_path / "broken_app.py"
    source.write_text("import conveyor\n\nVALUE = 1 / 0\n")
    sys.path.insert(0, str(tmp_path))
    try:
        __import__("broken_app")
    except ZeroDivisionError as exc:
        said = import_failure(exc)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("broken_app", None)
    assert said == f"ZeroDivisionError: division by zero\n  at {source}:3: VALUE = 1 / 0"


def test_a_syntax_error_names_its_file_and_line(tmp_path: Path) -> None:
    source = tmp_path / "typo_app.py"
    source.write_text("def broken(:\n")
    try:
        compile(source.read_text(), str(source), "exec")
    except SyntaxError as exc:
        said = import_failure(exc)
    assert said.splitlines()[1] == f"  at {source}:1: def broken(:"
