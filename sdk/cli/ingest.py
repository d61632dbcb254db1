"""``conveyor ingest``: the router of an ingest topic (``streams/ingest/router.py``). Its
bench, ``conveyor bench ingest``, is in the checkout's devtools (``conveyor_devtools.bench``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import socket
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from conveyor.cli import exits, redact
from conveyor.cli.common import DEFAULT_URL, HomeOpt, KeyOpt, Remote, UrlOpt, fail

if TYPE_CHECKING:
    from aiohttp import web

    from conveyor.cli.serve import KafkaConfig
    from conveyor.streams.ingest.router import Router

KafkaOpt = Annotated[
    str, typer.Option("--kafka", envvar="CONVEYOR_KAFKA", help="Bootstrap servers of the Kafka")
]


def ingest(
    kafka: KafkaOpt,
    topic: Annotated[
        str, typer.Option("--topic", help="The ingest topic: one per tenant, the key's tenant")
    ],
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    quarantine_topic: Annotated[
        str,
        typer.Option(
            "--quarantine-topic", help="Where refused records go (default: <topic>-quarantine)"
        ),
    ] = "",
    group: Annotated[
        str,
        typer.Option(
            "--group", help="The routers' consumer group (default: conveyor-ingest-<topic>)"
        ),
    ] = "",
    instance: Annotated[
        str,
        typer.Option(
            "--instance",
            help="This router's name in its group, stable across its restarts (its "
            "transactional id; default: the host name)",
        ),
    ] = "",
    partitions: Annotated[
        int, typer.Option("--partitions", min=1, help="Partitions of a topic it creates")
    ] = 4,
    batch: Annotated[
        int,
        typer.Option(
            "--batch", min=1, max=1_000, help="Records per enqueue (the node takes up to 1,000)"
        ),
    ] = 1_000,
    log_level: Annotated[str, typer.Option("--log-level", help="Log level")] = "warning",
) -> None:
    """Route an ingest topic's records (Avro in Confluent's wire format) to enqueues, exactly
    once per record; what cannot be enqueued goes to the quarantine topic with its reason."""
    from conveyor.streams.ingest.node_api import KeyRefused
    from conveyor.streams.ingest.router import Router, Settings

    logging.basicConfig(
        level=log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    redact.guard()
    remote = Remote.of(url, api_key, home)
    settings = Settings(
        bootstrap=kafka,
        url=remote.url,
        key=remote.api_key,
        topic=topic,
        quarantine_topic=quarantine_topic,
        group=group,
        instance=instance or socket.gethostname(),
        partitions=partitions,
        batch_max=batch,
    )
    try:
        asyncio.run(_route(Router(settings)))
    except KeyRefused as exc:
        raise fail(str(exc), exits.REFUSED) from None


async def _route(router: Router) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await router.start()
    s = router.settings
    print(f"routing {s.topic} -> {s.url} (quarantine: {s.quarantine})", flush=True)
    try:
        runner = asyncio.create_task(router.run())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({runner, stopped}, return_when=asyncio.FIRST_COMPLETED)
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner  # a failed run raises here
    finally:
        await router.stop()


# -- the node's option: the public task events topics (streams/sinks/task_events.py) --------

TaskEventsOpt = Annotated[
    bool,
    typer.Option(
        "--task-events",
        help="With --kafka: relay the task events to <cluster>-task-events.<tenant>, Avro "
        "under the subject <topic>-value of the tenant's registry",
    ),
]


def with_task_events(kafka: KafkaConfig | None, task_events: bool) -> KafkaConfig | None:
    if not task_events:
        return kafka
    if kafka is None:
        raise fail("--task-events relays the events of a cluster on Kafka: give --kafka too")
    return dataclasses.replace(kafka, task_events=True)


def attach_task_events(app: web.Application, bootstrap: str, cluster: str, partitions: int) -> None:
    from conveyor.streams.sinks.task_events import attach

    attach(app, bootstrap, cluster, partitions)


def register(app: typer.Typer) -> None:
    app.command()(ingest)
