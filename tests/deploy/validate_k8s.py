#!/usr/bin/env python3
"""Offline validation of rendered Kubernetes manifests (deploy/k8s).

    kubectl kustomize deploy/k8s/overlays/cpu | validate_k8s.py [--binaries DIR] [FILE ...]
    validate_k8s.py --self-test

Reads YAML documents (stdin, or FILEs) and checks every object:

1. Schema. Each object is walked against the Kubernetes API schema that the
   Debian package python3-kubernetes ships (kubernetes.client models: each
   class has `openapi_types`, attribute -> type, and `attribute_map`,
   attribute -> JSON name). apiVersion + kind find the model through the
   client's API classes (apps/v1 StatefulSet -> AppsV1Api.
   create_namespaced_stateful_set -> V1StatefulSet, which also says whether
   the kind is namespaced). Unknown fields, wrong types (str, int, float,
   bool, list, map, quantity, int-or-string) and missing required fields are
   errors; the required fields of a model are found by constructing it with
   client-side validation on, leaving out one field at a time. A few enums
   (the client checks none) are listed below. Fields newer than the client's
   API (python3-kubernetes 22 = Kubernetes 1.22) are added by hand:
   Probe.grpc (Kubernetes 1.24+). The ServiceMonitor (a CRD of the
   Prometheus Operator) has a hand-written schema of the fields used here.
2. References between objects: workload selectors match their pod templates;
   Services, PodDisruptionBudgets and ServiceMonitors select something and
   name ports that exist; ConfigMaps mounted (and flagfiles read from them)
   exist; volume mounts name volumes; $(VAR) in args names an env var of the
   container (Kubernetes leaves an unknown one as literal text).
3. Fulcrum's contract: --port/--metrics-port agree with the container ports,
   the probes and the prometheus.io/port annotation; servers and workers
   advertise a reachable --host and find the scheduler through a Service
   that selects it; --data-dir sits on a persistent volume; servers run in a
   StatefulSet with time to drain; requests and limits set; non-root.
   With --binaries DIR (the fulcrum-* executables), every flag in args and
   in flagfiles must be one the binary defines (from `--helpfull`).

Prints what it checked; on a problem, names the object and the field path
and exits 1.
"""

import argparse
import copy
import difflib
import os
import re
import subprocess
import sys

import yaml

try:
    import kubernetes
    import kubernetes.client as kclient
except ImportError:  # check_k8s.sh tests this before calling us
    sys.stderr.write("validate_k8s: python3-kubernetes is not installed\n")
    sys.exit(77)


# ---------------------------------------------------------------- schemas ---

class Schema:
    """One object type: JSON field name -> type string, required names, enums."""

    def __init__(self, name, fields, required=(), enums=None, model=None):
        self.name = name
        self.fields = fields  # json name -> (attribute name, type string)
        self.required = set(required)
        self.enums = enums or {}  # json name -> allowed values
        self.model = model


# Fields of the hand-written schemas are JSON names with their types, in the
# client's notation ('str', 'int', 'list[X]', 'dict(str, X)', model names).
HAND_SCHEMAS = {
    # core/v1 GRPCAction: Probe.grpc, Kubernetes 1.24 (beta) / 1.27 (GA).
    "GRPCAction": ({"port": "int", "service": "str"}, ["port"], {}),
    # monitoring.coreos.com/v1 ServiceMonitor: the fields Fulcrum uses and
    # their closest neighbours.
    "ServiceMonitor": ({"apiVersion": "str", "kind": "str", "metadata": "V1ObjectMeta",
                        "spec": "ServiceMonitorSpec"},
                       ["apiVersion", "kind", "metadata", "spec"], {}),
    "ServiceMonitorSpec": ({"endpoints": "list[ServiceMonitorEndpoint]", "selector": "V1LabelSelector",
                            "namespaceSelector": "NamespaceSelector", "jobLabel": "str",
                            "targetLabels": "list[str]", "podTargetLabels": "list[str]",
                            "sampleLimit": "int"},
                           ["endpoints", "selector"], {}),
    "ServiceMonitorEndpoint": ({"port": "str", "targetPort": "object", "path": "str", "scheme": "str",
                                "interval": "duration", "scrapeTimeout": "duration",
                                "honorLabels": "bool", "honorTimestamps": "bool",
                                "params": "dict(str, list[str])",
                                "relabelings": "list[RelabelConfig]",
                                "metricRelabelings": "list[RelabelConfig]"},
                               [], {"scheme": {"http", "https"}}),
    "NamespaceSelector": ({"any": "bool", "matchNames": "list[str]"}, [], {}),
    "RelabelConfig": ({"sourceLabels": "list[str]", "separator": "str", "targetLabel": "str",
                       "regex": "str", "modulus": "int", "replacement": "str", "action": "str"},
                      [], {"action": {"replace", "keep", "drop", "hashmod", "labelmap", "labeldrop",
                                      "labelkeep", "lowercase", "uppercase", "keepequal", "dropequal",
                                      "Replace", "Keep", "Drop", "HashMod", "LabelMap", "LabelDrop",
                                      "LabelKeep", "Lowercase", "Uppercase", "KeepEqual", "DropEqual"}}),
}

# Kinds outside the client's API: (apiVersion, kind) -> (schema, namespaced).
HAND_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"): ("ServiceMonitor", True)}

# Fields the client's models lack because they are newer than its API.
EXTRA_FIELDS = {"V1Probe": {"grpc": "GRPCAction"}}

# Quantities ("500m", "1Gi", or a plain number) are typed 'str' by the client.
TYPE_OVERRIDES = {
    ("V1ResourceRequirements", "limits"): "dict(str, quantity)",
    ("V1ResourceRequirements", "requests"): "dict(str, quantity)",
    ("V1ResourceFieldSelector", "divisor"): "quantity",
    ("V1EmptyDirVolumeSource", "sizeLimit"): "quantity",
}

