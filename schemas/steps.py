"""Limits of durable steps, shared by the SDK (which refuses first), the agent and the state
machine (which refuses again: a guest is not trusted to have checked).

Caps apply to the encoded bytes of a step's value, because that is what is stored and loaded
at every attempt start:

    STEP_BYTES_MAX   256 KiB   one step's value
    STEPS_BYTES_MAX    4 MiB   all committed values of one task
    STEPS_MAX          5,000   committed steps (sleeps included) of one task

A parallel step (``ctx.parallel``) has at most PARALLEL_CHILDREN_MAX children. Its value, the
children's results in order, is assembled by the state machine at fan-in: it counts towards
the task's totals, and only the task's bytes limit (not the per-step one) applies to it.
"""

from __future__ import annotations

STEP_NAME_BYTES_MAX = 128
STEP_KEY_BYTES_MAX = 256
STEP_BYTES_MAX = 256 * 1024
STEPS_BYTES_MAX = 4 * 1024 * 1024
STEPS_MAX = 5_000
PARALLEL_CHILDREN_MAX = 10_000  # children of one ctx.parallel


def over_cap(identity: str, size: int, count: int, total: int) -> str | None:
    """Why committing a ``size``-byte value as one more step of a task that already holds
    ``count`` steps of ``total`` bytes is refused, or None."""
    if size > STEP_BYTES_MAX:
        return f"step {identity!r} exceeds the step bytes limit: {size} > {STEP_BYTES_MAX}"
    if total + size > STEPS_BYTES_MAX:
        return (
            f"step {identity!r} exceeds the task's step bytes limit: "
            f"{total + size} > {STEPS_BYTES_MAX}"
        )
    if count + 1 > STEPS_MAX:
        return f"step {identity!r} exceeds the task's step count limit: {count + 1} > {STEPS_MAX}"
    return None


# Compensations (``ctx.step.run(..., compensate=fn)``, see ``conveyor.steps``): before the body
# of a step with a compensation first runs, the SDK commits the keyed marker step
# ``@compensate:<identity>`` (the machine then knows the task has compensations: a cancel gives
# it a compensating attempt); the compensation itself runs as the keyed step
# ``@undo:<identity>``. Step names cannot begin with "@", so user steps never collide.
COMPENSATE_PREFIX = "@compensate:"
UNDO_PREFIX = "@undo:"
