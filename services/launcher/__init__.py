"""The one-command local fleet (`python -m services.launcher`, `make run`): `fleet.Fleet` runs it (and serves
tests), `procs` starts, health-checks and stops service processes, `child` makes each die with its parent.

Nothing is imported here: `python -m services.launcher.child` starts every service process, and must not
pay for the fleet's imports."""
