"""A bench of the ingest router: records/s from an ingest topic to acknowledged enqueues.

    python -m conveyor_devtools.bench.ingest [--records 20000] [--json]
    conveyor bench ingest [--records N] [--json]

It starts one local Kafka broker (``conveyor.streams.log.kafka_broker``) and ``conveyor node
--no-projection`` on fresh directories and a free port of 127.0.0.1, registers a task type
whose payload is an Avro record of three fields (``/worker/register`` with its schema), and
produces ``--records`` records in Confluent's wire format to a 4-partition ingest topic,
unkeyed (the router keys them by their coordinates) and with the type's headers. Then a router
in this process routes them, and the run times it from its start until every record is enqueued:
``records_per_s`` once its first batch is in (``seconds`` counts from its start, joining the
consumer group included), and the router's CPU per record (this process: the consumer, the Avro
decode and the HTTP batches). No agent runs: the tasks stay enqueued. The broker and the
node are stopped (by their PIDs) at the end. Figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiokafka import AIOKafkaProducer

from conveyor.streams.ingest import topics, wire
from conveyor.streams.ingest.router import (
    APP_HEADER,
    BATCH_MAX,
    IN_FLIGHT_MAX,
    TYPE_HEADER,
    Router,
    Settings,
)
from conveyor.streams.log.kafka_broker import KafkaCluster

CLIENT = "cvk_bench-ingest-client-0123456789"
AGENT = "cvk_bench-ingest-agent-0123456789"
APP, TASK_TYPE = "bench", "signup"
SCHEMA = {
    "type": "record",
    "name": "Signup",
    "fields": [
        {"name": "email", "type": "string"},
        {"name": "seats", "type": "long"},
        {"name": "plan", "type": "string", "default": "free"},
    ],
}
PARTITIONS = 4
START_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 600.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_node(home: Path, port: int) -> subprocess.Popen[bytes]:
    home.mkdir(parents=True)
    keys = {
        CLIENT: {"tenant": "bench", "role": "client"},
        AGENT: {"tenant": "bench", "role": "agent", "app": APP},
    }
    (home / "keys.json").write_text(json.dumps({"keys": keys}))
    cmd = [sys.executable, "-m", "conveyor.cli", "node", "--home", str(home), "--port", str(port)]
    cmd += ["--no-projection", "--partitions", str(PARTITIONS)]
    out = open(home.parent / "node.out", "wb")  # noqa: SIM115
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


async def _register(base: str) -> int:
    """Register the type with its payload schema; the schema's id."""
    deadline = time.monotonic() + START_TIMEOUT_S
    headers = {"Authorization": f"Bearer {AGENT}"}
    body = {
        "agent_id": "bench",
        "app": APP,
        "task_types": [TASK_TYPE],
        "definitions": [{"task_type": TASK_TYPE, "payload_schema": SCHEMA}],
    }
    async with aiohttp.ClientSession(headers=headers) as session:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.post(base + "/worker/register", json=body) as reply:
                    if reply.status == 200:
                        break
            await asyncio.sleep(0.1)  # the node is starting: nothing to wait on but its port
        else:
            raise RuntimeError("the node did not take the registration")
        subject = f"{base}/registry/subjects/{APP}.{TASK_TYPE}-value/versions/latest"
        async with session.get(subject, headers={"Authorization": f"Bearer {CLIENT}"}) as reply:
            return int((await reply.json())["id"])


async def _produce(bootstrap: str, topic: str, schema_id: int, n: int) -> None:
    await topics.ensure(bootstrap, [topic], PARTITIONS)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    text = json.dumps(SCHEMA)
    headers = [(APP_HEADER, APP.encode()), (TYPE_HEADER, TASK_TYPE.encode())]
    try:
        sent = []
        for i in range(n):
            datum = wire.encode(text, {"email": f"u{i}@example.com", "seats": i, "plan": "pro"})
            value = wire.frame(schema_id, datum)
            sent.append(
                await producer.send(topic, value, partition=i % PARTITIONS, headers=headers)
            )
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def _route(
    bootstrap: str, base: str, topic: str, n: int, batch: int, in_flight: int
) -> dict[str, Any]:
    settings = Settings(
        bootstrap=bootstrap,
        url=base,
        key=CLIENT,
        topic=topic,
        batch_max=batch,
        in_flight_max=in_flight,
    )
    router = Router(settings)
    started, started_cpu = time.perf_counter(), time.process_time()
    await router.start()
    runner = asyncio.create_task(router.run())
    deadline = time.monotonic() + RUN_TIMEOUT_S

    async def until(count: int) -> None:
        while router.enqueued + router.quarantined < count:
            if runner.done() or time.monotonic() > deadline:
                runner.result()  # its failure, if it failed
                raise RuntimeError(f"routed {router.enqueued} of {n} in {RUN_TIMEOUT_S}s")
            await asyncio.sleep(0.005)  # the router is working: poll its counters

    try:
        await until(1)  # joined its group, read and enqueued a first batch
        first, first_at, first_cpu = router.enqueued, time.perf_counter(), time.process_time()
        await until(n)
        took = time.perf_counter() - started
        after = n - first  # none when the first batch held every record
        steady = time.perf_counter() - first_at if after else took
        used = time.process_time() - (first_cpu if after else started_cpu)
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
        await router.stop()
    return {
        "records": n,
        "batch": batch,
        "in_flight": in_flight,
        "enqueued": router.enqueued,
        "quarantined": router.quarantined,
        "seconds": round(took, 3),  # from the router's start: joining its group included
        "records_per_s": round((after or n) / steady),  # after its first batch
        "router_cpu_us_per_record": round(used / (after or n) * 1e6, 1),
    }


async def _run(root: Path, n: int, batch: int, in_flight: int) -> dict[str, Any]:
    cluster = KafkaCluster.start(1, root / "kafka")
    port = _free_port()
    node = _start_node(root / "home", port)
    base = f"http://127.0.0.1:{port}"
    try:
        schema_id = await _register(base)
        await _produce(cluster.bootstrap, "bench-ingest", schema_id, n)
        return await _route(cluster.bootstrap, base, "bench-ingest", n, batch, in_flight)
    finally:
        node.terminate()
        try:
            node.wait(30)
        except subprocess.TimeoutExpired:
            node.kill()
            node.wait()
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=BATCH_MAX)
    parser.add_argument("--in-flight", type=int, default=IN_FLIGHT_MAX)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--home", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-ingest-") as tmp:
        root = args.home or Path(tmp)
        report = asyncio.run(_run(root, args.records, args.batch, args.in_flight))
    if args.json:
        print(json.dumps(report))
    else:
        for name, value in report.items():
            print(f"{name:>26}  {value}")
    return 0 if report["enqueued"] == args.records else 1


if __name__ == "__main__":
    raise SystemExit(main())
