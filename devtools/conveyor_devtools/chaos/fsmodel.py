"""FsModel: what a power cut can leave of files and directories, for the disk fault tests.

- a file is a durable image (bytes covered by a completed fsync/fdatasync) plus the writes and
  truncates since (pending);
- a directory is a durable entry map (as of its last directory fsync) plus the creates,
  renames and deletes since (pending).

Rules of the model, and why:

1. A power cut keeps, per file, the durable image plus a prefix of its pending writes, the last
   one possibly torn at any byte, optionally with garbage after the tear (SQLite's crash VFS);
   per directory, the durable map plus a prefix of its pending entry changes. Files and
   directories persist independently of each other, in any combination. Pages of ONE write
   landing out of order are not modelled: ``LocalLog`` reports that shape as ``LogCorruption``
   on purpose (a safe false alarm; see its rule 4).
2. fsync and fdatasync are the same here: both make the file's data and size durable (ext4 and
   xfs do; the LMDB "fdatasync after growth" trap is for file systems that do not).

``random_tears`` picks one crash state (a power cut); ``replay`` and ``crash_choices``
enumerate them all for a recorded run (tests/PLAN.md,
``tests/chaos/test_crash_states.py``).
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from conveyor.frozen import frozen

DIR = -1  # a directory entry that is a subdirectory (file entries hold an inode number)

# One change to a file since its last sync: ("write", position, data) or ("truncate", length).
FileOp: TypeAlias = "tuple[str, int, bytes]"
# One change to a directory since its last sync: ("link", name, inode | DIR) or
# ("unlink", name, 0) or ("rename", old name + "\0" + new name, 0).
DirOp: TypeAlias = "tuple[str, str, int]"


def apply_file_op(data: bytearray, op: FileOp, keep: int | None = None) -> None:
    """Apply ``op`` to ``data``; ``keep`` tears a write after that many bytes."""
    kind, at, payload = op
    if kind == "truncate":
        del data[at:]
        data.extend(bytes(max(0, at - len(data))))
        return
    chunk = payload if keep is None else payload[:keep]
    if at > len(data):
        data.extend(bytes(at - len(data)))
    data[at : at + len(chunk)] = chunk


def apply_dir_op(entries: dict[str, int], op: DirOp) -> None:
    kind, name, inode = op
    if kind == "link":
        entries[name] = inode
    elif kind == "unlink":
        entries.pop(name, None)
    else:
        old, new = name.split("\0")
        if old in entries:
            entries[new] = entries.pop(old)


@dataclass
class FileState:
    durable: bytearray
    current: bytearray
    pending: list[FileOp] = field(default_factory=list)


@dataclass
class DirState:
    durable: dict[str, int]
    current: dict[str, int]
    pending: list[DirOp] = field(default_factory=list)


@frozen
class Tear:
    """How much of one file's or directory's pending changes a crash keeps."""

    ops: int  # a prefix of this many pending changes survives
    torn_bytes: int | None = None  # and this many bytes of the next (a write), if set
    garbage: bytes = b""  # written after the torn bytes, in place of the rest


class FsModel:
    """Files and directories under one root, as the page cache and the disk see them."""

    def __init__(self) -> None:
        self.files: dict[int, FileState] = {}
        self.dirs: dict[Path, DirState] = {}
        self._next_inode = 1

    @classmethod
    def scan(cls, root: Path) -> FsModel:
        """Everything already under ``root`` is durable."""
        model = cls()
        for here, subdirs, names in os.walk(root):
            entries = dict.fromkeys(subdirs, DIR)
            for name in names:
                data = bytearray((Path(here) / name).read_bytes())
                entries[name] = model.new_file(data, durable=True)
            model.dirs[Path(here)] = DirState(dict(entries), dict(entries))
        return model

    def new_file(self, data: bytearray | None = None, *, durable: bool = False) -> int:
        inode, self._next_inode = self._next_inode, self._next_inode + 1
        current = data if data is not None else bytearray()
        self.files[inode] = FileState(bytearray(current) if durable else bytearray(), current)
        return inode

    def change_file(self, inode: int, op: FileOp) -> None:
        state = self.files[inode]
        apply_file_op(state.current, op)
        state.pending.append(op)

    def sync_file(self, inode: int, *, drop: bool = False) -> None:
        """A completed fsync, or (``drop``) a failed one that lost the pending pages."""
        state = self.files[inode]
        if not drop:
            for op in state.pending:
                apply_file_op(state.durable, op)
        state.pending = []

    def change_dir(self, path: Path, op: DirOp) -> None:
        state = self.dirs[path]
        apply_dir_op(state.current, op)
        state.pending.append(op)
        if op[0] == "link" and op[2] == DIR:
            self.dirs[path / op[1]] = DirState({}, {})

    def sync_dir(self, path: Path) -> None:
        state = self.dirs[path]
        state.durable = dict(state.current)
        state.pending = []

    def crash_image(self, inode: int, tear: Tear) -> bytes:
        state = self.files[inode]
        data = bytearray(state.durable)
        for op in state.pending[: tear.ops]:
            apply_file_op(data, op)
        if tear.torn_bytes is not None and tear.ops < len(state.pending):
            op = state.pending[tear.ops]
            apply_file_op(data, op, keep=tear.torn_bytes)
            if tear.garbage:
                apply_file_op(data, ("write", op[1] + tear.torn_bytes, tear.garbage))
        return bytes(data)

    def crash_entries(self, path: Path, tear: Tear) -> dict[str, int]:
        state = self.dirs[path]
        entries = dict(state.durable)
        for op in state.pending[: tear.ops]:
            apply_dir_op(entries, op)
        return entries

    def materialize(
        self, root: Path, target: Path, choose: Callable[[str, Path | int], Tear]
    ) -> None:
        """Write the crash state to ``target`` (which is emptied first). ``choose`` picks the
        tear for ("dir", path) and ("file", inode); the same inode gets one image."""
        images: dict[int, bytes] = {}
        if target == root:
            _empty_dir(target)
        elif target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True, exist_ok=True)
        stack = [(root, target)]
        while stack:
            here, out = stack.pop()
            for name, inode in self.crash_entries(here, choose("dir", here)).items():
                if inode == DIR:
                    (out / name).mkdir()
                    stack.append((here / name, out / name))
                    continue
                if inode not in images:
                    images[inode] = self.crash_image(inode, choose("file", inode))
                (out / name).write_bytes(images[inode])


def keep_nothing(kind: str, key: Path | int) -> Tear:
    """The crash state where no pending change survived."""
    return Tear(0)


def _empty_dir(path: Path) -> None:
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def random_tears(
    model: FsModel, rng: random.Random, *, torn: bool = True, garbage: bool = False
) -> Callable[[str, Path | int], Tear]:
    """A power cut's choice: a random prefix of each file's and directory's pending changes."""

    def choose(kind: str, key: Path | int) -> Tear:
        pending = _pending(model, (kind, key))
        ops = rng.randint(0, len(pending))
        if kind == "dir" or ops == len(pending) or not torn or pending[ops][0] != "write":
            return Tear(ops)
        payload = pending[ops][2]
        assert isinstance(payload, bytes)
        size = len(payload)
        keep = rng.randint(0, max(0, size - 1))
        junk = rng.randbytes(min(size - keep, 4096)) if garbage and rng.random() < 0.5 else b""
        return Tear(ops, keep, junk)

    return choose


