"""OS-level names for the threads a service starts, so `top -H`, py-spy and /proc/<pid>/task tell them apart.

Python (before 3.14) names its threads for itself only: the kernel still calls every thread by the
process's name. A thread that calls `name_os_thread` from its own code gets its kernel name (`comm`, at
most 15 bytes) set as well.
"""

from __future__ import annotations

import contextlib

_MAX_COMM_BYTES = 15


def name_os_thread(name: str) -> None:
    """Gives the calling thread `name` (cut to 15 bytes) as its kernel name; a no-op where /proc has none."""
    with contextlib.suppress(OSError), open("/proc/thread-self/comm", "w") as comm:
        comm.write(name.encode()[:_MAX_COMM_BYTES].decode(errors="ignore"))
