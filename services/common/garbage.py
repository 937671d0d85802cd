"""The process's garbage collector: its pauses measured, and the start-up heap frozen out of its way.

CPython's cyclic collector stops the process while it runs, and a full (generation 2) collection traverses
every container object the process holds. A ranker holds the model, torch's and gRPC's modules and the
warm-up's objects: a full collection of that heap takes 100-150 ms on a 2-core machine, and every Rank in
flight waits for it, which is a P99 miss however idle the fleet is. Nothing made at start-up is garbage, so
once a service is warm (`GrpcServer.set_serving`) it collects once and freezes what is left (`gc.freeze`):
later collections skip those objects and take milliseconds.

`install(freeze)` is per process, called by `service_main` only: services that tests run in-process leave
the test's own collector alone. Every process records its collections' pauses in
`relaygr_gc_pause_seconds` (by generation) and the objects it froze in `relaygr_gc_frozen_objects`.
"""

from __future__ import annotations

import gc
import logging
import time

from services.common.metrics import GC_FROZEN_OBJECTS, GC_PAUSE_SECONDS

log = logging.getLogger(__name__)

_installed = False
_freeze = False
_frozen = False
_started = 0.0
# The pause histogram of each generation, looked up once: a collection runs every few hundred allocations.
_PAUSES = [GC_PAUSE_SECONDS.labels(str(generation)) for generation in range(3)]


def _on_collection(phase: str, info: dict) -> None:
    global _started
    if phase == "start":
        _started = time.perf_counter()
    else:
        _PAUSES[info["generation"]].observe(time.perf_counter() - _started)


def install(freeze: bool) -> None:
    """Measures this process's collections from now on; with `freeze`, `on_serving` freezes the heap."""
    global _installed, _freeze
    if not _installed:
        gc.callbacks.append(_on_collection)
        _installed = True
    _freeze = freeze


def on_serving() -> None:
    """The service is warm: the first time, if `install(freeze=True)` asked for it, collects what start-up
    left behind and freezes the rest (it will live as long as the process)."""
    global _frozen
    if not _freeze or _frozen:
        return
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    _frozen = True
    GC_FROZEN_OBJECTS.set(gc.get_freeze_count())
    log.info(
        "froze %d objects out of the garbage collector's way (%.0f ms)",
        gc.get_freeze_count(), (time.perf_counter() - started) * 1000,
    )  # fmt: skip
