"""Frames on the guest socket (``agents/frames.py``): whatever the json module read and wrote,
a frame still carries, though msgspec now reads and writes it; and a value JSON has no form
for (NaN, the infinities) is refused where user code hands it over, not turned into null."""

from __future__ import annotations

import math
import socket
import threading
from typing import Any

import pytest

import conveyor
from conveyor.agents.frames import BlockingFrames, FrameError, _take, encode
from conveyor.agents.runner import succeeded
from conveyor.errors import ContractError

ODD_BUT_JSON = [
    {"op": "done", "result": {"s": "caf\u00e9 \u2603 \U0001f600", "n": 2**70, "f": 0.1}},
    {"op": "done", "result": {"s": "\ud800 lone surrogate"}},  # the json module escapes it
    {"op": "done", "result": {None: 1, True: 2, 3: 4}},  # keys the json module writes
    {"op": "done", "result": [1, [2, (3, 4)], {"deep": {"er": None}}]},
]


@pytest.mark.parametrize("frame", ODD_BUT_JSON, ids=["unicode", "surrogate", "keys", "nested"])
def test_a_frame_reads_back_as_the_json_module_reads_it(frame: dict[str, Any]) -> None:
    import json

    data = bytearray(encode(frame))
    assert _take(data) == json.loads(json.dumps(frame)) and data == bytearray()


def test_frames_cross_a_socket_in_order_and_split_anywhere() -> None:
    a, b = socket.socketpair()
    frames = [{"op": "run", "task_id": f"{i:032x}", "payload": {"i": i}} for i in range(50)]
    wire = b"".join(encode(f) for f in frames)

    def write() -> None:
        for cut in range(0, len(wire), 7):  # delivered in 7-byte pieces
            a.sendall(wire[cut : cut + 7])
        a.close()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    b.settimeout(10.0)
    reader = BlockingFrames(b)
    assert [reader.recv() for _ in frames] == frames
    assert reader.recv() is None  # EOF
    writer.join(timeout=10)
    b.close()


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'{"a": '])
def test_a_frame_that_is_not_a_json_object_is_a_frame_error(body: bytes) -> None:
    data = bytearray(len(body).to_bytes(4, "big") + body)
    with pytest.raises(FrameError):
        _take(data)


@pytest.mark.parametrize("value", [math.nan, math.inf, {"x": [1, -math.inf]}])
def test_a_result_json_cannot_carry_is_fatal(value: Any) -> None:
    result = succeeded(None, value)
    assert (result.outcome, result.error_class) == ("FATAL", "ResultNotSerializable")
    assert "not JSON" in (result.error_message or "")


def test_a_checkpoint_with_nan_is_refused() -> None:
    class Channel:
        def heartbeat(self, progress: Any) -> None: ...

        def checkpoint(self, value: Any) -> None:
            raise AssertionError("a refused checkpoint must not be sent")

        def step(self, *args: Any) -> Any: ...

    ctx = conveyor.Context(
        task_id="t" * 32, task_type="x", attempt=1, checkpoint=None, channel=Channel()
    )
    with pytest.raises(ContractError, match="JSON"):
        ctx.checkpoint({"progress": math.nan})


def test_a_step_value_with_nan_is_refused() -> None:
    from conveyor.signals import StepRefused
    from conveyor.steps import encode_value

    with pytest.raises(StepRefused, match="not JSON"):
        encode_value("charge", {"amount": math.inf})
