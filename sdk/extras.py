"""The optional parts of an install, and the one message that names a missing one.

``pip install conveyor`` is the SDK (``App``, tasks, workflows), both clients, the host agent
(``conveyor agent``) and the client commands. The rest comes with an extra (pyproject.toml):

    server   conveyor node, conveyor dev, conveyor.testing: RocksDB, the Postgres snapshot, the
             Avro log, cron schedules, webhooks, metrics
    s3       S3 as the blob store or the snapshot store (boto3)
    kafka    the log in Kafka: --kafka (aiokafka)

A part used without its extra fails with what needs it and the command that installs it,
``conveyor node needs the server extra: pip install 'conveyor[server]'``, not with the
``ModuleNotFoundError`` of a package the user never asked for.
"""

from __future__ import annotations

import importlib.util

# extra -> the top-level modules it installs (as pyproject.toml's extras; a unit test checks)
MODULES: dict[str, tuple[str, ...]] = {
    "server": (
        "rocksdict",
        "fastavro",
        "croniter",
        "crc32c",
        "sortedcontainers",
        "asyncpg",
        "pgserver",
        "prometheus_client",
        "standardwebhooks",
        "psutil",
    ),
    "s3": ("boto3", "botocore"),
    "kafka": ("aiokafka",),
}


class MissingExtra(ModuleNotFoundError):
    """A part of Conveyor was used without the extra that installs what it needs."""

    def __init__(self, extra: str, what: str, module: str) -> None:
        super().__init__(
            f"{what} needs the {extra} extra: pip install 'conveyor[{extra}]' "
            f"({module} is not installed)",
            name=module,
        )
        self.extra = extra


def require(extra: str, *modules: str, what: str) -> None:
    """Raise ``MissingExtra`` unless ``modules`` (default: all of the extra's) can be imported;
    ``what`` names the part that needs them (``"conveyor node"``). Nothing is imported."""
    for module in modules or MODULES[extra]:
        if importlib.util.find_spec(module) is None:
            raise MissingExtra(extra, what, module)


def extra_of(module: str | None) -> str | None:
    """The extra that installs ``module`` (a dotted name: its top level counts), or None."""
    top = (module or "").partition(".")[0]
    return next((extra for extra, names in MODULES.items() if top in names), None)


def missing(exc: ModuleNotFoundError, what: str) -> MissingExtra | None:
    """``exc`` said as a ``MissingExtra`` of ``what`` when an extra installs the module it did
    not find; None for any other module (a bug or a broken install: let it propagate)."""
    extra = extra_of(exc.name)
    if extra is None or exc.name is None:
        return None
    return MissingExtra(extra, what, exc.name.partition(".")[0])
