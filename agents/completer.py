"""Completions, batched: collected for a few ms, then ONE call for all of them.

Rule: a task's checkpoint goes out before its completion, and every checkpoint send holds
``checkpoint_lock``, so sends never overtake each other and the newest value is the one the
next attempt sees. A completion the platform calls stale is dropped (it already moved on); a
batch it refuses is split so one bad report cannot strand the others' leases.
"""

from __future__ import annotations

import asyncio
import logging

from conveyor.agents.worker_api import CheckpointItem, CompletionItem, ItemResult, WorkerAPI
from conveyor.errors import ContractError, ConveyorError
from conveyor.schemas.limits import WORKER_ITEMS_MAX

log = logging.getLogger("conveyor.agent")

RETRY_PAUSE_S = 1.0
TRIES_MAX = 5


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
        self._queue: asyncio.Queue[tuple[CompletionItem, CheckpointItem | None]] = asyncio.Queue()

    async def put(self, item: CompletionItem, checkpoint: CheckpointItem | None) -> None:
        self.unacked += 1
        self.unreported[item.task_id] = item.lease_id
        await self._queue.put((item, checkpoint))

    async def flushed(self) -> None:
        await self._queue.join()

    async def run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            await asyncio.sleep(self.window_ms / 1000)  # let a batch gather
            while not self._queue.empty() and len(batch) < WORKER_ITEMS_MAX:
                batch.append(self._queue.get_nowait())
            try:
                await self._send(batch)
            finally:
                self.unacked -= len(batch)
                for item, _ in batch:
                    if self.unreported.get(item.task_id) == item.lease_id:
                        del self.unreported[item.task_id]
                    self._queue.task_done()

    async def _send(self, batch: list[tuple[CompletionItem, CheckpointItem | None]]) -> None:
        checkpoints = [cp for _, cp in batch if cp is not None]
        if checkpoints:
            try:
                async with self.checkpoint_lock:
                    await self.api.checkpoint(checkpoints)
            except ConveyorError as exc:  # the attempts still end; only the cursor is older
                log.warning("saving %d checkpoints failed: %s", len(checkpoints), exc)
        await self._complete([item for item, _ in batch])

    async def _complete(self, items: list[CompletionItem]) -> None:
        for attempt in range(TRIES_MAX):
            try:
                results = await self.api.complete(items)
                break
            except ContractError as exc:
                await self._complete_one_by_one(items, exc)
                return
            except ConveyorError as exc:
                log.warning("completing %d attempts failed (%s); try %d", len(items), exc, attempt)
                await asyncio.sleep(RETRY_PAUSE_S * 2**attempt)
        else:
            log.error("gave up completing %d attempts; their leases will lapse", len(items))
            return
        self._count(results)

    async def _complete_one_by_one(self, items: list[CompletionItem], exc: ContractError) -> None:
        """The platform refused a batch (say, a result too large): isolate the culprit, and
        report it as a failed attempt rather than leave its lease to lapse."""
        if len(items) > 1:
            for item in items:
                await self._complete([item])
            return
        item = items[0]
        if item.error_class == "CompletionRejected":
            log.error("completion of %s rejected: %s", item.task_id, exc)
            return
        log.warning("completion of %s rejected (%s); reporting a failed attempt", item.task_id, exc)
        rejected = CompletionItem(
            task_id=item.task_id,
            lease_id=item.lease_id,
            outcome="FAILED",
            error_class="CompletionRejected",
            error_message=f"the platform rejected the attempt's report: {exc}"[:4000],
            log_ref=item.log_ref,
        )
        await self._complete([rejected])

    def _count(self, results: list[ItemResult]) -> None:
        for r in results:
            if r.ok:
                self.completed += 1
            else:
                self.dropped += 1
                log.info("completion of %s dropped: %s", r.task_id, r.reason)
