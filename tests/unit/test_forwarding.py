"""The gateway's forwarding (``streams/gateway/forward.py``) between two in-memory nodes, each
serving on 127.0.0.1 and leading one of two partitions; the directory is a fake the test
sets (who owns what, and when that changes)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from conveyor.errors import TransientError
from conveyor.store.memory import MemoryKV
from conveyor.streams.cluster.signing import ClusterSecret
from conveyor.streams.gateway import KeyStore, Registry, build_app, start
from conveyor.streams.gateway.forward import (
    FORWARDED,
    NODE_CALL,
    NODE_TENANT,
    NOT_OWNER,
    SUBMIT_PATH,
    UNFINISHED_PATH,
    ClusterSubmitter,
    Forwarder,
    _call_mac,
    forwarder,
    join_cluster,
)
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.node import Node
from conveyor.streams.registry.catalog import registry_partition
from conveyor.streams.routing import partition_for_key, partition_for_schedule, partition_of

KEY = "key-alpha-0123456789"
TENANT = "alpha"
CALL_KEY = ClusterSecret("unit-cluster-secret-0123").call_key("unit")
FORWARDERS: dict[str, Forwarder] = {}  # by the URL its node serves at


class Directory:
    """Who leads what, as the test says; ``changed`` wakes a sender waiting for news."""

    def __init__(self) -> None:
        self.urls: dict[int, str | None] = {}
        self.waits = 0

    def owner_url(self, partition: int) -> str | None:
        return self.urls.get(partition)

    async def wait_owner_changed(self, partition: int, url: str | None, timeout_s: float) -> None:
        self.waits += 1
        await asyncio.sleep(0.01)

    def nodes(self) -> list[dict[str, Any]]:
        urls = sorted({u for u in self.urls.values() if u})
        return [{"node_id": u, "url": u, "partitions": []} for u in urls]


@contextlib.asynccontextmanager
async def serving(node: Node, directory: Directory) -> AsyncIterator[str]:
    app = build_app(node, KeyStore({KEY: TENANT}), Registry())
    runner, url = await start(app, "127.0.0.1", 0)
    join_cluster(app, directory, url, CALL_KEY)
    FORWARDERS[url] = forwarder(app)
    try:
        yield url
    finally:
        FORWARDERS.pop(url, None)
        await runner.cleanup()


@contextlib.asynccontextmanager
async def two_nodes() -> AsyncIterator[tuple[str, str, Directory, list[Node]]]:
    """Node a leads partition 0, node b partition 1 (each refuses the other's)."""
    directory = Directory()
    log, events = MemoryLog(2), MemoryLog(2)  # one cluster: one log, a store per node
    nodes = [Node(log, events, [MemoryKV(), MemoryKV()]) for _ in range(2)]
    for i, node in enumerate(nodes):
        node.node_id = "ab"[i]
        await node.start()
        await node.stop_partition(1 - i, TransientError("not led here", retry_after_ms=500))
    await nodes[0].start_partition(0)  # b's start announced a newer epoch of 0: lead it again
    async with serving(nodes[0], directory) as a, serving(nodes[1], directory) as b:
        directory.urls = {0: a, 1: b}
        registered = [(await post(url, "/worker/register", REGISTER))[0] for url in (a, b)]
        assert 200 in registered and set(registered) <= {200, 503}, registered
        try:
            yield a, b, directory, nodes
        finally:
            for node in nodes:
                await node.stop()


REGISTER = {"agent_id": "t", "app": "app", "version": "1", "task_types": ["echo"]}


def key_on(partition: int, skip: int = 0) -> str:
    keys = (f"k{i}" for i in range(1000))
    found = [k for k in keys if partition_for_key(TENANT, k, 2) == partition]
    return found[skip]


def task(key: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"task_type": "echo", "app": "app", "payload": {"k": key}}
    if key is not None:
        body["idempotency_key"] = key
    return body


async def request(
    method: str, url: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any, dict[str, str]]:
    sent = {"Authorization": f"Bearer {KEY}", **(headers or {})}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, url + path, json=body, headers=sent) as reply,
    ):
        return reply.status, json.loads(await reply.read()), dict(reply.headers)


