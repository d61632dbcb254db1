"""``conveyor codec-server`` as a real process on a real socket: it decodes what the client's
codec encoded, encodes for it, answers CORS only to the origins it was given, refuses a
tampered payload by its index, and asks for the token when one is set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import codec_app
import pytest
from test_gateway import free_port

from conveyor.codecs import decode_value, encode_value, encode_values

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).resolve().parent
DASHBOARD = "http://127.0.0.1:7400"
TOKEN = "codec-token-for-the-test-31f9"
START_S = 30.0


class CodecServer:
    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.out = tmp / f"codec-{self.port}.out"
        cmd = [sys.executable, "-m", "conveyor.cli", "codec-server", "--codec"]
        cmd += ["codec_app:CODEC", "--port", str(self.port), *args]
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=HERE, stdout=out, stderr=subprocess.STDOUT, env=env or dict(os.environ)
            )

    def wait_up(self) -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"codec-server exited:\n{self.out.read_text()}")
            try:
                if self.post("/healthz", None, method="GET")[0] == 200:
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"codec-server not up after {START_S}s:\n{self.out.read_text()}")

    def post(
        self, path: str, body: Any, *, method: str = "POST", headers: dict[str, str] | None = None
    ) -> tuple[int, Any, dict[str, str]]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                raw = reply.read()
                return reply.status, json.loads(raw) if raw else None, dict(reply.headers)
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, json.loads(raw) if raw else None, dict(exc.headers)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CodecServer]:
    s = CodecServer(tmp_path_factory.mktemp("codec-server"))
    try:
        s.wait_up()
        yield s
    finally:
        s.stop()


def test_decode_and_encode_with_the_users_codec(server: CodecServer) -> None:
    sealed = encode_values(codec_app.CODEC, [{"card": "4111"}, "x" * 2000])
    status, body, _ = server.post("/decode", {"payloads": [*sealed, {"plain": 1}, None]})
    assert status == 200
    assert body == {"payloads": [{"card": "4111"}, "x" * 2000, {"plain": 1}, None]}
    status, body, _ = server.post("/encode", {"payloads": [{"amount": 5}]})
    assert status == 200
    (envelope,) = body["payloads"]
    assert envelope["$codec"] == "conveyor/v1" and "amount" not in json.dumps(envelope)
    assert decode_value(codec_app.CODEC, envelope) == {"amount": 5}


def test_a_tampered_payload_is_refused_by_its_index(server: CodecServer) -> None:
    good = encode_value(codec_app.CODEC, "fine")
    bad = {**good, "metadata": {"key_id": "someone-elses"}}
    status, body, _ = server.post("/decode", {"payloads": [good, bad]})
    assert status == 400 and body["error"]["code"] == "codec_error"
    assert body["error"]["message"].startswith("payloads[1]: ")
    assert "'someone-elses'" in body["error"]["message"]
    for wrong in ([1, 2], {"payload": []}):
        status, body, _ = server.post("/decode", wrong)
        assert status == 400 and "payloads" in body["error"]["message"]


def test_cors_answers_the_dashboards_origin_only(server: CodecServer) -> None:
    preflight = {"Origin": DASHBOARD, "Access-Control-Request-Method": "POST"}
    status, _, headers = server.post("/decode", None, method="OPTIONS", headers=preflight)
    assert status == 204 and headers["Access-Control-Allow-Origin"] == DASHBOARD
    assert "Authorization" in headers["Access-Control-Allow-Headers"]
    other = {"Origin": "http://evil.example"}
    status, _, headers = server.post("/decode", {"payloads": []}, headers=other)
    assert status == 200 and "Access-Control-Allow-Origin" not in headers


def test_with_a_token_set_a_request_must_carry_it(tmp_path: Path) -> None:
    s = CodecServer(tmp_path, env={**os.environ, "CONVEYOR_CODEC_TOKEN": TOKEN})
    try:
        s.wait_up()  # /healthz takes no token
        status, body, _ = s.post("/decode", {"payloads": []})
        assert status == 401 and TOKEN not in json.dumps(body)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert s.post("/decode", {"payloads": ["x"]}, headers=auth)[:2] == (
            200,
            {"payloads": ["x"]},
        )
        assert s.post("/decode", {"payloads": []}, headers={"Authorization": "Bearer no"})[0] == 401
        assert TOKEN not in s.out.read_text()
    finally:
        s.stop()


def test_a_codec_that_does_not_load_is_a_usage_error(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "conveyor.cli", "codec-server", "--codec", "codec_app:nothing"]
    done = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--codec codec_app:nothing" in done.stderr + done.stdout
