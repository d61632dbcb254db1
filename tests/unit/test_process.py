"""``tune_malloc``: a socket read stops mapping (and faulting in) a fresh 256 KiB buffer."""

from __future__ import annotations

import subprocess
import sys

# In a process of its own: the settings are process-wide and cannot be undone.
PROBE = """
import resource, socket
from conveyor.process import tune_malloc
a, b = socket.socketpair()
def faults(n=1000):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n):
        a.send(b"x" * 100)
        b.recv(256 * 1024)  # what asyncio's transports ask for on every read
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
untuned = faults()
print(untuned, tune_malloc(), faults())
"""


def test_socket_reads_stop_faulting_in_pages_once_malloc_is_tuned() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    untuned, applied, tuned = out.stdout.split()
    assert applied == "True"  # this machine's libc is glibc
    assert int(untuned) >= 1_000  # a fresh mapping per read: at least a fault each
    assert int(tuned) < 50