async def post(url: str, path: str, body: Any) -> tuple[int, Any]:
    status, got, _ = await request("POST", url, path, body)
    return status, got


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_keyed_enqueue_and_its_reads_reach_the_owner_through_either_node() -> None:
    async def main() -> None:
        async with two_nodes() as (a, _, _, nodes):
            status, created = await post(a, "/v1/tasks", task(key_on(1)))
            assert status == 201, created
            task_id = created["task_id"]
            assert partition_of(task_id, 2) == 1
            assert nodes[1].get(TENANT, task_id).task_id == task_id  # it is b's
            status, read, _ = await request("GET", a, f"/v1/tasks/{task_id}")
            assert status == 200 and read["task_id"] == task_id
            status, again = await post(a, "/v1/tasks", task(key_on(1)))
            assert status == 200 and again["task_id"] == task_id and not again["created"]

    run(main())


def test_a_batch_is_split_per_owner_and_the_replies_come_in_order() -> None:
    async def main() -> None:
        async with two_nodes() as (a, _, _, nodes):
            keys = [key_on(1), key_on(0), None, key_on(1, skip=1)]
            status, reply = await post(a, "/v1/tasks:batch", {"tasks": [task(k) for k in keys]})
            assert status == 201, reply
            ids = [r["task_id"] for r in reply["results"]]
            assert [partition_of(t, 2) for t in ids] == [1, 0, 0, 1]  # unkeyed: led here
            for t in ids:
                assert nodes[partition_of(t, 2)].get(TENANT, t).task_id == t

    run(main())


def test_a_bad_item_refuses_a_split_batch_before_any_part_is_sent() -> None:
    async def main() -> None:
        async with two_nodes() as (a, b, _, _):
            items = [task(key_on(1)), {**task(key_on(0)), "priority": "high"}]
            status, reply = await post(a, "/v1/tasks:batch", {"tasks": items})
            assert status == 400 and reply["error"]["field"].startswith("tasks[1]"), reply
            status, _ = await post(b, "/v1/tasks", task(key_on(1)))
            assert status == 201  # created now: the good item never reached b

    run(main())


def test_a_forwarded_request_is_never_forwarded_again() -> None:
    async def main() -> None:
        async with two_nodes() as (a, _, _, _):
            status, body, headers = await request(
                "POST", a, "/v1/tasks", task(key_on(1)), headers={FORWARDED: "x"}
            )
            assert status == 503 and headers[NOT_OWNER] == "1" and "Retry-After" in headers
            assert body["error"]["code"] == "unavailable"

    run(main())


def test_a_stale_owner_makes_the_sender_wait_for_the_directory_and_send_once_more() -> None:
    async def main() -> None:
        async with two_nodes() as (a, b, directory, _):
            directory.urls[0] = b  # the directory says b leads 0: b refuses, one hop only
            status, _, headers = await request("POST", a, "/v1/tasks", task(key_on(0)))
            assert status == 201  # a leads it: served here, the directory is not asked
            directory.urls[1] = a  # a believes a leads 1, which it does not: no owner known
            status, body, headers = await request("POST", a, "/v1/tasks", task(key_on(1)))
            assert status == 503 and "Retry-After" in headers, body
            directory.urls[1] = "http://127.0.0.1:9"  # nothing listens there: refused, twice
            status, body, _ = await request("POST", a, "/v1/tasks", task(key_on(1)))
            assert status == 503 and "cannot be reached" in body["error"]["message"]
            assert directory.waits == 1

    run(main())


def test_worker_reports_of_another_nodes_partition_are_answered_by_its_owner() -> None:
    async def main() -> None:
        async with two_nodes() as (a, b, _, _):
            status, created = await post(b, "/v1/tasks", task(key_on(1)))
            assert status == 201
            poll = {"agent_id": "t", "app": "app", "queues": [], "capacity": 1, "wait_ms": 5000}
            status, got = await post(b, "/worker/poll", {**poll, "lease_ms": 30_000})
            (lease,) = got["leases"]
            ref = {"task_id": created["task_id"], "lease_id": lease["lease_id"]}
            status, reply = await post(a, "/worker/heartbeat", {"leases": [ref]})
            assert status == 200 and reply["actions"][0]["action"] == "CONTINUE", reply
            done = {**ref, "outcome": "SUCCEEDED", "result": {"ok": 1}}
            status, reply = await post(a, "/worker/complete", {"completions": [done]})
            assert status == 200 and reply["results"][0]["ok"], reply
            status, read, _ = await request("GET", a, f"/v1/tasks/{created['task_id']}")
            assert read["status"] == "SUCCEEDED" and read["result"] == {"ok": 1}

    run(main())


