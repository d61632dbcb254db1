"""Durable steps: ``ctx.step.run``, ``ctx.step.sleep``, ``ctx.step.sleep_until``,
``ctx.step.idempotency_key``, by the rules below.

Rule 1 (identity): a step is ``name#occurrence`` (the occurrence counts this attempt's earlier
unkeyed calls of the name) or ``name:key``. Keyed calls do not advance the occurrence counter
and are matched by identity wherever they sit; unkeyed ones (sleeps too) are matched at their
position among the attempt's unkeyed calls.
Rule 2 (divergence): every unkeyed call is checked, in memory, against the snapshot of
committed steps loaded at attempt start; a different identity at a recorded position fails the
task without retries. Steps past the recorded end just run; fewer steps than recorded only
log a warning when the body returns.
Rule 3 (memo): only a body that returns is committed. A commit is durable before ``run``
returns; a memo hit returns the value decoded from its stored bytes, and so does a fresh run
(the same shape either way).
Rule 4 (fencing): before a non-memoized body runs, a claim is recorded under the attempt's
lease; the claim count is ``ctx.step.attempt``. A claim or commit the platform refuses as
stale means the lease is gone: the body unwinds and the attempt is dropped.
Rule 5 (signals): sleep, a fan-out (``ctx.parallel``, see ``conveyor.workflows``), divergence,
overlap and a lost lease unwind the body as
``StepSignal`` (a BaseException). Each is latched: every later step call raises it again, and
a body that swallowed one and returned anyway fails the attempt naming it.
Rule 6 (compensations, saga style): ``run(name, fn, compensate=undo)`` registers ``undo``, to be
called with the step's value if the task is canceled after the step committed. Before the
step's body first runs, the marker step ``@compensate:<identity>`` is committed, so the platform
knows, before any side effect, that a cancel must compensate. A canceled task with markers gets
one more attempt in compensating mode: the body replays its committed steps (re-registering
their compensations) and stops at the first step, sleep, fan-out or wait that had not
committed (``Compensate``, a signal); then the compensations run newest first, each as the
durable keyed step ``@undo:<identity>`` (memoized: exactly once across crashes and retries),
and the attempt reports CANCELED. A compensation that raises fails the attempt
(``CompensationFailed``, naming the step): retried per the task's retry policy, the task ends
FAILED when it runs out. A compensation may be an ``async def``; it runs to its end in its own
event loop, after the body's.
Rule 7 (async): ``fn`` an ``async def`` (or a partial of one) makes ``run`` awaitable, memo hit
included: ``value = await ctx.step.run("fetch", fetch)``. Claim and commit then wait off the
event loop, so the handler's loop (the engine's own, in ``conveyor.testing``) stays free while
they become durable. A plain function that returns an awaitable (``lambda: fetch()``) is
refused by name: its body would have run, unawaited, with nothing to commit.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar, overload

from conveyor import codecs
from conveyor.codecs import PayloadCodec, decode_tree, encode_values
from conveyor.durations import Duration, to_ms
from conveyor.errors import ContractError
from conveyor.frozen import frozen
from conveyor.loops import run_awaitable
from conveyor.schemas.steps import (
    COMPENSATE_PREFIX,
    STEP_KEY_BYTES_MAX,
    STEP_NAME_BYTES_MAX,
    UNDO_PREFIX,
    over_cap,
)
from conveyor.signals import (
    ClaimLost,
    Compensate,
    CompensationFailed,
    Divergence,
    FanOut,
    Sleep,
    StepRefused,
    StepSignal,
    StepsOverlapped,
    StepUnavailable,
    WaitEvent,
)
from conveyor.workflows import check_mode, child_bodies, event_of, event_step_name, results_of

T = TypeVar("T")
log = logging.getLogger("conveyor.steps")

CLAIM, COMMIT = "CLAIM", "COMMIT"


@frozen(kw_only=True)
class StepAck:
    """The platform's answer to one step claim or commit."""

    ok: bool
    lost: bool = False  # the lease is gone: drop the attempt
    transient: bool = False  # could not reach the platform: retry the attempt
    reason: str | None = None


