"""The one-command local fleet (`python -m services.launcher`, `make run`) and its `Fleet` for tests."""

from services.launcher.fleet import Endpoint, Fleet, FleetConfig, ServiceExited

__all__ = ["Endpoint", "Fleet", "FleetConfig", "ServiceExited"]
