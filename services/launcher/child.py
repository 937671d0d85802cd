"""`python -m services.launcher.child PARENT_PID MODULE [ARGS...]`: MODULE as `__main__`, dying with its
parent.

`services.launcher.procs` starts every service through this module. On Linux it first asks the kernel to send
this process SIGTERM when its parent dies (even by SIGKILL), so no service outlives the launcher or test
that started it. The request is made here, after exec, rather than in a `preexec_fn`: that would run Python
between fork and exec, and a child forked while the parent's gRPC threads are busy crashes there (SIGSEGV).
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """SIGTERM on the parent's death; exits at once when the parent is already gone (nobody would signal)."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:
        sys.exit(f"parent {parent_pid} exited before {sys.argv[2]} started")


def main() -> None:
    parent_pid, module, *args = sys.argv[1:]
    die_with_parent(int(parent_pid))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
