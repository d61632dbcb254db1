"""The exit statuses of every ``conveyor`` command, so scripts can tell failures apart.

0 ok. 1 failed: the command ran and what it did or checked failed (a log that does not verify,
a bench that missed its bar, a bulk operation that failed). 2 usage: the arguments or options
are wrong (typer's own usage errors exit 2 as well; so does a request the node refused as
malformed, HTTP 400/413/415/422). 3 not found: no such task, schedule, operation or log (HTTP
404). 4 refused: the command or the node would not do it (a cancel or retry of everything
without ``--all``, no API key, a key without the right, a conflict: HTTP 401/403/409 and other
4xx). 5 unavailable: the node could not be reached or could not answer now (HTTP 5xx, a
connection refused or timed out); trying again later may work.
"""

from __future__ import annotations

OK = 0
FAILED = 1
USAGE = 2
NOT_FOUND = 3
REFUSED = 4
UNAVAILABLE = 5

EPILOG = (
    "Exit status: 0 ok; 1 failed (the command ran, what it checked failed); 2 usage (bad "
    "arguments, or a request the node found malformed); 3 not found (no such task, schedule or "
    "log); 4 refused (no --all for an unfiltered cancel or retry, no or a wrong API key, a "
    "conflict); 5 unavailable (the node cannot be reached or answered 5xx: try again later)."
)


def of_http(status: int) -> int:
    """The exit status for a node's error reply."""
    if status == 404:
        return NOT_FOUND
    if status in (400, 413, 415, 422):
        return USAGE
    if status >= 500:
        return UNAVAILABLE
    return REFUSED
