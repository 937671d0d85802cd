"""The ascend overlay can open the NPU: its ranker runs as uid 10001 with every capability dropped, so it
reaches the device files (group HwHiAiUser, mode 0660) only through a supplemental group, and it asks the
MindCluster device plugin for the resource it advertises. The default relies on the Ascend Docker Runtime
for the driver mounts and stays within the restricted Pod Security Standard; the ascend-driver-hostpath
component mounts the driver from the node instead and says so in the namespace's Pod Security labels.
"""

from __future__ import annotations

from tests.deploy.compose import composed, render_composed
from tests.deploy.manifests import NAMESPACE, named, objects, workloads
from tests.deploy.pods import containers, pod_spec
from tests.deploy.validate import unvalidated_kinds

# HwHiAiUser's conventional gid: the Ascend device plugin's and CANN's images create the group with it.
HWHIAIUSER_GID = 1000
RESOURCE = "huawei.com/Ascend910"
# The restricted Pod Security Standard's "Volume Types" control: every other volume type is refused.
RESTRICTED_VOLUME_TYPES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
    "secret",
}  # fmt: skip
PSS_LABEL = "pod-security.kubernetes.io/"
DRIVER_PATHS = {
    "/usr/local/Ascend/driver",
    "/usr/local/dcmi",
    "/usr/local/bin/npu-smi",
    "/etc/ascend_install.info",
}


def volume_types(workload) -> set[str]:
    return {key for volume in pod_spec(workload).get("volumes", []) for key in volume if key != "name"}


def ranker(manifests):
    return named(manifests, "StatefulSet", "ranker")


def test_the_ranker_joins_the_device_group_without_gaining_privileges():
    spec = pod_spec(ranker(objects("overlays/ascend")))
    security = spec["securityContext"]
    assert HWHIAIUSER_GID in security["supplementalGroups"]
    # The overlay's patch adds the group and keeps the base's identity.
    assert (security["runAsUser"], security["runAsGroup"], security["fsGroup"]) == (10001, 10001, 10001)
    assert security["runAsNonRoot"] is True and security["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = spec["containers"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert not container["securityContext"].get("privileged", False)


def test_only_the_ranker_joins_the_device_group():
    for workload in workloads(objects("overlays/ascend")):
        groups = pod_spec(workload)["securityContext"].get("supplementalGroups", [])
        assert (HWHIAIUSER_GID in groups) == (workload["metadata"]["name"] == "ranker"), workload["metadata"]


def test_the_ranker_asks_the_device_plugin_for_one_npu_on_an_ascend_node():
    spec = pod_spec(ranker(objects("overlays/ascend")))
    (container,) = spec["containers"]
    # Extended resources: requests must equal limits, and the device plugin counts whole NPUs.
    assert container["resources"]["requests"][RESOURCE] == container["resources"]["limits"][RESOURCE] == 1
    # The label the MindCluster installation puts on Ascend 910 nodes (910B ones included).
    assert spec["nodeSelector"] == {"accelerator": "huawei-Ascend910"}


def test_by_default_the_runtime_mounts_the_driver_and_the_namespace_stays_restricted():
    manifests = objects("overlays/ascend")
    namespace = named(manifests, "Namespace", NAMESPACE)
    assert namespace["metadata"]["labels"][f"{PSS_LABEL}enforce"] == "restricted"
    for workload in workloads(manifests):
        assert volume_types(workload) <= RESTRICTED_VOLUME_TYPES, workload["metadata"]["name"]


def test_the_hostpath_component_mounts_the_driver_read_only_at_the_nodes_paths():
    manifests = composed("overlays/ascend", "ascend-driver-hostpath")
    spec = pod_spec(ranker(manifests))
    host_paths = {v["name"]: v["hostPath"] for v in spec["volumes"] if "hostPath" in v}
    assert {h["path"] for h in host_paths.values()} == DRIVER_PATHS
    (container,) = containers(ranker(manifests))
    mounts = {m["name"]: m for m in container["volumeMounts"] if m["name"] in host_paths}
    assert mounts.keys() == host_paths.keys()
    for name, mount in mounts.items():
        # The same path inside as on the node (the Ascend guide's rule), read-only, type-checked by kubelet.
        assert mount["mountPath"] == host_paths[name]["path"] and mount["readOnly"] is True, name
        assert host_paths[name]["type"] in {"Directory", "File"}, name
    assert HWHIAIUSER_GID in spec["securityContext"]["supplementalGroups"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    for workload in workloads(manifests):
        if workload["metadata"]["name"] != "ranker":
            assert volume_types(workload) <= RESTRICTED_VOLUME_TYPES, workload["metadata"]["name"]


def test_the_hostpath_component_lowers_enforcement_and_keeps_restricted_warnings():
    """Both restricted and baseline refuse hostPath volumes: only privileged admits the ranker, and the
    warn and audit modes keep reporting it against restricted."""
    labels = named(composed("overlays/ascend", "ascend-driver-hostpath"), "Namespace", NAMESPACE)["metadata"][
        "labels"
    ]
    pss = {key.removeprefix(PSS_LABEL): value for key, value in labels.items() if key.startswith(PSS_LABEL)}
    assert pss == {"enforce": "privileged", "warn": "restricted", "audit": "restricted"}


def test_the_hostpath_composition_passes_strict_validation(tmp_path):
    rendered = render_composed("overlays/ascend", ("ascend-driver-hostpath",))
    assert unvalidated_kinds(rendered, tmp_path) == {"PodMonitor", "PrometheusRule"}
