"""A Jepsen-style history: one JSON object per line (tests/PLAN.md).

Every operation is an ``invoke`` followed by exactly one completion of the same ``process``:
``ok`` (the server answered yes), ``fail`` (the server answered no: nothing happened) or
``info`` (indeterminate: the connection reset or timed out, so the request may or may not have
taken effect). A lost enqueue reply is ``info``, never ``fail``: calling it a failure would let a
task that did get created look like a phantom. Nemesis events (kills, restarts) are in the same
file with ``process: "nemesis"``, so a reader can line faults up with client operations.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from conveyor.frozen import frozen

OpType = Literal["invoke", "ok", "fail", "info"]
NEMESIS = "nemesis"


@frozen
class Op:
    process: int | str  # a client number, or "nemesis"
    type: OpType
    f: str  # enqueue | get | kill | start | heal | ...
    value: dict[str, Any]
    time_ns: int
    node: str = "127.0.0.1"

    def as_dict(self) -> dict[str, Any]:
        return {
            "process": self.process,
            "type": self.type,
            "f": self.f,
            "value": self.value,
            "time_ns": self.time_ns,
            "node": self.node,
        }

    @staticmethod
    def from_dict(doc: dict[str, Any]) -> Op:
        return Op(doc["process"], doc["type"], doc["f"], doc["value"], doc["time_ns"], doc["node"])


@dataclass
class History:
    """Appends ops in memory and, when given a path, to a JSONL file as they happen (so a run
    that dies half-way still leaves the history it made)."""

    path: Path | None = None
    ops: list[Op] = field(default_factory=list)
    _out: IO[str] | None = None

    def __post_init__(self) -> None:
        if self.path is not None:
            self._out = self.path.open("a", encoding="utf-8")

    def add(self, process: int | str, type_: OpType, f: str, value: dict[str, Any]) -> Op:
        op = Op(process, type_, f, value, time.time_ns())
        self.ops.append(op)
        if self._out is not None:
            self._out.write(json.dumps(op.as_dict()) + "\n")
        return op

    def invoke(self, process: int, f: str, value: dict[str, Any]) -> Op:
        return self.add(process, "invoke", f, value)

    def complete(self, invoked: Op, type_: OpType, value: dict[str, Any]) -> Op:
        return self.add(invoked.process, type_, invoked.f, {**invoked.value, **value})

    def nemesis(self, f: str, value: dict[str, Any]) -> Op:
        return self.add(NEMESIS, "info", f, value)

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None


def read(path: Path) -> list[Op]:
    return list(parse(path.read_text(encoding="utf-8").splitlines()))


def parse(lines: Iterable[str]) -> Iterator[Op]:
    for line in lines:
        if line.strip():
            yield Op.from_dict(json.loads(line))
