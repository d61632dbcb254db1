"""``conveyor dev`` around its node: a line per task event, reloads, and a drain on Ctrl-C.

Rules, and why:

1. Lines come from the node's events stream (``webhooks/stream.Tail``, what ``GET
   /v1/events`` reads), from its end when the command starts: one line per state change (the
   checkpoints are not), in the order of each task's events; never from polling the API. A
   line: the time of the event, the task type, the task id's last 8 characters, what
   happened, the attempt, and how long the attempt ran or why it failed.
2. ``--reload`` looks at the app's files every ``RELOAD_POLL_MS`` (their mtimes, on the
   node's clock): the files of the app's top-level package, or the ``.py`` files beside a
   top-level module. On a change it imports the app anew in this process first: if that
   fails, the error is printed in a few lines and the running agent stays. Otherwise a new
   agent (new guests, the new code) starts at once and the old one drains in the background:
   its running tasks finish on the code they started with.
3. Ctrl-C (or SIGTERM) stops claiming work; the running tasks get up to the drain limit to
   finish, with a line every ``COUNTDOWN_MS``. A second one kills them now: they are reported
   as killed attempts, so they are retried (the next start runs them again). Nothing
   acknowledged is lost either way: it is in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from conveyor.frozen import frozen

if TYPE_CHECKING:
    from conveyor.agents.host import HostAgent
    from conveyor.schemas.types import TaskEvent
    from conveyor.streams.clock import Clock
    from conveyor.streams.log.api import Log

RELOAD_POLL_MS = 500.0  # rule 2
COUNTDOWN_MS = 5_000.0  # rule 3
STARTED_MAX = 100_000  # attempts whose start is remembered for their duration (rule 1)
FILES_MAX = 5_000  # files of the app looked at for --reload
TYPE_CHARS = 20
ERROR_CHARS = 120

AgentStarter = Callable[[Callable[["HostAgent"], None]], Awaitable[None]]

# What each event says, and its color.
LABELS: dict[str, tuple[str, str]] = {
    "TaskEnqueued": ("enqueued", "dim"),
    "TaskLeased": ("leased", "cyan"),  # handed to an agent: it starts when a guest is free
    "TaskSucceeded": ("succeeded", "green"),
    "AttemptFailed": ("attempt failed", "yellow"),
    "TaskRetryScheduled": ("failed, will retry", "yellow"),
    "TaskFailed": ("FAILED", "bold red"),
    "TaskCanceled": ("canceled", "magenta"),
    "TaskExpired": ("expired", "red"),
    "CancelRequested": ("cancel requested", "magenta"),
    "LeaseExpired": ("lease expired", "yellow"),
    "TaskRequeued": ("requeued", "dim"),
    "TaskSleeping": ("sleeping", "dim"),
    "TaskWaiting": ("waiting", "dim"),
}
ENDS_ATTEMPT = frozenset(
    {
        "TaskSucceeded",
        "AttemptFailed",
        "TaskRetryScheduled",
        "TaskFailed",
        "TaskCanceled",
        "TaskExpired",
        "LeaseExpired",
        "TaskRequeued",
    }
)
# Their attempt number is already the next one's: the line shows the attempt that ended.
NEXT_ATTEMPT = frozenset({"TaskRetryScheduled"})


@frozen
class DevOptions:
    """What ``conveyor dev`` adds to a node with an agent."""

    quiet: bool = False  # no event lines
    reload: bool = False
    drain_s: float = 30.0


class EventLines:
    """Rule 1: the line of each event, remembering when each attempt started."""

    def __init__(self) -> None:
        self._started: dict[tuple[str, int], int] = {}  # (task id, attempt) -> its TaskLeased

    def line(self, event: TaskEvent) -> Text | None:
        kind = event.kind.value
        label = LABELS.get(kind)
        if label is None:
            return None
        attempt = event.attempt - 1 if kind in NEXT_ATTEMPT else event.attempt
        key = (event.task_id, attempt)
        if kind == "TaskLeased":
            self._started[key] = event.ts_ms
            while len(self._started) > STARTED_MAX:
                del self._started[next(iter(self._started))]
        began = self._started.pop(key, None) if kind in ENDS_ATTEMPT else None
        when = datetime.fromtimestamp(event.ts_ms / 1000).strftime("%H:%M:%S.%f")[:-3]
        text = Text(f"{when} ", style="dim")
        text.append(f"{event.task_type[:TYPE_CHARS]:<{TYPE_CHARS}} ")
        text.append(f"{event.task_id[-8:]} ", style="dim")  # the first ones are the time
        text.append(label[0], style=label[1])
        text.append(f" #{attempt}")
        if began is not None:
            text.append(f"  {_duration(event.ts_ms - began)}")
        if event.error_class or event.error_message:
            first = (event.error_message or "").strip().splitlines()[:1]
            why = f"{event.error_class}: {first[0]}" if first else f"{event.error_class}"
            text.append(f"  {why[:ERROR_CHARS]}", style=label[1])
        return text


def _duration(ms: int) -> str:
    return f"{ms} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


async def print_events(events: Log, out: Console) -> None:
    """Forever: a line per task event from now on (rule 1)."""
    from conveyor.streams.webhooks.stream import Tail, tail_positions

    lines = EventLines()
    try:
        async with Tail(events, await tail_positions(events)) as tail:
            while True:
                item = await tail.next(None)
                if item is None:
                    continue
                text = lines.line(item.event)
                if text is not None:
                    out.print(text, soft_wrap=True, highlight=False)
    except Exception as exc:  # the lines are a view: the node and the agent go on without
        out.print(f"[yellow]no more task lines: the events stream failed: {escape(str(exc))}")


class Interrupts:
    """SIGINT and SIGTERM: the first sets ``stop``, the next ``now`` (rule 3)."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.now = asyncio.Event()

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.received)

    def received(self) -> None:
        (self.now if self.stop.is_set() else self.stop).set()