async def failed_task(via: str, owner: str, partition: int) -> str:
    """A task of ``partition`` enqueued through ``via``, leased from its ``owner`` and failed
    for good (one attempt allowed): a dead letter a retry applies to."""
    body = {**task(key_on(partition, skip=2)), "retry": {"attempts_max": 1}}
    status, created = await post(via, "/v1/tasks", body)
    assert status == 201, created
    poll = {"agent_id": "t", "app": "app", "queues": [], "capacity": 1, "wait_ms": 5000}
    status, got = await post(owner, "/worker/poll", {**poll, "lease_ms": 30_000})
    (lease,) = got["leases"]
    error = {"class": "Boom", "message": "failed on purpose"}
    done = {"task_id": created["task_id"], "lease_id": lease["lease_id"], "outcome": "FAILED"}
    status, reply = await post(
        owner, "/worker/complete", {"completions": [{**done, "error": error}]}
    )
    assert status == 200 and reply["results"][0]["ok"], reply
    return str(created["task_id"])


def test_a_retry_of_listed_tasks_is_split_per_owner_and_answered_in_the_order_asked() -> None:
    async def main() -> None:
        async with two_nodes() as (a, b, _, nodes):
            on_b, on_a = await failed_task(a, b, 1), await failed_task(a, a, 0)
            asked = [on_b, on_a, on_b]
            status, reply = await post(a, "/v1/tasks:retry", {"task_ids": asked})
            assert status == 200, reply
            assert [r["task_id"] for r in reply["retried"]] == [on_b, on_a]
            for r in reply["retried"]:  # each new task is on the partition of the old one
                p = partition_of(r["task_id"], 2)
                assert partition_of(r["new_task_id"], 2) == p
                assert nodes[p].get(TENANT, r["new_task_id"]).status.value == "ENQUEUED"
            status, again = await post(b, "/v1/tasks:retry", {"task_ids": [on_a]})
            assert status == 200 and again["retried"] == [], again  # retried once only

    run(main())


def test_a_bad_retry_is_refused_before_any_part_is_sent() -> None:
    async def main() -> None:
        async with two_nodes() as (a, b, _, _):
            on_b = await failed_task(a, b, 1)
            status, reply = await post(a, "/v1/tasks:retry", {"task_ids": [on_b, "nope"]})
            assert status == 400 and reply["error"]["field"] == "task_ids[1]", reply
            status, reply = await post(a, "/v1/tasks:retry", {"task_ids": [on_b]})
            assert [r["task_id"] for r in reply["retried"]] == [on_b]  # not retried before

    run(main())


def test_a_registration_goes_to_the_leader_of_the_tenants_registry_partition() -> None:
    async def main() -> None:
        async with two_nodes() as (a, b, directory, _):
            p = registry_partition(TENANT, 2)
            other = b if p == 0 else a  # the node that does not lead it
            body = {**REGISTER, "task_types": ["echo", "other"]}
            status, reply = await post(other, "/worker/register", body)
            assert status == 200, reply
            status, created = await post(a, "/v1/tasks", {**task(None), "task_type": "other"})
            assert status == 201, created
            # Sent to the owner the directory names, not appended here: with the owner out
            # of reach the registration is refused, and the catalog did not change.
            directory.urls[p] = "http://127.0.0.1:9"
            status, reply = await post(other, "/worker/register", {**body, "task_types": ["x"]})
            assert status == 503 and "cannot be reached" in reply["error"]["message"], reply
            status, created = await post(a, "/v1/tasks", {**task(None), "task_type": "x"})
            assert status == 400 and created["error"]["code"] == "unknown_task_type", created

    run(main())


def test_the_list_of_schedules_gathers_every_owners_part_once() -> None:
    async def main() -> None:
        async with two_nodes() as (a, b, directory, _):
            ids = [f"s{i}" for i in range(12)]
            assert {partition_for_schedule(TENANT, s, 2) for s in ids} == {0, 1}
            for s in ids:
                body = {"schedule_id": s, "cron": "0 0 1 1 *", "task": task(None)}
                status, reply = await post(a, "/v1/schedules", body)
                assert status == 201, reply
            for via in (a, b):
                status, listed, _ = await request("GET", via, "/v1/schedules")
                assert status == 200, listed
                assert [r["schedule_id"] for r in listed["schedules"]] == sorted(ids)
            directory.urls[1] = None  # nobody leads 1 now: no list short of its schedules
            status, listed, headers = await request("GET", a, "/v1/schedules")
            assert status == 503 and "Retry-After" in headers, listed

    run(main())


