"""A client generated from the document works: openapi-python-client writes a package from the
``/openapi.json`` a real node serves, and the test enqueues a task and reads it back with it.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_gateway import KEY_A, NodeProcess, call

pytestmark = pytest.mark.timeout(240)
GENERATOR = shutil.which("openapi-python-client", path=str(Path(sys.executable).parent))


@pytest.fixture(scope="module")
def client_package(node: NodeProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if GENERATOR is None:
        pytest.fail("openapi-python-client is not installed (pip install -e '.[dev]')")
    status, doc = call(node.base, "GET", "/openapi.json", key=None)
    assert status == 200
    root = tmp_path_factory.mktemp("generated")
    spec = root / "openapi.json"
    spec.write_text(__import__("json").dumps(doc))
    out = root / "conveyor_gateway_client"
    config = root / "config.yaml"
    config.write_text("literal_enums: true\n")  # zone names (GMT+0, GMT0) share a Python name
    args = ["--path", str(spec), "--meta", "none", "--output-path", str(out)]
    run = subprocess.run(
        [GENERATOR, "generate", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=root,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Unable to parse" not in run.stdout + run.stderr, run.stdout + run.stderr
    return root


def test_a_generated_client_enqueues_and_reads_a_task(
    node: NodeProcess, client_package: Path
) -> None:
    sys.path.insert(0, str(client_package))
    try:
        pkg: Any = importlib.import_module("conveyor_gateway_client")
        enqueue = importlib.import_module("conveyor_gateway_client.api.tasks.enqueue_task")
        get_task = importlib.import_module("conveyor_gateway_client.api.tasks.get_task")
        models: Any = importlib.import_module("conveyor_gateway_client.models")
    finally:
        sys.path.remove(str(client_package))
    client = pkg.AuthenticatedClient(base_url=node.base, token=KEY_A)
    body = models.TaskRequest(task_type="echo", app="shop", idempotency_key="generated-client")
    sent = enqueue.sync_detailed(client=client, body=body)
    assert sent.status_code == 201, sent.content
    reply = sent.parsed
    assert isinstance(reply, models.EnqueueReply) and reply.created
    task = get_task.sync(client=client, task_id=reply.task_id)
    assert isinstance(task, models.Task), task
    assert (task.task_id, task.app, task.task_type) == (reply.task_id, "shop", "echo")
    again = enqueue.sync_detailed(client=client, body=body)  # the same key: the same task
    assert again.status_code == 200 and again.parsed.task_id == reply.task_id
    refused = enqueue.sync_detailed(
        client=client, body=models.TaskRequest(task_type="echo", app="shop", priority=10)
    )
    assert refused.status_code == 400 and isinstance(refused.parsed, models.ErrorReply)
    assert refused.parsed.error.field == "priority"
