#!/usr/bin/env python3
"""Derive the objects NVIDIA's GPU Operator writes for deploy/samples/clusterpolicy.yaml on
containerd / Ubuntu 22.04 nodes: NVIDIA's asset files plus the transforms its ClusterPolicy controller
applies (controllers/object_controls.go), re-stated here for this one policy. Usage:
  derive.py ASSETS OUT_DIR   (ASSETS: NVIDIA's assets/ folder at the commit named in README.md)"""
import copy, glob, sys, yaml, os

NS = "gpu-operator"
VALIDATOR = "nvcr.io/nvidia/gpu-operator:v26.7.0"
DS_LABELS = {"helm.sh/chart": "gpu-operator-v26.7.0", "app.kubernetes.io/managed-by": "gpu-operator"}
TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
OWNER = {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "name": "cluster-policy",
         "uid": "CLUSTER-POLICY-UID", "controller": True, "blockOwnerDeletion": True}
# Stand-ins: NVIDIA hashes Go's printing of its objects (go-spew); not reproduced here.
LAST_APPLIED_HASH = "NVIDIA-SPEW-FNV32"
DRIVER_DIGEST = "NVIDIA-DRIVER-CONFIG-DIGEST"

def env_set(ctr, name, value):
    for e in ctr.setdefault("env", []):
        if e["name"] == name:
            e["value"] = value
            e.pop("valueFrom", None)
            return
    ctr["env"].append({"name": name, "value": value})

def find(ctrs, name):
    return next(c for c in ctrs if c["name"] == name)

def validation_inits(pod):
    # transformValidationInitContainer / TransformValidatorComponent
    for c in pod.get("initContainers", []):
        if "validation" in c["name"]:
            c["image"] = VALIDATOR
            c["imagePullPolicy"] = "IfNotPresent"
            c.setdefault("securityContext", {})["runAsUser"] = 0

def drop_config_manager(pod):
    # handleDevicePluginConfig without devicePlugin.config.name
    pod["initContainers"] = [c for c in pod.get("initContainers", []) if c["name"] != "config-manager-init"]
    pod["containers"] = [c for c in pod["containers"] if c["name"] != "config-manager"]

def mig(ctr):  # applyMIGConfiguration, strategy single
    env_set(ctr, "MIG_STRATEGY", "single")
    env_set(ctr, "NVIDIA_MIG_MONITOR_DEVICES", "all")

def driver(pod):
    mgr = find(pod["initContainers"], "k8s-driver-manager")
    mgr["image"] = "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0"
    mgr["imagePullPolicy"] = "IfNotPresent"
    ctr = find(pod["containers"], "nvidia-driver-ctr")
    ctr["image"] = "nvcr.io/nvidia/driver:595.91.07-ubuntu22.04"  # resolveDriverTag: <version>-<os><VERSION_ID>
    ctr["imagePullPolicy"] = "IfNotPresent"
    env_set(ctr, "KERNEL_MODULE_TYPE", "auto")
    probe = ctr["startupProbe"]
    probe.update(initialDelaySeconds=60, periodSeconds=10, timeoutSeconds=60, failureThreshold=120)
    # rdma, gds, gdrcopy off; not OpenShift: sidecars removed
    drop = {"nvidia-peermem-ctr", "nvidia-fs-ctr", "nvidia-gdrcopy-ctr", "openshift-driver-toolkit-ctr"}
    pod["containers"] = [c for c in pod["containers"] if c["name"] not in drop]
    env_set(mgr, "DRIVER_CONFIG_DIGEST", DRIVER_DIGEST)
    env_set(ctr, "DRIVER_CONFIG_DIGEST", DRIVER_DIGEST)