# Enums the API server enforces (the client checks none of them).
ENUMS = {
    "V1Container": {"imagePullPolicy": {"Always", "IfNotPresent", "Never"},
                    "terminationMessagePolicy": {"File", "FallbackToLogsOnError"}},
    "V1ContainerPort": {"protocol": {"TCP", "UDP", "SCTP"}},
    "V1ServicePort": {"protocol": {"TCP", "UDP", "SCTP"}},
    "V1ServiceSpec": {"type": {"ClusterIP", "NodePort", "LoadBalancer", "ExternalName"},
                      "sessionAffinity": {"None", "ClientIP"},
                      "externalTrafficPolicy": {"Cluster", "Local"}},
    "V1PodSpec": {"restartPolicy": {"Always", "OnFailure", "Never"},
                  "dnsPolicy": {"ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"}},
    "V1Toleration": {"operator": {"Exists", "Equal"},
                     "effect": {"NoSchedule", "PreferNoSchedule", "NoExecute"}},
    "V1StatefulSetSpec": {"podManagementPolicy": {"OrderedReady", "Parallel"}},
    "V1StatefulSetUpdateStrategy": {"type": {"RollingUpdate", "OnDelete"}},
    "V1DeploymentStrategy": {"type": {"RollingUpdate", "Recreate"}},
    "V1PersistentVolumeClaimSpec": {"accessModes": {"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany",
                                                    "ReadWriteOncePod"},
                                    "volumeMode": {"Filesystem", "Block"}},
    "V1SeccompProfile": {"type": {"RuntimeDefault", "Localhost", "Unconfined"}},
    "V1PodSecurityContext": {"fsGroupChangePolicy": {"OnRootMismatch", "Always"}},
    "V1LabelSelectorRequirement": {"operator": {"In", "NotIn", "Exists", "DoesNotExist"}},
    "V1NodeSelectorRequirement": {"operator": {"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"}},
}

# API versions the API server no longer serves (removed in the given release).
REMOVED_APIS = {
    ("policy/v1beta1", "PodDisruptionBudget"): "1.25",
    ("batch/v1beta1", "CronJob"): "1.25",
    ("autoscaling/v2beta1", "HorizontalPodAutoscaler"): "1.25",
    ("autoscaling/v2beta2", "HorizontalPodAutoscaler"): "1.26",
    ("extensions/v1beta1", "Deployment"): "1.16",
    ("extensions/v1beta1", "Ingress"): "1.22",
    ("apps/v1beta1", "StatefulSet"): "1.16",
    ("apps/v1beta2", "StatefulSet"): "1.16",
    ("apps/v1beta1", "Deployment"): "1.16",
    ("apps/v1beta2", "Deployment"): "1.16",
}

_schemas = {}


def _required_attributes(cls, attrs):
    """The attributes whose setter refuses None under client-side validation."""
    config = kclient.Configuration()
    config.client_side_validation = True
    required = set()
    for attr in attrs:
        kwargs = {a: ("x" if a != attr else None) for a in attrs}
        try:
            cls(local_vars_configuration=config, **kwargs)
        except ValueError as e:
            if "must not be `None`" in str(e):
                required.add(attr)
        except Exception:  # a setter that checks its placeholder value
            pass
    return required


def get_schema(type_name):
    if type_name in _schemas:
        return _schemas[type_name]
    if type_name in HAND_SCHEMAS:
        fields, required, enums = HAND_SCHEMAS[type_name]
        schema = Schema(type_name, {k: (k, t) for k, t in fields.items()}, required, enums)
    else:
        cls = getattr(kclient, type_name, None)
        if cls is None or not hasattr(cls, "openapi_types"):
            raise KeyError(type_name)
        fields = {}
        for attr, t in cls.openapi_types.items():
            json_name = cls.attribute_map[attr]
            fields[json_name] = (attr, TYPE_OVERRIDES.get((type_name, json_name), t))
        for json_name, t in EXTRA_FIELDS.get(type_name, {}).items():
            fields[json_name] = (json_name, t)
        required_attrs = _required_attributes(cls, list(cls.openapi_types))
        required = {cls.attribute_map[a] for a in required_attrs}
        schema = Schema(type_name, fields, required, ENUMS.get(type_name, {}), cls)
    _schemas[type_name] = schema
    return schema


def resolve_kind(api_version, kind):
    """(schema name, namespaced) of apiVersion+kind, or None if unknown."""
    if (api_version, kind) in HAND_KINDS:
        return HAND_KINDS[(api_version, kind)]
    group, _, version = api_version.rpartition("/")
    if group:
        api_prefix = "".join(p.capitalize() for p in re.sub(r"\.k8s\.io$", "", group).split("."))
    else:
        api_prefix = "Core"
    api = getattr(kclient, "%s%sApi" % (api_prefix, version.capitalize()), None)
    if api is None:
        return None
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower()
    for method, namespaced in (("create_namespaced_" + snake, True), ("create_" + snake, False)):
        fn = getattr(api, method, None)
        if fn is None or not fn.__doc__:
            continue
        m = re.search(r":return: (\w+)", fn.__doc__)
        if m and hasattr(kclient, m.group(1)):
            return m.group(1), namespaced
    return None


# ------------------------------------------------------------- the walker ---

QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[numkMGTPE]|[KMGTPE]i)?$")
DURATION = re.compile(r"^(0|(\d+(ms|s|m|h|d|w|y))+)$")


def _describe(value):
    if isinstance(value, bool):
        return "bool %r" % value
    if isinstance(value, (dict, list)):
        return type(value).__name__
    return "%s %r" % (type(value).__name__, value)


def _join(path, key):
    if re.match(r"^[A-Za-z_$][A-Za-z0-9_$]*$", key):
        return "%s.%s" % (path, key) if path else key
    return '%s["%s"]' % (path, key)


class Report:
    def __init__(self):
        self.errors = []

    def error(self, obj_name, path, message):
        self.errors.append("%s: %s: %s" % (obj_name, path or "(object)", message))