class StepChannel(Protocol):
    def step(self, op: str, identity: str, position: int, value: Any) -> StepAck:
        """Record a claim or commit; blocks until it is durable (or refused)."""
        ...


@dataclass(slots=True)
class _Recorded:
    identity: str
    position: int
    claims: int
    committed: bool
    value: Any
    wake_at_ms: int | None


def _recorded(rows: list[dict[str, Any]]) -> list[_Recorded]:
    return [
        _Recorded(
            identity=str(r["identity"]),
            position=int(r["position"]),
            claims=int(r.get("claims") or 0),
            committed=bool(r.get("committed")),
            value=r.get("value"),
            wake_at_ms=r.get("wake_at_ms"),
        )
        for r in rows
    ]


VERSION_PREFIX = "@version:"  # the identity of a ``version`` marker; no step name starts so


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name or len(name.encode()) > STEP_NAME_BYTES_MAX:
        raise StepRefused(f"a step name is 1..{STEP_NAME_BYTES_MAX} bytes, got {name!r:.200}")
    if "\x00" in name:
        raise StepRefused(f"a step name cannot contain U+0000 (NUL), got {name!r:.200}")


def encode_value(identity: str, value: Any) -> str:
    """The stored form of a step's value (compact JSON), checked against the per-step cap."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StepRefused(
            f"step {identity!r} returned a {type(value).__name__}, not JSON: {exc}; "
            "return something JSON keeps, or a handle to it"
        ) from exc
    why = over_cap(identity, len(text.encode()), 0, 0)
    if why is not None:
        raise StepRefused(why)
    return text


def _undoing(identity: str, compensate: Callable[[Any], Any], value: Any) -> Callable[[], Any]:
    """The body of ``@undo:<identity>``: ``compensate(value)``, its failure named; an async
    compensation runs on the thread's long-lived loop (``compensate_all`` runs off any loop)."""

    def call() -> Any:
        try:
            result = compensate(value)
            return run_awaitable(result) if inspect.isawaitable(result) else result
        except Exception as exc:
            raise CompensationFailed(identity, exc) from exc

    return call


def _decoded(identity: str, value: Any) -> Any:
    """The value as a memo hit would give it back (rule 3)."""
    return json.loads(encode_value(identity, value))


def _discard(value: Awaitable[Any]) -> None:
    if inspect.iscoroutine(value):
        value.close()  # never awaited, by design: no warning about it