def toolkit(pod):
    validation_inits(pod)
    ctr = find(pod["containers"], "nvidia-container-toolkit-ctr")
    ctr["image"] = "nvcr.io/nvidia/k8s/container-toolkit:v1.20.0"
    ctr["imagePullPolicy"] = "IfNotPresent"
    for k, v in [("CDI_ENABLED", "true"), ("NVIDIA_RUNTIME_SET_AS_DEFAULT", "false"),
                 ("NVIDIA_CONTAINER_RUNTIME_MODE", "cdi"), ("CRIO_CONFIG_MODE", "config"),
                 ("RUNTIME", "containerd"), ("CONTAINERD_RUNTIME_CLASS", "nvidia"),
                 ("RUNTIME_CONFIG", "/runtime/config-dir/config.toml"),
                 ("CONTAINERD_CONFIG", "/runtime/config-dir/config.toml")]:
        env_set(ctr, k, v)
    ctr["volumeMounts"].append({"name": "containerd-config", "mountPath": "/runtime/config-dir/"})
    pod["volumes"].append({"name": "containerd-config",
                           "hostPath": {"path": "/etc/containerd", "type": "DirectoryOrCreate"}})
    env_set(ctr, "RUNTIME_DROP_IN_CONFIG", "/runtime/config-dir.d/99-nvidia.toml")
    env_set(ctr, "RUNTIME_DROP_IN_CONFIG_HOST_PATH", "/etc/containerd/conf.d/99-nvidia.toml")
    ctr["volumeMounts"].append({"name": "containerd-drop-in-config", "mountPath": "/runtime/config-dir.d/"})
    pod["volumes"].append({"name": "containerd-drop-in-config",
                           "hostPath": {"path": "/etc/containerd/conf.d", "type": "DirectoryOrCreate"}})
    env_set(ctr, "RUNTIME_SOCKET", "/runtime/sock-dir/containerd.sock")
    env_set(ctr, "CONTAINERD_SOCKET", "/runtime/sock-dir/containerd.sock")
    ctr["volumeMounts"].append({"name": "containerd-socket", "mountPath": "/runtime/sock-dir/"})
    pod["volumes"].append({"name": "containerd-socket", "hostPath": {"path": "/run/containerd"}})

def device_plugin(pod):
    validation_inits(pod)
    ctr = find(pod["containers"], "nvidia-device-plugin")
    ctr["image"] = "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    ctr["imagePullPolicy"] = "IfNotPresent"
    drop_config_manager(pod)
    pod["runtimeClassName"] = "nvidia"
    mig(ctr)
    env_set(ctr, "CDI_ENABLED", "true")
    env_set(ctr, "DEVICE_LIST_STRATEGY", "cdi-annotations,cdi-cri")
    env_set(ctr, "CDI_ANNOTATION_PREFIX", "cdi.k8s.io/")
    env_set(ctr, "NVIDIA_CDI_HOOK_PATH", "/usr/local/nvidia/toolkit/nvidia-cdi-hook")

def mps(pod):
    validation_inits(pod)
    image = "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    init = find(pod["initContainers"], "mps-control-daemon-mounts")
    init["image"], init["imagePullPolicy"] = image, "IfNotPresent"
    ctr = find(pod["containers"], "mps-control-daemon-ctr")
    ctr["image"], ctr["imagePullPolicy"] = image, "IfNotPresent"
    drop_config_manager(pod)
    pod["runtimeClassName"] = "nvidia"
    mig(ctr)

def dcgm_exporter(pod):
    validation_inits(pod)
    ctr = pod["containers"][0]
    ctr["image"] = "nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-distroless"
    ctr["imagePullPolicy"] = "IfNotPresent"
    pod["runtimeClassName"] = "nvidia"

def gfd(pod):
    validation_inits(pod)
    ctr = pod["containers"][0]
    ctr["image"] = "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    ctr["imagePullPolicy"] = "IfNotPresent"
    drop_config_manager(pod)
    pod["runtimeClassName"] = "nvidia"
    mig(pod["containers"][0])

def mig_manager(pod):
    validation_inits(pod)
    ctr = pod["containers"][0]
    ctr["image"] = "nvcr.io/nvidia/cloud-native/k8s-mig-manager:v0.15.0"
    ctr["imagePullPolicy"] = "IfNotPresent"
    pod["runtimeClassName"] = "nvidia"
    for v in pod["volumes"]:
        if "mig-parted-config" in v["name"]:
            v["configMap"]["name"] = "default-mig-parted-config"
            v["configMap"]["items"] = [{"key": "config.yaml", "path": "config-default.yaml"}]
            break
    env_set(ctr, "DEFAULT_CONFIG_FILE", "/mig-parted-config/config-default.yaml")
    for v in pod["volumes"]:
        if "gpu-clients" in v["name"]:
            v["configMap"]["name"] = "default-gpu-clients"
            break
    env_set(ctr, "CDI_ENABLED", "true")
    env_set(ctr, "NVIDIA_CDI_HOOK_PATH", "/usr/local/nvidia/toolkit/nvidia-cdi-hook")

