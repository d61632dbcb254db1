"""Failpoints are armed only by a well-formed CONVEYOR_FAILPOINTS, and a bad one says why."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conveyor.streams import failpoints


def test_parse_arms_named_points_with_probabilities() -> None:
    assert failpoints.parse("") == {}
    assert failpoints.parse("lease-granted=0.25") == {"lease-granted": 0.25}


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("nowhere=1", "unknown failpoint 'nowhere'"),
        ("lease-granted=often", "is not a probability"),
        ("lease-granted=2", "not a probability in 0..1"),
    ],
)
def test_a_bad_spec_is_refused_naming_the_problem(spec: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        failpoints.parse(spec)


def test_an_armed_point_kills_the_process_with_sigkill() -> None:
    code = "from conveyor.streams import failpoints; failpoints.hit('lease-granted'); print('x')"
    env = {"CONVEYOR_FAILPOINTS": "lease-granted=1", "PATH": ""}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == -9 and done.stdout == ""
    assert "failpoint lease-granted: SIGKILL" in done.stderr
    env["CONVEYOR_FAILPOINTS"] = ""  # off: the same pass does nothing
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "x\n"
