"""The host agent (credentials, leases, heartbeats, sandboxes) and the zero-credential guest.

host.py       HostAgent and run_agent: poll, heartbeat, deadlines, breakers
worker_api.py the WorkerAPI protocol and its HTTP implementation
completer.py  batched completions (checkpoints first)
running.py    one attempt as the agent tracks it (the lease id stays here)
pool.py       guest processes: warm pool, limits, log capture   (sandbox.py: the protocols)
guest.py      the stub inside a guest; frames.py: its socket protocol
runner.py     handler call -> outcome, shared by guests and inline.py (conveyor.testing)
breaker.py    the per-task-type circuit breaker
"""
