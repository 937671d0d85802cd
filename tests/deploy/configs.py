"""Each fleet workload's settings as its service would load them from the rendered container: command,
arguments and the environment Kubernetes would build."""

from __future__ import annotations

import dataclasses
import importlib
import inspect

from services.common.config import ENV_PREFIX, ServiceConfig, env_name, load
from tests.deploy.manifests import objects, workloads
from tests.deploy.pods import containers, environment


def config_class(module: str) -> type[ServiceConfig]:
    """The settings dataclass of a service: the ServiceConfig subclass its `config` module defines."""
    config_module = importlib.import_module(f"{module}.config")
    (cls,) = [
        obj
        for _, obj in inspect.getmembers(config_module, inspect.isclass)
        if issubclass(obj, ServiceConfig)
        and obj is not ServiceConfig
        and obj.__module__ == config_module.__name__
    ]
    return cls


def loaded_configs(overlay: str) -> dict[str, ServiceConfig]:
    """{workload name: its container's parsed settings} for every fleet workload of the overlay."""
    manifests = objects(f"overlays/{overlay}")
    configs = {}
    for workload in workloads(manifests):
        (container,) = containers(workload)
        python, flag, module = container["command"][:3]
        assert (python, flag) == ("python", "-m"), container["command"]
        cls = config_class(module)
        env = environment(manifests, workload, container)
        fields = {env_name(f.name) for f in dataclasses.fields(cls)}
        unknown = {name for name in env if name.startswith(ENV_PREFIX)} - fields
        assert not unknown, f"{workload['metadata']['name']}: {unknown} are no settings of {cls.__name__}"
        argv = [*container["command"][3:], *container.get("args", [])]
        configs[workload["metadata"]["name"]] = load(cls, argv, env)
    return configs


def workload_kind(name: str) -> str:
    return "StatefulSet" if name == "ranker" else "Deployment"
