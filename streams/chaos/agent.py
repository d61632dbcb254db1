"""``python -m conveyor.streams.chaos.agent``: ``conveyor agent`` with a compressed lease.

The same ``HostAgent`` as ``conveyor agent`` (``agents/host.py``), but the CLI fixes the lease at
30 s, so every agent kill would strand its tasks for 30 s and the drain would dominate a CI-sized
run. RELIABILITY.md §3 asks for time compression (lease TTL 2 s, heartbeat 0.5 s): this entry
point takes them as options. Once ``conveyor agent`` grows ``--lease-s`` it can replace this.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from conveyor.agents.host import HostAgent
from conveyor.agents.worker_api import HttpWorkerAPI


async def _main(args: argparse.Namespace) -> None:
    api = HttpWorkerAPI(args.url, args.api_key)
    agent = HostAgent(
        api,
        args.app,
        concurrency=args.concurrency,
        prefetch=args.prefetch,
        heartbeat_s=args.heartbeat_s,
        lease_s=args.lease_s,
        poll_wait_s=args.poll_wait_s,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, agent.stop)
    try:
        await agent.run(drain_s=1.0)
    finally:
        await api.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="chaos-agent")
    parser.add_argument("--app", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--lease-s", type=float, default=2.0)
    parser.add_argument("--heartbeat-s", type=float, default=0.5)
    parser.add_argument("--poll-wait-s", type=float, default=2.0)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
