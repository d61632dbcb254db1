"""The checker on hand-made histories: each violation is caught, an empty run is unknown."""

from __future__ import annotations

from typing import Any

from conveyor_devtools.chaos.checker import Evidence, Thresholds, check
from conveyor_devtools.chaos.history import History, Op, parse


def _history() -> History:
    h = History()
    h.nemesis("kill", {"role": "node"})
    h.nemesis("kill", {"role": "agent"})
    return h


def _enqueue(h: History, key: str, task_id: str | None, outcome: str = "ok") -> None:
    op = h.invoke(1, "enqueue", {"key": key})
    value = {"task_id": task_id} if task_id is not None else {"error": "ReadTimeout"}
    h.complete(op, outcome, value)  # type: ignore[arg-type]


def _read(h: History, f: str, task_id: str, status: str | None) -> None:
    h.add(-1, "ok", f, {"task_id": task_id, "status": status, "finished_ms": None})


def _good() -> History:
    h = _history()
    _enqueue(h, "k1", "t1")
    _read(h, "read", "t1", "ENQUEUED")
    _read(h, "read", "t1", "SUCCEEDED")
    _read(h, "final-read", "t1", "SUCCEEDED")
    return h


def _evidence(**kw: Any) -> Evidence:
    base: dict[str, Any] = {"log_keys": ["k1"], "state_keys": {"t1": "k1"}, "executions": {"t1": 1}}
    return Evidence(**{**base, **kw})


def test_a_clean_run_is_valid() -> None:
    result = check(_good().ops, _evidence(), Thresholds())
    assert result["valid"] is True
    assert (result["acked"], result["lost"], result["executions_per_task"]["max"]) == (1, 0, 1)
    assert result["faults"]["kill9"] == {"agent": 1, "node": 1}


def test_a_lost_ack_is_detected() -> None:
    h = _history()
    _enqueue(h, "k1", "t1")
    _read(h, "final-read", "t1", None)  # 404 after the drain
    result = check(h.ops, _evidence(state_keys={}), Thresholds())
    assert (result["lost"], result["valid"]) == (1, False)


def test_a_phantom_is_detected_in_the_log_and_in_the_state() -> None:
    result = check(
        _good().ops,
        _evidence(log_keys=["k1", "never-sent"], state_keys={"t1": "k1", "t9": "never-sent"}),
        Thresholds(),
    )
    assert (result["unexpected"], result["valid"]) == (2, False)


def test_a_double_terminal_state_is_detected() -> None:
    h = _good()
    _read(h, "read", "t1", "FAILED")
    result = check(h.ops, _evidence(), Thresholds())
    assert (result["double_terminal"], result["valid"]) == (1, False)


def test_a_terminal_state_going_back_is_a_regression() -> None:
    h = _good()
    _read(h, "poll", "t1", "LEASED")
    result = check(h.ops, _evidence(), Thresholds())
    assert (result["regressions"], result["valid"]) == (1, False)


def test_one_key_two_tasks_is_a_duplicate() -> None:
    h = _good()
    _enqueue(h, "k1", "t2")  # the retry of k1 answered with another task
    result = check(h.ops, _evidence(state_keys={"t1": "k1", "t2": "k1"}), Thresholds())
    assert (result["duplicated"], result["valid"]) == (1, False)


def test_a_lost_reply_is_info_and_a_created_task_behind_it_is_recovered() -> None:
    h = _good()
    _enqueue(h, "k2", None, outcome="info")
    result = check(h.ops, _evidence(state_keys={"t1": "k1", "t2": "k2"}), Thresholds())
    assert (result["info"], result["failed"], result["recovered"]) == (1, 0, 1)
    assert result["valid"] is True


def test_an_empty_run_is_unknown_never_true() -> None:
    assert check([], Evidence(), Thresholds())["valid"] == "unknown"


def test_too_few_kills_is_unknown() -> None:
    result = check(_good().ops, _evidence(), Thresholds(min_node_kills=2))
    assert (result["nontrivial"], result["valid"]) == (False, "unknown")


def test_a_task_still_live_after_the_drain_is_unknown() -> None:
    h = _history()
    _enqueue(h, "k1", "t1")
    _read(h, "final-read", "t1", "LEASED")
    result = check(h.ops, _evidence(), Thresholds())
    assert (result["stuck"], result["valid"]) == (1, "unknown")


def test_the_history_round_trips_through_jsonl() -> None:
    ops = _good().ops
    lines = [__import__("json").dumps(op.as_dict()) for op in ops]
    assert list(parse(lines)) == ops
    assert all(isinstance(op, Op) for op in ops)