def check_value(value, type_str, path, obj, report):
    """Checks one value against a type string of the client's notation."""
    if value is None:
        return
    m = re.match(r"^list\[(.*)\]$", type_str)
    if m:
        if not isinstance(value, list):
            report.error(obj, path, "expected a list, got %s" % _describe(value))
            return
        for i, item in enumerate(value):
            check_value(item, m.group(1), "%s[%d]" % (path, i), obj, report)
        return
    m = re.match(r"^dict\(str, (.*)\)$", type_str)
    if m:
        if not isinstance(value, dict):
            report.error(obj, path, "expected a map, got %s" % _describe(value))
            return
        for k, v in value.items():
            if not isinstance(k, str):
                report.error(obj, path, "map key %r is not a string" % (k,))
                continue
            check_value(v, m.group(1), _join(path, k), obj, report)
        return
    if type_str == "str":
        if not isinstance(value, str):
            report.error(obj, path, "expected a string, got %s (quote it)" % _describe(value))
    elif type_str == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            report.error(obj, path, "expected an integer, got %s" % _describe(value))
    elif type_str == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            report.error(obj, path, "expected a number, got %s" % _describe(value))
    elif type_str == "bool":
        if not isinstance(value, bool):
            report.error(obj, path, "expected true or false, got %s" % _describe(value))
    elif type_str in ("datetime", "date"):
        if not isinstance(value, str) and not hasattr(value, "isoformat"):
            report.error(obj, path, "expected a timestamp, got %s" % _describe(value))
    elif type_str == "object":  # IntOrString in the kinds used here
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            report.error(obj, path, "expected an integer or a string, got %s" % _describe(value))
    elif type_str == "quantity":
        if isinstance(value, bool) or not isinstance(value, (int, float, str)) or \
                not QUANTITY.match(str(value)):
            report.error(obj, path, "not a Kubernetes quantity (e.g. 500m, 2, 1Gi): %s" % _describe(value))
    elif type_str == "duration":
        if not isinstance(value, str) or not DURATION.match(value):
            report.error(obj, path, "not a Prometheus duration (e.g. 15s, 1m): %s" % _describe(value))
    else:
        check_object(value, get_schema(type_str), path, obj, report)


def check_object(value, schema, path, obj, report):
    if not isinstance(value, dict):
        report.error(obj, path, "expected an object (%s), got %s" % (schema.name, _describe(value)))
        return
    for key, item in value.items():
        if key not in schema.fields:
            close = difflib.get_close_matches(str(key), list(schema.fields), n=1)
            hint = " (did you mean %s?)" % close[0] if close else ""
            report.error(obj, _join(path, str(key)), "unknown field of %s%s" % (schema.name, hint))
            continue
        _, type_str = schema.fields[key]
        check_value(item, type_str, _join(path, key), obj, report)
        allowed = schema.enums.get(key)
        if allowed and item is not None:
            for i, v in enumerate(item if isinstance(item, list) else [item]):
                if v not in allowed:
                    where = _join(path, key) + ("[%d]" % i if isinstance(item, list) else "")
                    report.error(obj, where, "%r is not one of %s" % (v, ", ".join(sorted(allowed))))
    for key in sorted(schema.required):
        if value.get(key) is None:
            report.error(obj, _join(path, key), "missing required field of %s" % schema.name)


# ------------------------------------------------------ object references ---

def name_of(doc):
    meta = doc.get("metadata") or {}
    ns = meta.get("namespace")
    return "%s %s%s" % (doc.get("kind"), ns + "/" if ns else "", meta.get("name"))


WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
VAR_REF = re.compile(r"(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def selector_matches(selector, labels):
    """matchLabels/matchExpressions of a LabelSelector against labels."""
    if not selector:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


class Cluster:
    """The rendered objects, indexed for the reference checks."""

    def __init__(self, docs):
        self.docs = docs
        self.by_kind = {}
        for d in docs:
            self.by_kind.setdefault(d.get("kind"), []).append(d)

    def get(self, kind, namespace, name):
        for d in self.by_kind.get(kind, []):
            meta = d.get("metadata") or {}
            if meta.get("name") == name and meta.get("namespace") == namespace:
                return d
        return None

    def pod_templates(self, namespace=None):
        """(workload doc, pod template) pairs."""
        for kind in WORKLOAD_KINDS:
            for d in self.by_kind.get(kind, []):
                if namespace is not None and (d.get("metadata") or {}).get("namespace") != namespace:
                    continue
                template = ((d.get("spec") or {}).get("template")) or {}
                yield d, template


def _labels(template):
    return ((template.get("metadata") or {}).get("labels")) or {}


def container_ports(template):
    """name -> number and the set of numbers of a pod template's containers."""
    named, numbers = {}, set()
    for c in ((template.get("spec") or {}).get("containers")) or []:
        for p in c.get("ports") or []:
            numbers.add(p.get("containerPort"))
            if p.get("name"):
                named[p["name"]] = p.get("containerPort")
    return named, numbers


def check_metadata(doc, namespaced, report):
    obj = name_of(doc)
    meta = doc.get("metadata") or {}
    name = meta.get("name")
    if not name:
        report.error(obj, "metadata.name", "missing")
    elif doc.get("kind") == "Service" and not DNS1035_LABEL.match(name):
        report.error(obj, "metadata.name", "a Service name must be a DNS-1035 label (a-z, 0-9, -)")
    elif not DNS1123_SUBDOMAIN.match(name) or len(name) > 253:
        report.error(obj, "metadata.name", "not a DNS-1123 subdomain: %r" % name)
    if namespaced and not meta.get("namespace"):
        report.error(obj, "metadata.namespace", "a namespaced object without a namespace")
    if not namespaced and meta.get("namespace"):
        report.error(obj, "metadata.namespace", "%s is cluster-scoped" % doc.get("kind"))
    for where, labels in (("metadata.labels", meta.get("labels")),):
        for k, v in (labels or {}).items():
            if isinstance(v, str) and (len(v) > 63 or not LABEL_VALUE.match(v)):
                report.error(obj, _join(where, k), "not a valid label value: %r" % v)


def check_pod_template(doc, template, cluster, report, binaries):
    obj = name_of(doc)
    base = "spec.template"
    ns = (doc.get("metadata") or {}).get("namespace")
    spec = template.get("spec") or {}
    labels = _labels(template)
    selector = (doc.get("spec") or {}).get("selector")
    if doc.get("kind") != "Job" and not selector_matches(selector, labels):
        report.error(obj, "spec.selector", "does not match the pod template's labels %s" % labels)
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    claims = {(c.get("metadata") or {}).get("name")
              for c in (doc.get("spec") or {}).get("volumeClaimTemplates") or []}
    sa = spec.get("serviceAccountName")
    if sa and not cluster.get("ServiceAccount", ns, sa):
        report.error(obj, base + ".spec.serviceAccountName", "no ServiceAccount %r in the manifests" % sa)
    for vi, vol in enumerate(spec.get("volumes") or []):
        cm = vol.get("configMap")
        if cm and not cm.get("optional") and not cluster.get("ConfigMap", ns, cm.get("name")):
            report.error(obj, "%s.spec.volumes[%d].configMap.name" % (base, vi),
                         "no ConfigMap %r in the manifests" % cm.get("name"))
    sc = spec.get("securityContext") or {}
    for ci, c in enumerate(spec.get("containers") or []):
        cpath = "%s.spec.containers[%d]" % (base, ci)
        mounts = {}
        for mi, m in enumerate(c.get("volumeMounts") or []):
            if m.get("name") not in volumes and m.get("name") not in claims:
                report.error(obj, "%s.volumeMounts[%d].name" % (cpath, mi),
                             "no volume or volumeClaimTemplate named %r" % m.get("name"))
            if m.get("mountPath") in mounts:
                report.error(obj, "%s.volumeMounts[%d].mountPath" % (cpath, mi),
                             "%s is mounted twice" % m.get("mountPath"))
            mounts[m.get("mountPath")] = m.get("name")
        env_names = {e.get("name") for e in c.get("env") or []}
        has_env_from = bool(c.get("envFrom"))
        for field in ("command", "args"):
            for ai, arg in enumerate(c.get(field) or []):
                for var in VAR_REF.findall(str(arg)):
                    if var not in env_names and not has_env_from:
                        report.error(obj, "%s.%s[%d]" % (cpath, field, ai),
                                     "$(%s) is not an env var of the container (it would stay literal)" % var)
        res = c.get("resources") or {}
        for kind in ("requests", "limits"):
            for r in ("cpu", "memory"):
                if r not in (res.get(kind) or {}):
                    report.error(obj, "%s.resources.%s.%s" % (cpath, kind, r), "not set")
        csc = c.get("securityContext") or {}
        if not (csc.get("runAsNonRoot") or sc.get("runAsNonRoot")):
            report.error(obj, cpath + ".securityContext.runAsNonRoot", "containers must run as non-root")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            p = c.get(probe)
            if p is None:
                report.error(obj, "%s.%s" % (cpath, probe), "not set")
                continue
            named, numbers = container_ports(template)
            for action in ("grpc", "tcpSocket", "httpGet"):
                port = (p.get(action) or {}).get("port")
                if port is None:
                    continue
                if isinstance(port, str) and port not in named:
                    report.error(obj, "%s.%s.%s.port" % (cpath, probe, action), "no container port named %r" % port)
                elif isinstance(port, int) and port not in numbers:
                    report.error(obj, "%s.%s.%s.port" % (cpath, probe, action),
                                 "%d is not a container port" % port)
        check_fulcrum_container(doc, template, c, cpath, mounts, volumes, claims, cluster, report, binaries)


# ------------------------------------------------------ Fulcrum contract ---

FULCRUM_BINARIES = ("fulcrum-scheduler", "fulcrum-server", "fulcrum-worker")
_help_flags = {}


def binary_flags(binaries, binary):
    """Flag names a binary defines (parsed from --helpfull), or None."""
    if binary not in _help_flags:
        path = os.path.join(binaries, binary)
        flags = None
        if os.access(path, os.X_OK):
            try:
                out = subprocess.run([path, "--helpfull"], capture_output=True, text=True, timeout=20)
                found = set(re.findall(r"^\s+--([A-Za-z0-9_]+) \(", out.stdout + out.stderr, re.M))
                flags = found or None
            except (OSError, subprocess.SubprocessError):
                flags = None
        _help_flags[binary] = flags
    return _help_flags[binary]


def parse_args(args):
    """--name=value (or --name value) -> {name with underscores: value}."""
    flags, i = {}, 0
    while i < len(args):
        a = str(args[i])
        if a.startswith("--") and len(a) > 2:
            name, eq, value = a[2:].partition("=")
            if not eq and i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
                value, i = str(args[i + 1]), i + 1
            flags[name.replace("-", "_")] = (value, a)
        i += 1
    return flags


def flagfile_lines(path, mounts, volumes, cluster, ns):
    """The content of a file under a ConfigMap mount, or None."""
    for mount_path, vol_name in mounts.items():
        prefix = mount_path.rstrip("/") + "/"
        if not path.startswith(prefix):
            continue
        cm = (volumes.get(vol_name) or {}).get("configMap")
        if not cm:
            return None
        key = path[len(prefix):]
        for item in cm.get("items") or []:
            if item.get("path") == key:
                key = item.get("key")
        doc = cluster.get("ConfigMap", ns, cm.get("name"))
        if doc is None:
            return None
        return (doc.get("data") or {}).get(key, KeyError(key))
    return None


def check_fulcrum_container(doc, template, c, cpath, mounts, volumes, claims, cluster, report, binaries):
    command = c.get("command") or []
    binary = os.path.basename(str(command[0])) if command else ""
    if binary not in FULCRUM_BINARIES:
        return
    obj = name_of(doc)
    ns = (doc.get("metadata") or {}).get("namespace")
    args = [str(a) for a in (c.get("args") or [])] + [str(a) for a in command[1:]]
    flags = parse_args(args)
    env = {e.get("name"): e for e in c.get("env") or []}
    known = binary_flags(binaries, binary) if binaries else None
    if known is not None:
        for name, (_, raw) in flags.items():
            if name not in known:
                report.error(obj, cpath + ".args", "%s does not define %s" % (binary, raw))
    # Flagfiles: present in their ConfigMap, one --flag=value a line with
    # underscores (the dashed spelling is accepted on the command line only).
    for flagfile in str(flags.get("flagfile", ("", ""))[0]).split(","):
        if not flagfile:
            continue
        content = flagfile_lines(flagfile, mounts, volumes, cluster, ns)
        if content is None or isinstance(content, KeyError):
            report.error(obj, cpath + ".args", "--flagfile=%s is not a key of a ConfigMap mounted there" % flagfile)
            continue
        for ln, line in enumerate(str(content).splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            m = re.match(r"^--([A-Za-z0-9_]+)(=.*)?$", line)
            where = "%s.args (--flagfile=%s line %d)" % (cpath, flagfile, ln)
            if not m:
                report.error(obj, where, "%r: a flagfile line is --name=value (underscores)" % line)
            elif known is not None and m.group(1) not in known:
                report.error(obj, where, "%s does not define --%s" % (binary, m.group(1)))
            elif m.group(1) in flags:
                report.error(obj, where, "--%s is also given in args" % m.group(1))
    named, _ = container_ports(template)
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    grpc_port = flags.get("port", (None,))[0]
    metrics_port = flags.get("metrics_port", (None,))[0]
    if grpc_port is None or str(named.get("grpc")) != grpc_port:
        report.error(obj, cpath + ".args", "--port (%s) must be the container port named grpc (%s)"
                     % (grpc_port, named.get("grpc")))
    if metrics_port is None or str(named.get("metrics")) != metrics_port:
        report.error(obj, cpath + ".args", "--metrics-port (%s) must be the container port named metrics (%s)"
                     % (metrics_port, named.get("metrics")))
    if annotations.get("prometheus.io/scrape") != "true" or annotations.get("prometheus.io/port") != metrics_port:
        report.error(obj, "spec.template.metadata.annotations",
                     'prometheus.io/scrape must be "true" and prometheus.io/port the --metrics-port (%s)' % metrics_port)
    tlabels = _labels(template)
    role = binary[len("fulcrum-"):]
    if tlabels.get("app.kubernetes.io/part-of") != "fulcrum" or tlabels.get("app.kubernetes.io/component") != role:
        report.error(obj, "spec.template.metadata.labels",
                     "app.kubernetes.io/part-of: fulcrum and app.kubernetes.io/component: %s are what "
                     "deploy/prometheus/kubernetes.yml and the ServiceMonitor rely on" % role)
    host = flags.get("host", ("127.0.0.1",))[0]
    if binary != "fulcrum-scheduler":
        # Servers and workers advertise --host to the scheduler and the workers.
        if host in ("127.0.0.1", "localhost", "0.0.0.0", "::", ""):
            report.error(obj, cpath + ".args", "--host=%s is advertised to the cluster: use $(POD_IP)" % host)
        for var in VAR_REF.findall(host):
            ref = ((env.get(var) or {}).get("valueFrom") or {}).get("fieldRef") or {}
            if ref.get("fieldPath") != "status.podIP":
                report.error(obj, cpath + ".env", "%s (in --host) must come from fieldRef status.podIP" % var)
        check_scheduler_address(doc, flags, cpath, cluster, report)
    if binary == "fulcrum-worker":
        device = flags.get("device", ("auto",))[0]
        limits = (c.get("resources") or {}).get("limits") or {}
        gpus = limits.get("nvidia.com/gpu")
        if device.startswith("cuda") and not gpus:
            report.error(obj, cpath + ".resources.limits", "--device=%s needs an nvidia.com/gpu limit" % device)
        if device == "cpu" and gpus:
            report.error(obj, cpath + ".resources.limits", "nvidia.com/gpu for a worker with --device=cpu")
    if binary in ("fulcrum-scheduler", "fulcrum-server"):
        data_dir = flags.get("data_dir", (None,))[0]
        if not data_dir:
            report.error(obj, cpath + ".args", "%s needs --data-dir on a persistent volume" % binary)
        else:
            under = [p for p in mounts if data_dir == p or data_dir.startswith(p.rstrip("/") + "/")]
            vol = mounts.get(max(under, key=len)) if under else None
            persistent = vol in claims or bool((volumes.get(vol) or {}).get("persistentVolumeClaim"))
            if not persistent:
                report.error(obj, cpath + ".args", "--data-dir=%s is not on a persistent volume" % data_dir)
    if binary == "fulcrum-server":
        if doc.get("kind") != "StatefulSet":
            report.error(obj, "kind", "servers need a StatefulSet: a stable --id and volume for checkpoint restore")
        grace = (template.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        if grace < 35:
            report.error(obj, "spec.template.spec.terminationGracePeriodSeconds",
                         "%s s: a server drains its shards for up to 30 s on SIGTERM" % grace)
        id_flag = flags.get("id", ("",))[0]
        for var in VAR_REF.findall(id_flag):
            ref = ((env.get(var) or {}).get("valueFrom") or {}).get("fieldRef") or {}
            if ref.get("fieldPath") != "metadata.name":
                report.error(obj, cpath + ".env", "%s (in --id) must come from fieldRef metadata.name" % var)


def check_scheduler_address(doc, flags, cpath, cluster, report):
    obj = name_of(doc)
    ns = (doc.get("metadata") or {}).get("namespace")
    address = flags.get("scheduler", ("",))[0]
    m = re.match(r"^([a-z0-9-]+)(\.([a-z0-9-]+))?(\.svc(\.[a-z0-9.-]+)?)?:(\d+)$", address)
    if not m:
        report.error(obj, cpath + ".args", "--scheduler=%r is not SERVICE[.NAMESPACE[.svc...]]:PORT" % address)
        return
    svc_ns = m.group(3) or ns
    svc = cluster.get("Service", svc_ns, m.group(1))
    if svc is None:
        report.error(obj, cpath + ".args", "--scheduler: no Service %s/%s in the manifests" % (svc_ns, m.group(1)))
        return
    ports = [p.get("port") for p in (svc.get("spec") or {}).get("ports") or []]
    if int(m.group(6)) not in ports:
        report.error(obj, cpath + ".args", "--scheduler: Service %s has no port %s" % (m.group(1), m.group(6)))
    selector = (svc.get("spec") or {}).get("selector") or {}
    if not any(selector and selector_matches({"matchLabels": selector}, _labels(t)) and
               any(os.path.basename(str((c.get("command") or [""])[0])) == "fulcrum-scheduler"
                   for c in (t.get("spec") or {}).get("containers") or [])
               for _, t in cluster.pod_templates(svc_ns)):
        report.error(obj, cpath + ".args", "--scheduler: Service %s does not select the scheduler's pods" % m.group(1))


def check_service(doc, cluster, report):
    obj = name_of(doc)
    spec = doc.get("spec") or {}
    selector = spec.get("selector")
    if not selector:
        return
    ns = (doc.get("metadata") or {}).get("namespace")
    matched = [t for _, t in cluster.pod_templates(ns) if selector_matches({"matchLabels": selector}, _labels(t))]
    if not matched:
        report.error(obj, "spec.selector", "selects no pod template in the manifests")
        return
    for i, port in enumerate(spec.get("ports") or []):
        target = port.get("targetPort", port.get("port"))
        for t in matched:
            named, numbers = container_ports(t)
            if (isinstance(target, str) and target not in named) or (isinstance(target, int) and target not in numbers):
                report.error(obj, "spec.ports[%d].targetPort" % i, "%r is not a port of the selected pods" % target)
                break


def check_references(cluster, report):
    for doc in cluster.docs:
        kind = doc.get("kind")
        obj = name_of(doc)
        ns = (doc.get("metadata") or {}).get("namespace")
        spec = doc.get("spec") or {}
        if kind == "Service":
            check_service(doc, cluster, report)
        elif kind == "StatefulSet":
            svc = spec.get("serviceName")
            if svc and not cluster.get("Service", ns, svc):
                report.error(obj, "spec.serviceName", "no Service %r in the manifests" % svc)
        elif kind == "PodDisruptionBudget":
            if not any(selector_matches(spec.get("selector"), _labels(t)) for _, t in cluster.pod_templates(ns)):
                report.error(obj, "spec.selector", "selects no pod template in the manifests")
        elif kind == "ServiceMonitor":
            ns_sel = spec.get("namespaceSelector") or {}
            names = ns_sel.get("matchNames") or [ns]
            services = [s for s in cluster.by_kind.get("Service", [])
                        if (ns_sel.get("any") or (s.get("metadata") or {}).get("namespace") in names)
                        and selector_matches(spec.get("selector"), (s.get("metadata") or {}).get("labels") or {})]
            if not services:
                report.error(obj, "spec.selector", "selects no Service in the manifests")
            for i, ep in enumerate(spec.get("endpoints") or []):
                for s in services:
                    port_names = [p.get("name") for p in (s.get("spec") or {}).get("ports") or []]
                    if ep.get("port") not in port_names:
                        report.error(obj, "spec.endpoints[%d].port" % i,
                                     "%s has no port named %r" % (name_of(s), ep.get("port")))


# ------------------------------------------------------------------ main ---

def validate(docs, binaries=None, out=sys.stdout):
    report = Report()
    seen = set()
    objects = []
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            report.error("document %d" % i, "", "not a mapping")
            continue
        if doc.get("kind") == "List":
            report.error("document %d" % i, "", "a List: render objects one per document")
            continue
        objects.append(doc)
    cluster = Cluster(objects)
    for doc in objects:
        obj = name_of(doc)
        api_version, kind = doc.get("apiVersion"), doc.get("kind")
        if not isinstance(api_version, str) or not isinstance(kind, str):
            report.error(obj, "apiVersion/kind", "missing")
            continue
        key = (kind, (doc.get("metadata") or {}).get("namespace"), (doc.get("metadata") or {}).get("name"))
        if key in seen:
            report.error(obj, "metadata.name", "the same object twice")
        seen.add(key)
        if (api_version, kind) in REMOVED_APIS:
            report.error(obj, "apiVersion", "%s %s is no longer served since Kubernetes %s"
                         % (api_version, kind, REMOVED_APIS[(api_version, kind)]))
        resolved = resolve_kind(api_version, kind)
        if resolved is None:
            report.error(obj, "apiVersion", "unknown kind %s in %s (not in python3-kubernetes %s nor in the "
                         "hand-written schemas)" % (kind, api_version, kubernetes.__version__))
            continue
        schema_name, namespaced = resolved
        before = len(report.errors)
        check_object(doc, get_schema(schema_name), "", obj, report)
        check_metadata(doc, namespaced, report)
        if kind in WORKLOAD_KINDS:
            template = (doc.get("spec") or {}).get("template") or {}
            check_pod_template(doc, template, cluster, report, binaries)
        status = "ok " if len(report.errors) == before else "BAD"
        out.write("%s %-44s %s -> %s\n" % (status, obj, api_version, schema_name))
    check_references(cluster, report)
    return objects, report.errors


def load(paths):
    docs = []
    for path in paths or ["-"]:
        stream = sys.stdin if path == "-" else open(path)
        try:
            docs.extend(yaml.safe_load_all(stream))
        except yaml.YAMLError as e:
            raise SystemExit("validate_k8s: %s: %s" % (path, e))
    return docs


# -------------------------------------------------------------- self-test ---

GOOD = """
apiVersion: v1
kind: Service
metadata: {name: db, namespace: t, labels: {app.kubernetes.io/part-of: fulcrum}}
spec:
  clusterIP: None
  selector: {app: db}
  ports: [{name: grpc, port: 7000, targetPort: grpc}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: t}
spec:
  serviceName: db
  replicas: 3
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:
      securityContext: {runAsNonRoot: true}
      containers:
        - name: db
          image: example/db:1
          args: ["--host=$(POD_IP)"]
          env:
            - name: POD_IP
              valueFrom: {fieldRef: {fieldPath: status.podIP}}
          ports: [{name: grpc, containerPort: 7000}]
          resources:
            requests: {cpu: 100m, memory: 64Mi}
            limits: {cpu: 1, memory: 1Gi}
          startupProbe: {grpc: {port: 7000}}
          readinessProbe: {grpc: {port: 7000}}
          livenessProbe: {grpc: {port: 7000}}
  volumeClaimTemplates:
    - metadata: {name: data}
      spec:
        accessModes: [ReadWriteOnce]
        resources: {requests: {storage: 1Gi}}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: db, namespace: t}
spec:
  selector: {matchLabels: {app.kubernetes.io/part-of: fulcrum}}
  endpoints: [{port: grpc, path: /metrics, interval: 15s}]
"""


# A minimal Fulcrum deployment for the contract checks.
GOOD_FULCRUM = """
apiVersion: v1
kind: ConfigMap
metadata: {name: flags, namespace: f}
data:
  server.flags: |
    # comment
    --log_level=info
---
apiVersion: v1
kind: Service
metadata: {name: sched, namespace: f}
spec:
  selector: {app.kubernetes.io/component: scheduler}
  ports: [{name: grpc, port: 7000, targetPort: 7000}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: sched, namespace: f}
spec:
  serviceName: sched
  selector: {matchLabels: {app.kubernetes.io/component: scheduler}}
  template:
    metadata:
      labels: {app.kubernetes.io/component: scheduler, app.kubernetes.io/part-of: fulcrum}
      annotations: {prometheus.io/scrape: "true", prometheus.io/port: "9100"}
    spec:
      securityContext: {runAsNonRoot: true}
      containers:
        - name: scheduler
          image: fulcrum:dev
          command: [fulcrum-scheduler]
          args: [--host=0.0.0.0, --port=7000, --metrics-port=9100, --data-dir=/var/lib/fulcrum/scheduler]
          ports: [{name: grpc, containerPort: 7000}, {name: metrics, containerPort: 9100}]
          resources: {requests: {cpu: 1, memory: 1Gi}, limits: {cpu: 1, memory: 1Gi}}
          startupProbe: {grpc: {port: 7000}}
          readinessProbe: {grpc: {port: 7000}}
          livenessProbe: {grpc: {port: 7000}}
          volumeMounts: [{name: data, mountPath: /var/lib/fulcrum}]
  volumeClaimTemplates:
    - metadata: {name: data}
      spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: server, namespace: f}
spec:
  serviceName: sched
  selector: {matchLabels: {app.kubernetes.io/component: server}}
  template:
    metadata:
      labels: {app.kubernetes.io/component: server, app.kubernetes.io/part-of: fulcrum}
      annotations: {prometheus.io/scrape: "true", prometheus.io/port: "9100"}
    spec:
      terminationGracePeriodSeconds: 45
      securityContext: {runAsNonRoot: true}
      containers:
        - name: server
          image: fulcrum:dev
          command: [fulcrum-server]
          args: [--flagfile=/etc/fulcrum/server.flags, --host=$(POD_IP), --port=7000, --metrics-port=9100,
                 --scheduler=sched.f.svc:7000, --id=$(POD_NAME), --data-dir=/var/lib/fulcrum/server]
          env:
            - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
            - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
          ports: [{name: grpc, containerPort: 7000}, {name: metrics, containerPort: 9100}]
          resources: {requests: {cpu: 1, memory: 1Gi}, limits: {cpu: 1, memory: 1Gi}}
          startupProbe: {grpc: {port: 7000}}
          readinessProbe: {grpc: {port: 7000}}
          livenessProbe: {grpc: {port: 7000}}
          volumeMounts: [{name: data, mountPath: /var/lib/fulcrum}, {name: config, mountPath: /etc/fulcrum}]
      volumes: [{name: config, configMap: {name: flags}}]
  volumeClaimTemplates:
    - metadata: {name: data}
      spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
"""

_SERVER_ARGS = "3:spec.template.spec.containers[0].args"

def _mutate(path, value=None, delete=False, rename=None):
    """A function that edits docs[idx] at a dotted path ([i] for lists)."""
    def apply(docs):
        idx, rest = path.split(":", 1)
        node = docs[int(idx)]
        # Keys are split at dots; "\\." is a dot inside a key.
        parts = [p.replace("\\.", ".") for p in re.findall(r"(?:\\\.|[^.\[\]])+|\[\d+\]", rest)]
        for p in parts[:-1]:
            node = node[int(p[1:-1])] if p.startswith("[") else node[p]
        last = parts[-1]
        key = int(last[1:-1]) if last.startswith("[") else last
        if rename:
            node[rename] = node.pop(key)
        elif delete:
            del node[key]
        else:
            node[key] = value
    return apply


SELF_TESTS = [
    # (what, mutation, expected substring of an error)
    ("misspelled field", _mutate("1:spec.serviceName", rename="serviceNmae"),
     "StatefulSet t/db: spec.serviceNmae: unknown field of V1StatefulSetSpec (did you mean serviceName?)"),
    ("wrong type", _mutate("1:spec.replicas", "3"),
     "StatefulSet t/db: spec.replicas: expected an integer, got str '3'"),
    ("missing required field", _mutate("1:spec.template.spec.containers[0].name", delete=True),
     "spec.template.spec.containers[0].name: missing required field of V1Container"),
    ("unknown field deep down", _mutate("1:spec.template.spec.containers[0].resources.limit", {"cpu": "1"}),
     "spec.template.spec.containers[0].resources.limit: unknown field of V1ResourceRequirements"),
    ("bool where a string goes", _mutate("1:spec.template.metadata.labels.enabled", True),
     'spec.template.metadata.labels.enabled: expected a string, got bool True'),
    ("bad quantity", _mutate("1:spec.template.spec.containers[0].resources.limits.memory", "1GB"),
     "resources.limits.memory: not a Kubernetes quantity"),
    ("grpc probe port as a string", _mutate("1:spec.template.spec.containers[0].livenessProbe.grpc.port", "7000"),
     "livenessProbe.grpc.port: expected an integer, got str '7000'"),
    ("unknown enum value", _mutate("1:spec.template.spec.containers[0].imagePullPolicy", "Sometimes"),
     "imagePullPolicy: 'Sometimes' is not one of Always, IfNotPresent, Never"),
    ("undefined $(VAR)", _mutate("1:spec.template.spec.containers[0].args", ["--host=$(POD_ADDR)"]),
     "args[0]: $(POD_ADDR) is not an env var of the container"),
    ("selector not matching the template", _mutate("1:spec.selector.matchLabels.app", "dbx"),
     "StatefulSet t/db: spec.selector: does not match the pod template's labels"),
    ("service port not on the pods", _mutate("0:spec.ports[0].targetPort", "grcp"),
     "Service t/db: spec.ports[0].targetPort: 'grcp' is not a port of the selected pods"),
    ("ServiceMonitor misspelled field", _mutate("2:spec.endpoints[0].intervall", "15s"),
     "ServiceMonitor t/db: spec.endpoints[0].intervall: unknown field of ServiceMonitorEndpoint"),
    ("ServiceMonitor port not on the Service", _mutate("2:spec.endpoints[0].port", "metrics"),
     "ServiceMonitor t/db: spec.endpoints[0].port: Service t/db has no port named 'metrics'"),
    ("removed API version", _mutate("1:apiVersion", "apps/v1beta2"),
     "apiVersion: apps/v1beta2 StatefulSet is no longer served"),
    ("unknown kind", _mutate("1:kind", "StatefullSet"),
     "apiVersion: unknown kind StatefullSet in apps/v1"),
]

FULCRUM_SELF_TESTS = [
    ("server advertising 0.0.0.0", _mutate(_SERVER_ARGS + "[1]", "--host=0.0.0.0"),
     "StatefulSet f/server: spec.template.spec.containers[0].args: --host=0.0.0.0 is advertised"),
    ("--host from the wrong field", _mutate("3:spec.template.spec.containers[0].env[0].valueFrom.fieldRef.fieldPath",
                                            "status.hostIP"),
     "POD_IP (in --host) must come from fieldRef status.podIP"),
    ("dashed flag in a flagfile", _mutate("0:data.server\\.flags", "--log-level=info\n"),
     "(--flagfile=/etc/fulcrum/server.flags line 1): '--log-level=info': a flagfile line is --name=value"),
    ("flagfile not in the ConfigMap", _mutate(_SERVER_ARGS + "[0]", "--flagfile=/etc/fulcrum/servers.flags"),
     "--flagfile=/etc/fulcrum/servers.flags is not a key of a ConfigMap mounted there"),
    ("scheduler Service misspelled", _mutate(_SERVER_ARGS + "[4]", "--scheduler=schedd.f.svc:7000"),
     "--scheduler: no Service f/schedd in the manifests"),
    ("scheduler port not on the Service", _mutate(_SERVER_ARGS + "[4]", "--scheduler=sched.f.svc:7001"),
     "--scheduler: Service sched has no port 7001"),
    ("--data-dir off the volume", _mutate(_SERVER_ARGS + "[6]", "--data-dir=/tmp/server"),
     "--data-dir=/tmp/server is not on a persistent volume"),
    ("--port not the grpc port", _mutate(_SERVER_ARGS + "[2]", "--port=7001"),
     "--port (7001) must be the container port named grpc (7000)"),
    ("prometheus.io/port not --metrics-port",
     _mutate("3:spec.template.metadata.annotations.prometheus\\.io/port", "9101"),
     "prometheus.io/port the --metrics-port (9100)"),
    ("server without time to drain", _mutate("3:spec.template.spec.terminationGracePeriodSeconds", 30),
     "terminationGracePeriodSeconds: 30 s: a server drains its shards for up to 30 s"),
    ("no resource limits", _mutate("3:spec.template.spec.containers[0].resources.limits", delete=True),
     "spec.template.spec.containers[0].resources.limits.cpu: not set"),
    ("server in a Deployment", _mutate("3:kind", "Deployment"),
     "Deployment f/server: kind: servers need a StatefulSet"),
]


def self_test():
    """Valid examples pass; each broken variant is rejected with the expected message."""
    failures, total = 0, 0
    sink = open(os.devnull, "w")
    for fixture, cases in ((GOOD, SELF_TESTS), (GOOD_FULCRUM, FULCRUM_SELF_TESTS)):
        base = list(yaml.safe_load_all(fixture))
        _, errors = validate(copy.deepcopy(base), out=sink)
        total += 1
        if errors:
            failures += 1
            print("self-test FAIL: a valid example is rejected:\n  " + "\n  ".join(errors))
        else:
            print("self-test ok: the valid example (%s) passes" % ", ".join(name_of(d) for d in base))
        for what, mutation, expected in cases:
            total += 1
            docs = copy.deepcopy(base)
            mutation(docs)
            _, errors = validate(docs, out=sink)
            hit = [e for e in errors if expected in e]
            if hit:
                print("self-test ok: %s rejected: %s" % (what, hit[0]))
            else:
                failures += 1
                print("self-test FAIL: %s not rejected as expected (%r); errors: %s" % (what, expected, errors))
    print("self-test: %d of %d cases as expected" % (total - failures, total))
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="YAML files (default: standard input)")
    parser.add_argument("--binaries", help="folder with fulcrum-scheduler, -server, -worker: check flag names")
    parser.add_argument("--self-test", action="store_true", help="check that bad objects are rejected")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    docs = load(args.files)
    objects, errors = validate(docs, args.binaries)
    if args.binaries:
        checked = [b for b in FULCRUM_BINARIES if _help_flags.get(b)]
        print("flag names checked against: %s" % (", ".join(checked) or "nothing (binaries not usable)"))
    else:
        print("flag names: not checked against the binaries (no --binaries)")
    if not objects:
        errors.append("no objects in the input")
    for e in errors:
        print("ERROR " + e)
    print("validate_k8s: %d objects, %d errors" % (len(objects), len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
