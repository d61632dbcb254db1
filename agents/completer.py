"""Completions, batched: collected for a few ms, then ONE call for all of them.

Rule: a task's checkpoint goes out before its completion, and every checkpoint send holds
``checkpoint_lock``, so sends never overtake each other and the newest value is the one the
next attempt sees. A completion the platform calls stale is dropped (it already moved on); a
batch it refuses, or fails again and again with an error of its own, is split so one bad report
cannot strand the others' leases. One it cannot
take for now (``retry_after_ms``: say, its partition halted) goes back in line after that
pause, with its checkpoint, while later batches go on; its lease is heartbeated meanwhile.
"""

from __future__ import annotations

import asyncio
import logging

from conveyor.agents.worker_api import CheckpointItem, CompletionItem, ItemResult, WorkerAPI
from conveyor.errors import ContractError, ConveyorError, TransientError
from conveyor.schemas.limits import WORKER_ITEMS_MAX

log = logging.getLogger("conveyor.agent")

RETRY_PAUSE_S = 1.0  # after a call that failed as a whole, doubling
RETRY_PAUSE_MAX_S = 15.0
TRIES_MAX = 5  # for a call the node answered with an error of its own (a 500): then give up


class Completer:
    def __init__(self, api: WorkerAPI, *, window_ms: float = 5.0) -> None:
        self.api = api
        self.window_ms = window_ms
        self.checkpoint_lock = asyncio.Lock()
        self.completed = 0  # completions the platform accepted
        self.dropped = 0  # completions rejected as stale
        self.unacked = 0  # completions queued or being sent
        # Their leases, by task id: the agent heartbeats them until the report is through.
        self.unreported: dict[str, int] = {}
        self._queue: asyncio.Queue[_Entry] = asyncio.Queue()
        self._later: set[asyncio.Task[None]] = set()  # entries waiting to go back in line

    async def put(self, item: CompletionItem, checkpoint: CheckpointItem | None) -> None:
        self.unacked += 1
        self.unreported[item.task_id] = item.lease_id
        await self._queue.put((item, checkpoint))

    async def flushed(self) -> None:
        while True:
            await self._queue.join()
            if not self._later:
                return
            await asyncio.wait(set(self._later))  # they go back in line, then join again

    async def run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            await asyncio.sleep(self.window_ms / 1000)  # let a batch gather
            while not self._queue.empty() and len(batch) < WORKER_ITEMS_MAX:
                batch.append(self._queue.get_nowait())
            again: dict[str, int] = {}  # task id -> pause, for the items to send again
            try:
                again = await self._send(batch)
            finally:
                later = [entry for entry in batch if entry[0].task_id in again]
                if later:
                    self._send_later(later, max(again.values()))
                self.unacked -= len(batch) - len(later)
                for item, _ in batch:
                    sent = item.task_id not in again
                    if sent and self.unreported.get(item.task_id) == item.lease_id:
                        del self.unreported[item.task_id]
                    self._queue.task_done()

    def _send_later(self, entries: list[_Entry], pause_ms: int) -> None:
        async def back_in_line() -> None:
            await asyncio.sleep(pause_ms / 1000)
            for entry in entries:
                self._queue.put_nowait(entry)

        log.info("%d completions refused for now; sending again in %d ms", len(entries), pause_ms)
        task = asyncio.create_task(back_in_line())
        self._later.add(task)  # the loop holds tasks weakly
        task.add_done_callback(self._later.discard)

    async def _send(self, batch: list[_Entry]) -> dict[str, int]:
        """Send ``batch``; the task ids to send again, with their pauses."""
        checkpoints = [cp for _, cp in batch if cp is not None]
        if checkpoints:
            try:
                async with self.checkpoint_lock:
                    await self.api.checkpoint(checkpoints)
            except ConveyorError as exc:  # the attempts still end; only the cursor is older
                log.warning("saving %d checkpoints failed: %s", len(checkpoints), exc)
        return await self._complete([item for item, _ in batch])

    async def _complete(self, items: list[CompletionItem]) -> dict[str, int]:
        """A call the node could not take (unreachable, restarting: ``TransientError``) is
        sent again until it answers: the work is done and its leases are heartbeated meanwhile
        (a new leader gives them a fresh interval), so giving up would only run the tasks
        again. Nothing new arrives while the node is unreachable, so what waits here is
        bounded by the leases already held. A call it fails with an error of its own is given
        up after ``TRIES_MAX`` tries, so it cannot hold back every later report; a batch is
        halved first (``_halves``)."""
        answer = await self._call(items, TRIES_MAX)
        if isinstance(answer, ConveyorError):
            return await self._halves(items, answer)
        return answer

    async def _call(
        self, items: list[CompletionItem], tries_max: int
    ) -> dict[str, int] | ConveyorError:
        """``_complete``'s tries: the task ids to send again, or the node's own error once
        ``tries_max`` calls have failed with one."""
        pause_s, tries = RETRY_PAUSE_S, 0
        while True:
            try:
                results = await self.api.complete(items)
                break
            except ContractError as exc:
                return await self._complete_one_by_one(items, exc)
            except ConveyorError as exc:
                tries += not isinstance(exc, TransientError)
                if tries >= tries_max:
                    return exc
                log.warning(
                    "completing %d attempts failed (%s); again in %.0f s", len(items), exc, pause_s
                )
                await asyncio.sleep(pause_s)
                pause_s = min(2 * pause_s, RETRY_PAUSE_MAX_S)
        return self._count(results)

    async def _halves(self, items: list[CompletionItem], exc: ConveyorError) -> dict[str, int]:
        """The node failed ``items`` with an error of its own: one report in them may be what
        trips it. Each half is tried once; a half that fails alone is halved again, so the
        other reports go through and only the culprit is given up (its task runs again when its
        lease lapses), in about 2 log2(n) more calls, none of them paused. When both halves
        fail, the error is not one report's doing: they are given up, after two calls."""
        if len(items) == 1:
            log.error("gave up completing %s: %s", items[0].task_id, exc)
            return {}
        middle = len(items) // 2
        halves = items[:middle], items[middle:]
        answers = [await self._call(half, 1) for half in halves]
        if all(isinstance(answer, ConveyorError) for answer in answers):
            log.error("gave up completing %d attempts: %s", len(items), answers[-1])
            return {}
        again: dict[str, int] = {}
        for half, answer in zip(halves, answers, strict=True):
            if isinstance(answer, ConveyorError):
                log.warning("completing %d attempts failed (%s): halving", len(half), answer)
                answer = await self._halves(half, answer)
            again.update(answer)
        return again

    async def _complete_one_by_one(
        self, items: list[CompletionItem], exc: ContractError
    ) -> dict[str, int]:
        """The platform refused a batch (say, a result too large): isolate the culprit, and
        report it as a failed attempt rather than leave its lease to lapse."""
        if len(items) > 1:
            again: dict[str, int] = {}
            for item in items:
                again.update(await self._complete([item]))
            return again
        item = items[0]
        if item.error_class == "CompletionRejected":
            log.error("completion of %s rejected: %s", item.task_id, exc)
            return {}
        log.warning("completion of %s rejected (%s); reporting a failed attempt", item.task_id, exc)
        rejected = CompletionItem(
            task_id=item.task_id,
            lease_id=item.lease_id,
            outcome="FAILED",
            error_class="CompletionRejected",
            error_message=f"the platform rejected the attempt's report: {exc}"[:4000],
            log_ref=item.log_ref,
        )
        return await self._complete([rejected])

    def _count(self, results: list[ItemResult]) -> dict[str, int]:
        again: dict[str, int] = {}
        for r in results:
            if r.ok:
                self.completed += 1
            elif r.retry_after_ms is not None:
                again[r.task_id] = r.retry_after_ms
            else:
                self.dropped += 1
                log.info("completion of %s dropped: %s", r.task_id, r.reason)
        return again


_Entry = tuple[CompletionItem, CheckpointItem | None]
