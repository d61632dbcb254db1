"""A local Apache Kafka for development and CI (the code lives in streams/log/kafka_broker.py).

    python3 tools/kafka.py fetch                     the jars into the cache (needs mvn), once
    python3 tools/kafka.py start --nodes 3 --root D  start 1 or 3 nodes, print the bootstrap
    python3 tools/kafka.py stop --root D             stop the nodes started in D, by PID

Standard library only: CI runs ``fetch`` with a bare python3 before the venv exists, which is
why the module is loaded from its file and not imported from the installed package.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import ModuleType

BROKER_MODULE = Path(__file__).resolve().parents[1] / "streams" / "log" / "kafka_broker.py"
STATE_FILE = "cluster.json"


def _broker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("conveyor_kafka_broker", BROKER_MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


def _start(nodes: int, root: Path) -> None:
    broker = _broker()
    root.mkdir(parents=True, exist_ok=True)
    cluster = broker.KafkaCluster.start(nodes, root)
    state = {"bootstrap": cluster.bootstrap, "pids": cluster.pids()}
    (root / STATE_FILE).write_text(json.dumps(state))
    print(cluster.bootstrap)


def _is_kafka(pid: int) -> bool:
    try:
        return b"kafka.Kafka" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _stop(root: Path, stop_s: float) -> None:
    state_path = root / STATE_FILE
    if not state_path.exists():
        sys.exit(f"no cluster was started in {root} (no {STATE_FILE} there)")
    pids = [p for p in json.loads(state_path.read_text())["pids"] if _is_kafka(p)]
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + stop_s
    while any(_is_kafka(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in filter(_is_kafka, pids):
        os.kill(pid, signal.SIGKILL)
    state_path.unlink()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tools/kafka.py", description=__doc__.split("\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("fetch", help="fetch the broker's jars into the cache if missing")
    start = verbs.add_parser("start", help="start 1 or 3 nodes on free 127.0.0.1 ports")
    start.add_argument("--nodes", type=int, choices=(1, 3), default=1)
    start.add_argument("--root", type=Path, required=True, help="directory for data and logs")
    stop = verbs.add_parser("stop", help="stop the nodes that `start` left running in --root")
    stop.add_argument("--root", type=Path, required=True)
    stop.add_argument("--stop-s", type=float, default=15.0, help="SIGKILL after this long")
    args = parser.parse_args(argv)
    try:
        if args.verb == "fetch":
            print(_broker().fetch())
        elif args.verb == "start":
            _start(args.nodes, args.root)
        else:
            _stop(args.root, args.stop_s)
    except RuntimeError as exc:  # KafkaUnavailable: the message says what to do
        sys.exit(f"tools/kafka.py {args.verb}: {exc}")


if __name__ == "__main__":
    main()
