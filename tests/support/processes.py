"""The processes a test leaves behind."""

from __future__ import annotations

import os
from pathlib import Path


def fleet_children() -> list[int]:
    """Processes still running that the launcher started for this process (services.launcher.child <pid>)."""
    marker = f"services.launcher.child\0{os.getpid()}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone meanwhile
            continue
    return found
