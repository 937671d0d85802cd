"""deploy/loadtest: every ghz config uses ghz's own keys and names a real method, every data entry parses
into the real request message (ghz reads call data as protojson), the data is what tools/ghz_data.py
generates, every path in a config resolves from the repository root (ghz takes paths from its working
directory), and the in-cluster Job's working directory and mount make the same paths exist."""

from __future__ import annotations

import json
import posixpath
from collections import Counter
from pathlib import Path
from statistics import median

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

import tools.ghz_data
from relaygr.v1 import ranker_pb2, recommend_pb2, trigger_pb2  # noqa: F401 - registers the descriptors
from services.common import validation
from services.loadgen.ghz_config import PATH_KEYS, load_ghz_config
from services.ranker.config import RankerConfig
from services.ranker.model.presets import get_preset
from tests.deploy.manifests import DEPLOY, REPO_ROOT, named, objects, of_kind
from tests.deploy.pods import containers, pod_spec

LOADTEST = DEPLOY / "loadtest"
CONFIGS = sorted(LOADTEST.glob("*.json"))
# The JSON keys of ghz's runner.Config (github.com/bojand/ghz v0.120, runner/config.go), the config-file
# spelling of its long flags.
GHZ_KEYS = {
    "proto", "protoset", "call", "import-paths", "cacert", "cert", "key", "skipTLS", "skipFirst", "cname",
    "authority", "insecure", "total", "async", "concurrency", "concurrency-schedule", "concurrency-start",
    "concurrency-end", "concurrency-step", "concurrency-step-duration", "concurrency-max-duration",
    "connections", "rps", "duration", "duration-stop", "max-duration", "timeout", "data", "data-file",
    "binary-file", "metadata", "metadata-file", "stream-interval", "output", "format", "connect-timeout",
    "keepalive", "cpus", "name", "tags", "reflect-metadata", "debug", "host", "enable-compression",
    "load-schedule", "load-start", "load-end", "load-step", "load-step-duration", "load-max-duration",
    "lb-strategy",
}  # fmt: skip
GHZ_IMAGE = "ghcr.io/bojand/ghz:0.120.0"


def request_class(call: str):
    service, _, method = call.rpartition(".")
    descriptor = descriptor_pool.Default().FindServiceByName(service).methods_by_name[method]
    return message_factory.GetMessageClass(descriptor.input_type)


def test_there_is_a_config_for_rank_pre_infer_and_recommend():
    calls = {json.loads(path.read_text())["call"] for path in CONFIGS}
    assert calls == {
        "relaygr.v1.RankerService.Rank",
        "relaygr.v1.RankerService.PreInfer",
        "relaygr.v1.RecommendService.Recommend",
    }


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_uses_ghz_keys_and_every_data_entry_parses_into_the_request(path: Path):
    config = json.loads(path.read_text())
    assert set(config) <= GHZ_KEYS
    assert config["insecure"] is True
    protoset = descriptor_pb2.FileDescriptorSet.FromString((REPO_ROOT / config["protoset"]).read_bytes())
    service, _, method = config["call"].rpartition(".")
    methods = {
        f"{file.package}.{s.name}.{m.name}" for file in protoset.file for s in file.service for m in s.method
    }
    assert config["call"] in methods, f"{method} of {service} is not in the protoset"
    entries = json.loads((REPO_ROOT / config["data-file"]).read_text())
    assert isinstance(entries, list) and entries
    cls = request_class(config["call"])
    for entry in entries:
        message = json_format.ParseDict(entry, cls())
        validation.user_id(message.user_id)
        if message.DESCRIPTOR.fields_by_name.get("long_term"):  # what a ranker would accept
            validation.behavior_sequence(
                message.long_term, "long_term", RankerConfig.max_long_term_events,
                get_preset(RankerConfig.model_preset).num_action_types, allow_empty=False,
            )  # fmt: skip


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_path_in_a_config_resolves_from_the_repository_root(path: Path, monkeypatch):
    config = json.loads(path.read_text())
    named_paths = {key: config[key] for key in PATH_KEYS if config.get(key)}
    assert set(named_paths) == {"data-file", "protoset"}
    for value in named_paths.values():
        assert (REPO_ROOT / value).is_file() and (REPO_ROOT / value).resolve().is_relative_to(LOADTEST)
    # The project's load generator, run from the repository root as the docs say, finds them there.
    monkeypatch.chdir(REPO_ROOT)
    loaded = load_ghz_config(path.relative_to(REPO_ROOT))
    assert loaded.paths == {key: REPO_ROOT / value for key, value in named_paths.items()}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_the_local_load_generator_reads_the_same_config(path: Path):
    loaded = load_ghz_config(path, base_dir=REPO_ROOT)
    data = json.loads((REPO_ROOT / json.loads(path.read_text())["data-file"]).read_text())
    assert len(loaded.requests) == len(data)
    assert loaded.requests[0] == json_format.ParseDict(data[0], loaded.method.request_class())


