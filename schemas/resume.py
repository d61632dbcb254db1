"""Resume policies: where a workflow's later attempts run (after a sleep, fan-in, event or
retry). Stored as plain strings (TaskSpec.resume, Task.resume). A module of its own, so that
``conveyor.App`` checks them without importing every stored type (a guest's start-up)."""

RESUME_LATEST = "latest"  # on any agent of its app
RESUME_PINNED = "pinned"  # only on agents serving the app version its first lease went to
RESUME_POLICIES = (RESUME_LATEST, RESUME_PINNED)
