"""Size limits of the worker protocol, shared by both ends of it: the agent truncates what a
guest reports to them, and the gateway refuses anything past them (a 400 naming the field)."""

ERROR_CLASS_BYTES_MAX = 200
ERROR_MESSAGE_BYTES_MAX = 16 * 1024
ERROR_STACK_BYTES_MAX = 64 * 1024
ATTEMPT_LOG_BYTES_MAX = 64 * 1024  # the tail of what an attempt printed
POLL_CAPACITY_MAX = 1_000  # leases one poll may ask for; an agent holding more asks again
WORKER_ITEMS_MAX = 1_000  # leases, completions, checkpoints or steps in one call