class StepContext:
    """``ctx.step``: the durable steps of one attempt."""

    def __init__(
        self,
        *,
        task_id: str,
        run_key: str,
        started_ms: int,
        recorded: list[dict[str, Any]],
        channel: StepChannel,
        compensating: bool = False,
        codec: PayloadCodec | None = None,
    ) -> None:
        self._task_id = task_id
        self._codec = codec  # step values leave encoded, recorded ones are decoded on use
        self.compensating = compensating  # rule 6: replay, then run the compensations
        self._compensations: list[tuple[str, Callable[[Any], Any], Any]] = []
        self._run_key = run_key
        self._started_ms = started_ms
        self._channel = channel
        rows = _recorded(recorded)
        self._by_identity = {r.identity: r for r in rows}
        self._at = {r.position: r for r in rows if r.committed and r.position >= 0}
        self._reached = {r.position for r in rows if r.position >= 0}  # claimed or committed
        self._occurrences: Counter[str] = Counter()
        self._running: list[str] = []  # unkeyed identities asked for, in order
        self._used: set[str] = set()
        self._lock = threading.Lock()
        self._busy = False
        self._current: str | None = None
        self._current_attempt = 0
        self.signal: StepSignal | None = None  # latched: raised again at every step call

    # -- inside a step body ---------------------------------------------------------------------

    @property
    def idempotency_key(self) -> str:
        """``<run key>:<step identity>``: the same in every attempt, after every sleep and
        across a dead-letter retry. Pass it to the service the step calls."""
        return f"{self._run_key}:{self._inside('idempotency_key')}"

    @property
    def attempt(self) -> int:
        """How many times this step's body has been started, this time included: above 1
        when an earlier attempt claimed it and died before committing."""
        self._inside("attempt")
        return self._current_attempt

    def _inside(self, what: str) -> str:
        current = self._current
        if current is None:
            raise ContractError(
                f"ctx.step.{what} is readable only inside a step body (the function given "
                "to ctx.step.run): outside one there is no step for it to name"
            )
        return current

    # -- steps ----------------------------------------------------------------------------------

    @overload
    def run(
        self,
        name: str,
        fn: Callable[[], Awaitable[T]],
        key: str | None = None,
        *,
        compensate: Callable[[T], Any] | None = None,
    ) -> Awaitable[T]: ...

    @overload
    def run(
        self,
        name: str,
        fn: Callable[[], T],
        key: str | None = None,
        *,
        compensate: Callable[[T], Any] | None = None,
    ) -> T: ...

    def run(
        self,
        name: str,
        fn: Callable[[], Any],
        key: str | None = None,
        *,
        compensate: Callable[[Any], Any] | None = None,
    ) -> Any:
        """Run ``fn`` once per task: a later attempt returns its committed value.

        ``compensate``: called with the step's value if the task is canceled after the step
        committed, newest first, each exactly once, as a durable step (rule 6):

            charge = ctx.step.run("charge", lambda: pay(order), compensate=refund)

        ``fn`` an ``async def``: ``await`` the call (rule 7).
        """
        self._reraise()
        if compensate is not None and not callable(compensate):
            raise StepRefused(f"compensate= takes a callable, got {type(compensate).__name__}")
        identity, position = self._identify(name, key)  # at the call: positions follow calls
        row = self._by_identity.get(identity)
        if inspect.iscoroutinefunction(fn):
            return self._run_async(identity, position, row, fn, compensate)
        if row is not None and row.committed:
            self._used.add(identity)
            if compensate is not None and not self.compensating:
                self._mark(identity)  # committed by code that had no compensate= yet
            value = self._plain(row.value)
            self._register(identity, compensate, value)
            return value
        if self.compensating:
            raise self._latch(Compensate(identity))
        if compensate is not None:
            self._mark(identity)
        decoded = self._execute(identity, position, row, fn)
        self._register(identity, compensate, decoded)
        return decoded

    async def _run_async(
        self,
        identity: str,
        position: int,
        row: _Recorded | None,
        fn: Callable[[], Awaitable[Any]],
        compensate: Callable[[Any], Any] | None,
    ) -> Any:
        """``run`` of an async ``fn`` (rule 7): the same steps, each write awaited."""
        if row is not None and row.committed:
            self._used.add(identity)
            if compensate is not None and not self.compensating:
                await self._mark_async(identity)
            value = self._plain(row.value)
            self._register(identity, compensate, value)
            return value
        if self.compensating:
            raise self._latch(Compensate(identity))
        if compensate is not None:
            await self._mark_async(identity)
        self._enter(identity)
        try:
            await self._write_async(CLAIM, identity, position, None)
            self._begin(identity, row)
            try:
                value = await fn()
            finally:
                self._current = None
            decoded = _decoded(identity, value)
            await self._write_async(COMMIT, identity, position, decoded)
        finally:
            self._leave()
        self._register(identity, compensate, decoded)
        return decoded

    def _execute(
        self, identity: str, position: int, row: _Recorded | None, fn: Callable[[], Any]
    ) -> Any:
        """Claim, run ``fn``, commit (rules 3 and 4); the value as a memo hit would give it."""
        self._enter(identity)
        try:
            self._write(CLAIM, identity, position, None)
            self._begin(identity, row)
            try:
                value = fn()
            finally:
                self._current = None
            if inspect.isawaitable(value):
                _discard(value)
                raise StepRefused(
                    f"step {identity!r} returned an awaitable: pass the async function "
                    "itself (async def, not a lambda that calls it) and await ctx.step.run"
                )
            decoded = _decoded(identity, value)
            self._write(COMMIT, identity, position, decoded)
        finally:
            self._leave()
        return decoded

    def _begin(self, identity: str, row: _Recorded | None) -> None:
        """The claim is durable: the body of ``identity`` starts (``attempt`` counts it)."""
        self._current = identity
        self._current_attempt = (row.claims if row else 0) + 1

    # -- compensations (rule 6) -----------------------------------------------------------------

    def _mark(self, identity: str) -> None:
        """Commit ``@compensate:<identity>`` before the step's body first runs."""
        marker = self._marker(identity)
        if marker is None:
            return
        self._enter(marker)
        try:
            self._write(COMMIT, marker, -1, True)
        finally:
            self._leave()

    async def _mark_async(self, identity: str) -> None:
        marker = self._marker(identity)
        if marker is None:
            return
        self._enter(marker)
        try:
            await self._write_async(COMMIT, marker, -1, True)
        finally:
            self._leave()

    def _marker(self, identity: str) -> str | None:
        """The marker step ``identity`` still needs committed, or None."""
        marker = f"{COMPENSATE_PREFIX}{identity}"
        row = self._by_identity.get(marker)
        if row is not None and row.committed:
            return None
        if len(marker.encode()) > STEP_NAME_BYTES_MAX + 1 + STEP_KEY_BYTES_MAX:
            raise StepRefused(f"step {identity!r} is too long to take a compensation")
        self._used.add(marker)
        return marker

    def _register(self, identity: str, compensate: Callable[[Any], Any] | None, value: Any) -> None:
        if compensate is not None:
            self._compensations.append((identity, compensate, value))

    def compensate_all(self) -> int:
        """Compensating mode: run the registered compensations newest first, each as the
        durable step ``@undo:<identity>`` (one committed by an earlier attempt is skipped);
        how many there were. Raises ``CompensationFailed`` at the first that raises."""
        for identity, compensate, value in reversed(self._compensations):
            undo = f"{UNDO_PREFIX}{identity}"
            row = self._by_identity.get(undo)
            if row is not None and row.committed:
                continue
            self._used.add(undo)
            self._execute(undo, -1, row, _undoing(identity, compensate, value))
        return len(self._compensations)

    def sleep(self, duration: Duration, name: str | None = None) -> None:
        """End the attempt; the task comes back ``duration`` after the first commit of this
        sleep (a replay wakes at that same instant, never later each time)."""
        self._sleep(name, sleep_ms=to_ms(duration, field="duration"), wake_at_ms=None)

    def sleep_until(self, instant: datetime | int, name: str | None = None) -> None:
        """End the attempt until ``instant`` (a datetime, or epoch milliseconds)."""
        wake_at_ms = instant if isinstance(instant, int) else int(instant.timestamp() * 1000)
        self._sleep(name, sleep_ms=None, wake_at_ms=wake_at_ms)

    def _sleep(self, name: str | None, *, sleep_ms: int | None, wake_at_ms: int | None) -> None:
        self._reraise()
        identity, position = self._identify(name or "sleep", None)
        row = self._by_identity.get(identity)
        if row is not None and row.committed and row.wake_at_ms is not None:
            if row.wake_at_ms <= self._started_ms:
                return  # slept already: carry on
            sleep_ms, wake_at_ms = None, row.wake_at_ms  # woke early: the first deadline holds
        if self.compensating:
            raise self._latch(Compensate(identity))
        self._enter(identity)  # a sleep inside a step body overlaps that step
        self._leave()
        raise self._latch(Sleep(identity, position, sleep_ms=sleep_ms, wake_at_ms=wake_at_ms))

    def parallel(self, name: str, children: Iterable[Any], *, mode: str = "collect") -> list[Any]:
        """Run ``children`` as tasks and return their results in order (``conveyor.workflows``
        has the rules); the first call ends the attempt until they are all done."""
        self._reraise()
        wire_mode = check_mode(mode)
        identity, position = self._identify(name, None)
        row = self._by_identity.get(identity)
        if row is not None and row.committed:
            return results_of(self._plain(row.value))
        if self.compensating:
            raise self._latch(Compensate(identity))
        bodies = self._sealed_children(child_bodies(children))
        self._enter(identity)  # a fan-out inside a step body overlaps that step
        self._leave()
        raise self._latch(FanOut(identity, position, mode=wire_mode, children=bodies))

    def version(self, name: str) -> bool:
        """A deliberate change of control flow for tasks already under way (the patch
        pattern), checked like a step, at its position among the unkeyed steps:

        - ``True`` where the task reached this point under code that asks (an earlier
          attempt recorded the marker), or reaches it for the first time: the marker is
          recorded now, and this task takes the new branch for good;
        - ``False`` where the task's recorded steps already went on past this point under
          code that did not ask: it takes the old branch, and the marker takes no position,
          so its recorded steps still line up.

            if ctx.version("charge-with-tax"):
                total = ctx.step.run("charge_with_tax", charge_with_tax)
            else:
                total = ctx.step.run("charge", charge)
        """
        self._reraise()
        _check_name(name)
        identity = f"{VERSION_PREFIX}{name}"
        position = len(self._running)
        recorded = self._at.get(position)
        if recorded is not None and recorded.identity == identity:
            self._running.append(identity)
            self._used.add(identity)
            return True
        if position in self._reached:
            return False  # another step was recorded here first: the old branch
        if identity in self._used:
            raise StepRefused(f"ctx.version({name!r}) is asked twice in one attempt")
        if self.compensating:
            raise self._latch(Compensate(identity))
        self._running.append(identity)
        self._used.add(identity)
        self._enter(identity)
        try:
            self._write(COMMIT, identity, position, True)
        finally:
            self._leave()
        return True

    def wait_for_event(self, name: str, *, timeout: Duration | None = None) -> Any:
        """The payload of the first event ``name`` sent to this workflow (one sent before the
        wait counts); the attempt ends while it waits. ``EventTimeout`` after ``timeout``."""
        self._reraise()
        timeout_ms = None if timeout is None else to_ms(timeout, field="timeout")
        identity, position = self._identify(event_step_name(name), None)
        row = self._by_identity.get(identity)
        if row is not None and row.committed:
            return event_of(name, self._plain(row.value))
        if self.compensating:
            raise self._latch(Compensate(identity))
        self._enter(identity)  # a wait inside a step body overlaps that step
        self._leave()
        raise self._latch(WaitEvent(identity, position, name=name, timeout_ms=timeout_ms))

    # -- the rules ------------------------------------------------------------------------------

    def _identify(self, name: str, key: str | None) -> tuple[str, int]:
        """Rule 1, then rule 2 for an unkeyed call. Returns (identity, position or -1)."""
        _check_name(name)
        if name.startswith(VERSION_PREFIX[0]):
            raise StepRefused(f"step names beginning with {VERSION_PREFIX[0]!r} are reserved")
        if key is not None:
            if not isinstance(key, str) or len(key.encode()) > STEP_KEY_BYTES_MAX or "\x00" in key:
                raise StepRefused(
                    f"a step key is a string of at most {STEP_KEY_BYTES_MAX} bytes, without U+0000"
                )
            identity, position = f"{name}:{key}", -1
        else:
            identity = f"{name}#{self._occurrences[name]}"
            self._occurrences[name] += 1
            position = len(self._running)
            self._running.append(identity)
            self._check_position(identity, position)
        if identity in self._used:
            raise StepRefused(
                f"two steps of this attempt derive the identity {identity!r}; give them "
                "different names or keys"
            )
        self._used.add(identity)
        return identity, position

    def _check_position(self, identity: str, position: int) -> None:
        recorded = self._at.get(position)
        if recorded is None or recorded.identity == identity:
            return
        raise self._latch(Divergence(self._divergence_report(identity, position)))

    def _divergence_report(self, identity: str, position: int) -> str:
        recorded = ", ".join(r.identity for _, r in sorted(self._at.items()))
        was = self._at[position].identity
        return (
            f"step sequence changed for task {self._task_id} at position {position}\n"
            f"  recorded: {recorded}\n"
            f"  running:  {', '.join(self._running)}\n"
            f"  step {position} was {was!r}, now {identity!r}\n"
            "A memoized result would answer a different question than the step asking for it.\n"
            "Drain or dead-letter this task type's in-flight tasks before deploying a change "
            "to its\nstep sequence."
        )

    def _enter(self, identity: str) -> None:
        """Steps run one at a time: a second one while one is uncommitted fails the attempt."""
        with self._lock:
            if self._busy:
                raise self._latch(
                    StepsOverlapped(
                        f"step {identity!r} started while step {self._current!r} was "
                        "uncommitted; steps run one at a time: issue them in order"
                    )
                )
            self._busy = True

    def _leave(self) -> None:
        with self._lock:
            self._busy = False

    def _write(self, op: str, identity: str, position: int, value: Any) -> None:
        value = self._sealed(identity, value)
        self._check(identity, self._channel.step(op, identity, position, value))

    async def _write_async(self, op: str, identity: str, position: int, value: Any) -> None:
        """``_write`` on a worker thread: the channel blocks until the write is durable."""
        step = self._channel.step
        value = self._sealed(identity, value)
        self._check(identity, await asyncio.to_thread(step, op, identity, position, value))

    # -- the codec (``conveyor.codecs`` rule 1) -------------------------------------------------

    def _plain(self, value: Any) -> Any:
        """A recorded value as the body sees it: decoded, however deep (a parallel step's
        results are the children's results, each encoded by its own attempt)."""
        return decode_tree(self._codec, value)

    def _sealed(self, identity: str, value: Any) -> Any:
        """A value as it goes to the node: encoded, except a claim's None and the platform's
        own markers (``@compensate:``, ``@version:``), whose value is a constant."""
        if value is None or self._codec is None:
            return value
        if identity.startswith((COMPENSATE_PREFIX, VERSION_PREFIX)):
            return value
        sealed = codecs.encode_value(self._codec, value)
        size = len(json.dumps(sealed, separators=(",", ":")).encode())
        why = over_cap(identity, size, 0, 0)
        if why is not None:  # the cap is on what is stored: the envelope, not the plaintext
            raise StepRefused(f"{why} (as the codec encoded it): store it elsewhere, step a handle")
        return sealed

    def _sealed_children(self, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The children's enqueue bodies with their payloads encoded, in one batch."""
        if self._codec is None:
            return bodies
        payloads = encode_values(self._codec, [b.get("payload") for b in bodies])
        return [{**b, "payload": p} for b, p in zip(bodies, payloads, strict=True)]

    def _check(self, identity: str, ack: StepAck) -> None:
        if ack.ok:
            return
        if ack.lost:
            raise self._latch(ClaimLost(f"step {identity!r}: the lease was lost: {ack.reason}"))
        if ack.transient:
            raise StepUnavailable(f"step {identity!r}: {ack.reason}")
        raise StepRefused(ack.reason or f"step {identity!r} was refused")

    def _latch(self, signal: StepSignal) -> StepSignal:
        if self.signal is None:
            self.signal = signal
        return self.signal

    def _reraise(self) -> None:
        if self.signal is not None:
            raise self.signal

    # -- when the body is done ------------------------------------------------------------------

    def finished(self) -> None:
        """The body returned: warn when it consumed fewer steps than were recorded."""
        if self._at and max(self._at) >= len(self._running):
            recorded = ", ".join(r.identity for _, r in sorted(self._at.items()))
            log.warning(
                "task %s finished with fewer steps than recorded (steps removed from the "
                "end?)\n  recorded: %s\n  running:  %s",
                self._task_id,
                recorded,
                ", ".join(self._running),
            )