def test_a_deploys_warning_counts_the_unfinished_tasks_of_every_owner() -> None:
    async def main() -> None:
        async with two_nodes() as (a, b, directory, _):
            p = registry_partition(TENANT, 2)
            for partition, n in ((0, 3), (1, 2)):  # 3 on a's partition, 2 on b's
                for i in range(n):
                    status, created = await post(a, "/v1/tasks", task(key_on(partition, i)))
                    assert status == 201, created

            async def deploy(via: str, deploy: int, types: list[str]) -> list[str]:
                body = {**REGISTER, "task_types": types, "deploy": deploy}
                status, reply = await post(via, "/worker/register", body)
                assert status == 200, reply
                return list(reply["warnings"])

            assert await deploy(a, 1, ["echo", "other"]) == []
            for via, number in ((a, 2), (b, 4)):  # each node, the owner of p or not
                (warning,) = await deploy(via, number, ["other"])
                assert "task type 'echo', referenced by 5 unfinished task(s): " in warning
                assert await deploy(via, number + 1, ["echo", "other"]) == []
            directory.urls[1 - p] = None  # nobody leads the other partition now: said so
            (warning,) = await deploy(a, 6, ["other"])
            counted = 3 if p == 0 else 2
            assert (
                f"referenced by {counted} unfinished task(s) on the partitions counted "
                f"(partition(s) {1 - p} have no leader now" in warning
            ), warning
            status, reply = await post(b, UNFINISHED_PATH, {"app": "app", "task_types": []})
            assert status == 403, reply  # a user's key does not open the count

    run(main())


def test_a_bulk_operations_batch_goes_to_the_owner_of_each_id() -> None:
    async def main() -> None:
        async with two_nodes() as (a, b, _, nodes):
            on_b, on_a = await failed_task(a, b, 1), await failed_task(a, a, 0)
            replies = await ClusterSubmitter(FORWARDERS[a]).retry_failed(TENANT, [on_b, on_a])
            created = sorted(r.task_id for r in replies if r.created)
            assert len(created) == 2, replies  # each old task made its new one, on its owner
            assert {partition_of(t, 2) for t in created} == {0, 1}
            for t in created:
                assert nodes[partition_of(t, 2)].get(TENANT, t).status.value == "ENQUEUED"
            canceled = await ClusterSubmitter(FORWARDERS[b]).cancel_many(TENANT, created, "x")
            assert sorted(r.status.value for r in canceled if r.status) == ["CANCELED"] * 2

    run(main())


def test_a_call_between_nodes_that_does_not_check_is_refused() -> None:
    async def main() -> None:
        async with two_nodes() as (a, b, _, _):
            on_b = await failed_task(a, b, 1)
            body = json.dumps({"kind": "retry", "task_ids": [on_b]}).encode()
            now = str(int(time.time() * 1000))

            async def call(ts: str, key: bytes, tenant: str = TENANT) -> int:
                mac = _call_mac(key, ts, "POST", SUBMIT_PATH, TENANT, body)
                headers = {NODE_CALL: f"{ts}.{mac}", NODE_TENANT: tenant}
                headers["Content-Type"] = "application/json"
                async with (
                    aiohttp.ClientSession() as http,
                    http.post(b + SUBMIT_PATH, data=body, headers=headers) as reply,
                ):
                    return reply.status

            other = ClusterSecret("another-cluster-secret-0").call_key("unit")
            assert await call(now, other) == 401  # another secret
            assert await call(str(int(now) - 60_000), CALL_KEY) == 401  # a minute old
            assert await call(now, CALL_KEY, tenant="beta") == 401  # signed for another tenant
            status, reply = await post(b, SUBMIT_PATH, {"kind": "retry", "task_ids": [on_b]})
            assert status == 403, reply  # a user's key does not open it
            status, reply = await post(a, "/v1/tasks:retry", {"task_ids": [on_b]})
            assert [r["task_id"] for r in reply["retried"]] == [on_b]  # nothing was retried
            assert await call(now, CALL_KEY) == 200  # the same call, signed by the cluster

    run(main())