class AppFiles:
    """Rule 2: the files of the app and their mtimes."""

    def __init__(self, app_ref: str) -> None:
        top = sys.modules[app_ref.partition(":")[0].split(".")[0]]
        paths = list(getattr(top, "__path__", []))
        self.recursive = bool(paths)
        file = getattr(top, "__file__", None)
        self.roots = [Path(p) for p in paths] or ([Path(file).parent] if file else [])
        self._seen = self._mtimes()

    def _files(self) -> Iterator[Path]:
        count = 0
        for root in self.roots:
            found = root.rglob("*.py") if self.recursive else root.glob("*.py")
            for path in found:
                if any(part.startswith(".") or part == "__pycache__" for part in path.parts):
                    continue
                count += 1
                if count > FILES_MAX:
                    return
                yield path

    def _mtimes(self) -> dict[Path, int]:
        seen = {}
        for path in self._files():
            with contextlib.suppress(OSError):
                seen[path] = path.stat().st_mtime_ns
        return seen

    def changed(self) -> list[Path]:
        """The files changed, added or removed since the last call."""
        now = self._mtimes()
        changed = [p for p in now.keys() | self._seen.keys() if now.get(p) != self._seen.get(p)]
        self._seen = now
        return sorted(changed)

    def forget_modules(self) -> None:
        """Drop the app's modules from this process, so the next import reads the files."""
        roots = tuple(str(r.resolve()) + os.sep for r in self.roots)
        for name, module in list(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if (
                file
                and os.path.realpath(file).startswith(roots)
                and name.partition(".")[0] != "conveyor"
            ):
                del sys.modules[name]
        importlib.invalidate_caches()


class DevAgents:
    """The agent ``conveyor dev`` runs, and the ones a reload left draining (rule 2)."""

    def __init__(self, start: AgentStarter) -> None:
        self._start = start
        self._found: list[HostAgent] = []  # the current agent, once its task has begun
        self.task: asyncio.Task[None] | None = None
        self.draining: dict[asyncio.Task[None], HostAgent] = {}

    def start(self) -> None:
        self._found = []
        self.task = asyncio.ensure_future(self._start(self._found.append))

    def current(self) -> HostAgent | None:
        return self._found[0] if self._found else None

    def replace(self) -> None:
        """Start a new agent; the current one drains beside it."""
        old, task = self.current(), self.task
        if old is not None and task is not None and not task.done():
            old.stop()
            self.draining[task] = old
        self.start()

    def all(self) -> list[tuple[asyncio.Task[None], HostAgent | None]]:
        pairs: list[tuple[asyncio.Task[None], HostAgent | None]] = list(self.draining.items())
        if self.task is not None:
            pairs.append((self.task, self.current()))
        return [(t, a) for t, a in pairs if not t.done()]

    def running(self) -> int:
        return sum(
            sum(1 for run in agent.running.values() if run.started)
            for _, agent in self.all()
            if agent is not None
        )


async def serve(
    start: AgentStarter,
    app_ref: str,
    options: DevOptions,
    interrupts: Interrupts,
    clock: Clock,
    out: Console,
) -> None:
    """Run the app's agent until Ctrl-C, reloading it on changes, then drain (rules 2, 3)."""
    agents = DevAgents(start)
    agents.start()
    files = AppFiles(app_ref) if options.reload else None
    stopped = asyncio.ensure_future(interrupts.stop.wait())
    try:
        while not stopped.done():
            waits: set[asyncio.Future[Any]] = {stopped}
            if agents.task is not None and not agents.task.done():
                waits.add(agents.task)
            tick = asyncio.ensure_future(clock.sleep_ms(RELOAD_POLL_MS)) if files else None
            if tick is not None:
                waits.add(tick)
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if tick is not None:
                tick.cancel()
            _ended(agents, reloading=files is not None, out=out)
            if files is not None and not stopped.done():
                changed = files.changed()
                if changed:
                    _reload(agents, files, app_ref, changed, out)
    finally:
        stopped.cancel()
    await _drain(agents, options.drain_s, interrupts, clock, out)


def _ended(agents: DevAgents, *, reloading: bool, out: Console) -> None:
    """An agent that stopped by itself: its error ends ``conveyor dev``, unless it reloads
    (then the next change starts another)."""
    for task in [t for t in agents.draining if t.done()]:
        del agents.draining[task]
        if not task.cancelled() and task.exception() is not None:
            why = escape(str(task.exception()))
            out.print(f"[yellow]the agent of the code before the reload failed:[/] {why}")
    current = agents.task
    if current is None or not current.done():
        return
    agents.task = None
    error = None if current.cancelled() else current.exception()
    if error is None:
        return
    if not reloading:
        raise error
    out.print(f"[red]the agent stopped:[/] {escape(str(error))}", highlight=False)
    out.print("[dim]waiting for a change to the app's files[/]")


def _reload(
    agents: DevAgents, files: AppFiles, app_ref: str, changed: list[Path], out: Console
) -> None:
    from conveyor.agents.runner import load_app
    from conveyor.agents.startup import import_failure

    names = ", ".join(p.name for p in changed[:3]) + (" ..." if len(changed) > 3 else "")
    files.forget_modules()
    try:
        app = load_app(app_ref)
    except BaseException as exc:
        out.print(f"[red]reload failed[/] ({names} changed):", highlight=False)
        out.print(import_failure(exc), highlight=False, markup=False)
        out.print("[dim]the agent runs the code from before; fix it and save again[/]")
        return
    agents.replace()
    out.print(f"[green]reloaded[/] {app_ref} ({len(app.tasks)} task types; {names} changed)")


async def _drain(
    agents: DevAgents, drain_s: float, interrupts: Interrupts, clock: Clock, out: Console
) -> None:
    """Rule 3."""
    pairs = agents.all()
    for task, agent in pairs:
        if agent is not None:
            agent.stop()
        else:  # not begun yet: it holds nothing
            task.cancel()
    running = agents.running()
    if running:
        out.print(
            f"stopping: {running} running task(s) get up to {drain_s:g} s to finish "
            "(Ctrl-C again: stop now)"
        )
    else:
        out.print("stopping")
    tasks = {task for task, _ in pairs}
    deadline = clock.monotonic_ms() + drain_s * 1000
    now = asyncio.ensure_future(interrupts.now.wait())
    try:
        while pending := {t for t in tasks if not t.done()}:
            tick = asyncio.ensure_future(clock.sleep_ms(COUNTDOWN_MS))
            await asyncio.wait({*pending, now, tick}, return_when=asyncio.FIRST_COMPLETED)
            fired = tick.done()
            tick.cancel()
            if now.done():
                out.print(f"stopping now: killing {agents.running()} running task(s)")
                for _, agent in pairs:
                    if agent is not None:
                        agent.stop(now=True)
                break
            if fired and any(not t.done() for t in tasks):
                left_s = max(0.0, (deadline - clock.monotonic_ms()) / 1000)
                out.print(f"  {agents.running()} running, {left_s:.0f} s left")
        results = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        now.cancel()
    for result in results:
        if isinstance(result, Exception):
            raise result
    out.print("stopped the agent; stopping the node")
