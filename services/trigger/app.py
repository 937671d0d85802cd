"""Assembles a trigger: its data plane, servicer, gRPC server, its way to the rankers (`RankerCalls`:
through the router, or routed directly with `--rankers`/`--rankers-srv`) and the profile it keeps fresh.

Health of `relaygr.v1.TriggerService` turns SERVING once the first GetProfile answer has calibrated the
cost model (tried every `--profile-retry-s` until a ranker answers), and the profile is refreshed every
`--profile-refresh-s`; a failed refresh keeps the last good profile. `TriggerApp` is what
`python -m services.trigger` runs (`services.common.server.serve_app`); tests use it in-process through
`start()` / `stop()`.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from relaygr.v1 import ranker_pb2, trigger_pb2_grpc
from services.affinity.calls import describe, ranker_calls
from services.common.contract import TRIGGER_SERVICE
from services.common.errors import RequestError
from services.common.interceptor import Interceptor
from services.common.server import GrpcServer
from services.trigger.config import TriggerConfig
from services.trigger.dataplane import TriggerPlane
from services.trigger.fleet_profile import FleetProfile
from services.trigger.servicer import TriggerService, pre_infer_batch_call, pre_infer_call

log = logging.getLogger(__name__)


class TriggerApp:
    def __init__(self, config: TriggerConfig) -> None:
        self.config = config
        self.rankers = ranker_calls(config, config, config.router)
        # Routing directly, the PreInfers placed on one ranker are coalesced into PreInferBatch calls.
        batch = pre_infer_batch_call(self.rankers) if config.routes_directly else None
        self.plane = TriggerPlane(config, pre_infer_call(self.rankers), self.rankers.routable_members, batch)
        self.service = TriggerService(self.plane)
        self.grpc = GrpcServer(config, TRIGGER_SERVICE, self._register)
        self._profile_task: asyncio.Task | None = None

    def _register(self, server: Interceptor) -> None:
        trigger_pb2_grpc.add_TriggerServiceServicer_to_server(self.service, server)

    @property
    def address(self) -> str:
        return self.grpc.address

    async def start(self) -> None:
        await self.grpc.start()
        await self.rankers.start()
        log.info("PreInfer and GetProfile go %s", describe(self.rankers))
        self._profile_task = asyncio.create_task(self._keep_profile_fresh())

    async def close(self) -> None:
        """Stops refreshing the profile and closes the way to the rankers (after the drain)."""
        if self._profile_task is not None:
            self._profile_task.cancel()
        await self.plane.close()
        await self.rankers.close()

    async def stop(self) -> None:
        """Drains and closes, in-process (a process does the same on SIGTERM through `serve_app`)."""
        self.grpc.request_stop()
        try:
            await self.grpc.wait()
        finally:
            await self.close()

    async def _keep_profile_fresh(self) -> None:
        serving = False
        while True:
            profile = await self._fetch_profile()
            if profile is not None:
                self.plane.use_profile(profile)
                if not serving:
                    await self.grpc.set_serving()
                    serving = True
                    log.info("calibrated from model %s; serving", profile.model_version)
            await asyncio.sleep(self.config.profile_refresh_s if serving else self.config.profile_retry_s)

    async def _fetch_profile(self) -> FleetProfile | None:
        try:
            response = await self.rankers.get_profile(
                ranker_pb2.GetProfileRequest().SerializeToString(), self.config.profile_refresh_s
            )
            return FleetProfile.from_response(response)
        except grpc.aio.AioRpcError as exc:
            log.warning("GetProfile %s: %s %s", describe(self.rankers), exc.code().name, exc.details())
        except RequestError as exc:
            log.warning("GetProfile %s: %s %s", describe(self.rankers), exc.code.name, exc.message)
        except ValueError as exc:
            log.warning("GetProfile %s is unusable: %s", describe(self.rankers), exc)
        return None