def validator(pod):
    ctr = pod["containers"][0]  # TransformValidatorShared
    ctr["image"] = VALIDATOR
    ctr["imagePullPolicy"] = "IfNotPresent"
    ctr.setdefault("securityContext", {})["runAsUser"] = 0
    pod["runtimeClassName"] = "nvidia"
    validation_inits(pod)
    for c in pod["initContainers"]:
        if c["name"] in ("cuda-validation", "plugin-validation"):
            env_set(c, "VALIDATOR_IMAGE", VALIDATOR)
            env_set(c, "VALIDATOR_IMAGE_PULL_POLICY", "IfNotPresent")
            env_set(c, "VALIDATOR_RUNTIME_CLASS", "nvidia")
        if c["name"] == "plugin-validation":
            env_set(c, "MIG_STRATEGY", "single")

TRANSFORMS = {
    "state-driver": driver, "state-container-toolkit": toolkit, "state-operator-validation": validator,
    "state-device-plugin": device_plugin, "state-mps-control-daemon": mps,
    "state-dcgm-exporter": dcgm_exporter, "gpu-feature-discovery": gfd, "state-mig-manager": mig_manager,
}

def derive(state, ds):
    ds["metadata"]["namespace"] = NS
    spec, pod = ds["spec"], ds["spec"]["template"]["spec"]
    # applyCommonDaemonsetConfig: updateStrategy (never for the driver), priorityClass, tolerations
    if not ds["metadata"]["name"].startswith("nvidia-driver-daemonset"):
        spec["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    pod["priorityClassName"] = "system-node-critical"
    pod["tolerations"] = copy.deepcopy(TOLERATIONS)
    TRANSFORMS[state](pod)
    # applyCommonDaemonsetMetadata: daemonsets.labels onto the pod template (except app, part-of)
    spec["template"]["metadata"].setdefault("labels", {}).update(DS_LABELS)
    # DaemonSet(): controller reference, daemonsets.labels on the object, the hash annotation
    ds["metadata"]["ownerReferences"] = [dict(OWNER)]
    ds["metadata"].setdefault("labels", {}).update(DS_LABELS)
    ds["metadata"].setdefault("annotations", {})["nvidia.com/last-applied-hash"] = LAST_APPLIED_HASH
    return ds

# RBAC gated off for this policy (rbacGates: the exporter reads pods only with pod metadata enabled).
GATED = {"nvidia-dcgm-exporter-read-pods"}
NAMESPACED = {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "DaemonSet"}

def other(obj):
    # ServiceAccount(), Role(), RoleBinding(), ClusterRole(), ClusterRoleBinding(), createConfigMap():
    # the operator namespace, subjects in it, a controller reference to the ClusterPolicy; content as is.
    meta = obj["metadata"]
    if obj["kind"] in NAMESPACED:
        meta["namespace"] = NS
    else:
        meta.pop("namespace", None)
    for subject in obj.get("subjects", []):
        subject["namespace"] = NS
    meta["ownerReferences"] = [dict(OWNER)]
    return obj

if __name__ == "__main__":
    src, out = sys.argv[1], sys.argv[2]
    for state in TRANSFORMS:
        for path in sorted(glob.glob(os.path.join(src, state, "*.yaml"))):
            if "openshift" in path:
                continue
            with open(path) as f:
                obj = yaml.safe_load(f)
            kind, name = obj["kind"], obj["metadata"]["name"]
            if kind not in NAMESPACED | {"ClusterRole", "ClusterRoleBinding"} or name in GATED:
                continue  # Services, ServiceMonitors: see README.md
            obj = derive(state, obj) if kind == "DaemonSet" else other(obj)
            file = "%s-%s.yaml" % (kind.lower(), name)
            with open(os.path.join(out, file), "w") as f:
                f.write("# Derived by derive.py from NVIDIA's assets/%s/%s; see README.md.\n"
                        % (state, os.path.basename(path)))
                yaml.safe_dump(obj, f, sort_keys=False, default_flow_style=False, width=110)