def replay(initial: FsModel, ops: list[tuple[str, Any]]) -> Iterator[tuple[int, FsModel]]:
    """Rebuild the model after each prefix of a recorded run: ``(ops applied, model)``.

    The same model object is yielded each time, advanced in place; markers are skipped."""
    model = FsModel()
    model.files = {
        k: FileState(bytearray(v.durable), bytearray(v.current)) for k, v in initial.files.items()
    }
    model.dirs = {k: DirState(dict(v.durable), dict(v.current)) for k, v in initial.dirs.items()}
    yield 0, model
    for i, (kind, value) in enumerate(ops, 1):
        if kind == "new_file":
            assert isinstance(value, int)
            model.files[value] = FileState(bytearray(), bytearray())
            continue
        if kind == "file":
            model.change_file(value[0], value[1])
        elif kind == "sync":
            assert isinstance(value, int)
            model.sync_file(value)
        elif kind == "sync_failed":
            assert isinstance(value, int)
            model.sync_file(value, drop=True)
        elif kind == "dir":
            model.change_dir(value[0], value[1])
        elif kind == "sync_dir":
            assert isinstance(value, Path)
            model.sync_dir(value)
        else:
            continue  # a marker: no state change, no new crash point
        yield i, model


CrashChoice: TypeAlias = "dict[tuple[str, Path | int], Tear]"


def tear_options(pending: list[FileOp] | list[DirOp], *, files: bool) -> list[Tear]:
    """Every prefix of the pending changes; for a file, also the next write torn after 1 byte,
    half of it and all but 1 byte, and half of it followed by zeros (an extended, unwritten
    page)."""
    options = [Tear(n) for n in range(len(pending) + 1)]
    if files:
        for n, op in enumerate(pending):
            payload = op[2]
            size = len(payload) if isinstance(payload, bytes) and op[0] == "write" else 0
            if size > 1:
                cuts = sorted({1, size // 2, size - 1})
                options += [Tear(n, cut) for cut in cuts]
                options.append(Tear(n, size // 2, bytes(size - size // 2)))
    return options


def crash_choices(model: FsModel, rng: random.Random, cap: int) -> list[CrashChoice]:
    """The crash states a power cut can leave now: per directory and per reachable file, one of
    its ``tear_options``, combined freely. All combinations when there are at most ``cap``;
    otherwise ``cap`` of them, always including "nothing pending survived" and "everything
    did"."""
    reachable: set[int] = set()
    axes: list[tuple[tuple[str, Path | int], list[Tear]]] = []
    for path, state in model.dirs.items():
        reachable.update(i for i in (*state.durable.values(), *state.current.values()) if i > 0)
        if state.pending:
            axes.append((("dir", path), tear_options(state.pending, files=False)))
    for inode in sorted(reachable):
        pending = model.files[inode].pending
        if pending:
            axes.append((("file", inode), tear_options(pending, files=True)))
    total = 1
    for _, options in axes:
        total *= len(options)
    if total <= cap:
        combos: list[CrashChoice] = [{}]
        for key, options in axes:
            combos = [{**c, key: t} for c in combos for t in options]
        return combos
    nothing = {key: options[0] for key, options in axes}
    everything = {key: Tear(len(_pending(model, key))) for key, _ in axes}
    sampled = [{key: rng.choice(options) for key, options in axes} for _ in range(cap - 2)]
    return [nothing, everything, *sampled]


def _pending(model: FsModel, key: tuple[str, Path | int]) -> list[FileOp] | list[DirOp]:
    kind, what = key
    if kind == "dir":
        assert isinstance(what, Path)
        return model.dirs[what].pending
    assert isinstance(what, int)
    return model.files[what].pending
