"""The project's open-loop load generator: ghz's config keys and report, Poisson arrivals, no coordinated
omission. `python -m services.loadgen --config FILE` runs a ghz config; `run_open_loop` is the library.
"""

from services.loadgen.openloop import CallRecord, run_open_loop
from services.loadgen.schedule import RateSchedule, poisson_arrivals

__all__ = ["CallRecord", "RateSchedule", "poisson_arrivals", "run_open_loop"]