def test_data_files_are_what_the_generator_writes():
    assert tools.ghz_data.stale() == []


def test_data_is_a_realistic_user_mix():
    recommend = [e["user_id"] for e in json.loads((LOADTEST / "data" / "recommend.json").read_text())]
    visits = Counter(recommend)
    assert max(visits.values()) >= 10, "popular users come back"
    assert sum(1 for n in visits.values() if n == 1) > len(visits) / 2, "most users come once"
    ranks = [
        json_format.ParseDict(e, ranker_pb2.RankRequest())
        for e in json.loads((LOADTEST / "data" / "rank.json").read_text())
    ]
    lengths = [len(r.long_term.item_ids) for r in ranks]
    assert max(lengths) >= 8 * median(lengths), "history lengths are heavy-tailed"
    pre_infers = [
        json_format.ParseDict(e, ranker_pb2.PreInferRequest())
        for e in json.loads((LOADTEST / "data" / "pre-infer.json").read_text())
    ]
    assert [(p.user_id, p.long_term) for p in pre_infers] == [(r.user_id, r.long_term) for r in ranks]


def test_job_runs_ghz_where_the_configs_paths_resolve_as_from_the_repository_root():
    manifests = objects("loadtest")
    job = named(manifests, "Job", "ghz")
    (container,) = containers(job)
    assert container["image"] == GHZ_IMAGE
    (mount,) = container["volumeMounts"]
    assert mount["readOnly"] is True
    working_dir = container["workingDir"]
    # The folder sits below the working directory where it sits below the repository root.
    assert mount["mountPath"] == posixpath.join(working_dir, str(LOADTEST.relative_to(REPO_ROOT)))
    (volume,) = (v for v in pod_spec(job)["volumes"] if v["name"] == mount["name"])
    (config_map,) = of_kind(manifests, "ConfigMap")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    # The files the pod sees, by their path from its working directory.
    mounted = {}
    for item in volume["configMap"]["items"]:
        content = config_map.get("data", {}).get(item["key"]) or config_map["binaryData"][item["key"]]
        seen = posixpath.relpath(posixpath.join(mount["mountPath"], item["path"]), working_dir)
        mounted[seen] = content
    shipped = {
        str(p.relative_to(REPO_ROOT)) for p in LOADTEST.rglob("*") if p.is_file() and p.suffix != ".yaml"
    }
    assert set(mounted) == shipped
    for path in CONFIGS:
        seen = str(path.relative_to(REPO_ROOT))
        config = json.loads(mounted[seen])
        assert config == json.loads(path.read_text())
        for key in PATH_KEYS:
            if config.get(key):
                assert config[key] in mounted, f"{seen}: {key} {config[key]} is not in the pod"
    (config_arg,) = container["args"]
    assert config_arg.removeprefix("--config=") in mounted
    assert job["spec"]["backoffLimit"] == 0 and pod_spec(job)["restartPolicy"] == "Never"
