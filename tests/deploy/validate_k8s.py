#!/usr/bin/env python3
"""Offline validation of rendered Kubernetes manifests (deploy/k8s).

    kubectl kustomize deploy/k8s/overlays/cpu | validate_k8s.py [--binaries DIR]
        [--secret NAME:KEY,KEY ...] [FILE ...]
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
   container (Kubernetes leaves an unknown one as literal text). Secrets that
   volumes, secretKeyRef and envFrom use must be objects of the manifests or
   declared with --secret NAME:KEY,... (the ones the user creates, which the
   manifests must not carry), with the keys used; Secret mounts are readOnly
   and their file modes readable by the pod's user (a mode without group or
   other read needs fsGroup, which the kubelet turns into group read).
3. Fulcrum's contract: --port/--metrics-port agree with the container ports,
   the probes and the prometheus.io/port annotation; servers and workers
   advertise a reachable --host and find the scheduler through a Service
   that selects it; --data-dir sits on a persistent volume; servers run in a
   StatefulSet with time to drain; requests and limits set; non-root.
   gRPC probes go to --port, or to --health-port (a container port named
   health) when it is set; with TLS (--tls-cert, --tls-key, --tls-ca: all or
   none) the probes must use --health-port (kubelet cannot present a client
   certificate). The files of --tls-*, --cluster-token-file and --token-file
   (scheduler only) are keys of a mounted Secret or ConfigMap. All daemons
   agree on TLS and on the cluster credential; the CLI's environment
   (FULCRUM_TLS_*, FULCRUM_CLUSTER_TOKEN_FILE, and FULCRUM_TOKEN from the
   Secret key of --token-file in the scheduler's pod) matches, wherever
   FULCRUM_SCHEDULER is set for the CLI. Flags are read from args and the
   flagfiles alike.
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

    def __init__(self, docs, secrets=None):
        self.docs = docs
        self.by_kind = {}
        for d in docs:
            self.by_kind.setdefault(d.get("kind"), []).append(d)
        # Secrets created outside the manifests: name -> set of keys.
        self.external_secrets = dict(secrets or {})
        # What each Fulcrum daemon was found to do (check_fulcrum_cluster).
        self.daemons = []

    def secret_keys(self, namespace, name):
        """The keys of a Secret of the manifests or declared, or None."""
        doc = self.get("Secret", namespace, name)
        if doc is not None:
            return set((doc.get("data") or {})) | set((doc.get("stringData") or {}))
        if name in self.external_secrets:
            return set(self.external_secrets[name])
        return None

    def configmap_keys(self, namespace, name):
        doc = self.get("ConfigMap", namespace, name)
        if doc is None:
            return None
        return set((doc.get("data") or {})) | set((doc.get("binaryData") or {}))

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
    sc = spec.get("securityContext") or {}
    for vi, vol in enumerate(spec.get("volumes") or []):
        cm = vol.get("configMap")
        if cm and not cm.get("optional") and not cluster.get("ConfigMap", ns, cm.get("name")):
            report.error(obj, "%s.spec.volumes[%d].configMap.name" % (base, vi),
                         "no ConfigMap %r in the manifests" % cm.get("name"))
        if vol.get("secret") is not None:
            check_secret_volume(obj, "%s.spec.volumes[%d].secret" % (base, vi), vol["secret"], sc, cluster, ns,
                                report)
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
            if (volumes.get(m.get("name")) or {}).get("secret") is not None and m.get("readOnly") is not True:
                report.error(obj, "%s.volumeMounts[%d].readOnly" % (cpath, mi),
                             "the Secret volume %r must be mounted readOnly: true" % m.get("name"))
        check_env_references(obj, cpath, c, cluster, ns, report)
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


def _secret_key_error(cluster, ns, name, key):
    """Why Secret `name` has no `key` (None when it has, or is unknown)."""
    keys = cluster.secret_keys(ns, name)
    if keys is None or key in keys:
        return None
    return "Secret %r has no key %r (its keys: %s)" % (name, key, ", ".join(sorted(keys)) or "none")


def _unknown_secret(name):
    return ("no Secret %r in the manifests, nor declared as one the user creates "
            "(validate_k8s.py --secret %s:KEY,...)" % (name, name))


def check_secret_volume(obj, vpath, sec, pod_sc, cluster, ns, report):
    """A Secret volume: the Secret and its keys exist; its files are readable by the pod's user."""
    name = sec.get("secretName")
    if not name:
        report.error(obj, vpath + ".secretName", "not set")
        return
    if cluster.secret_keys(ns, name) is None and not sec.get("optional"):
        report.error(obj, vpath + ".secretName", _unknown_secret(name))
    modes = [("defaultMode", sec.get("defaultMode", 0o644))]
    for ii, item in enumerate(sec.get("items") or []):
        why = _secret_key_error(cluster, ns, name, item.get("key"))
        if why and not sec.get("optional"):
            report.error(obj, "%s.items[%d].key" % (vpath, ii), why)
        if "mode" in item:
            modes.append(("items[%d].mode" % ii, item["mode"]))
    for where, mode in modes:
        if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o777:
            report.error(obj, "%s.%s" % (vpath, where),
                         "%r is not a file mode from 0 to 0777 (decimal in YAML: 0400 is 256)" % (mode,))
            continue
        # Files of Secret volumes belong to root. With fsGroup the kubelet
        # gives them to that group and adds group read (0400 -> 0440).
        if mode & 0o044 == 0 and pod_sc.get("fsGroup") is None and pod_sc.get("runAsUser", 0) != 0:
            report.error(obj, "%s.%s" % (vpath, where),
                         "mode %04o: only root could read the files; set the pod's securityContext.fsGroup "
                         "(the kubelet then adds group read) or a wider mode" % mode)


def check_env_references(obj, cpath, c, cluster, ns, report):
    """secretKeyRef/configMapKeyRef and envFrom name objects (and keys) that exist."""
    for ei, e in enumerate(c.get("env") or []):
        value_from = e.get("valueFrom") or {}
        where = "%s.env[%d].valueFrom" % (cpath, ei)
        ref = value_from.get("secretKeyRef")
        if ref and not ref.get("optional"):
            if cluster.secret_keys(ns, ref.get("name")) is None:
                report.error(obj, where + ".secretKeyRef.name", _unknown_secret(ref.get("name")))
            else:
                why = _secret_key_error(cluster, ns, ref.get("name"), ref.get("key"))
                if why:
                    report.error(obj, where + ".secretKeyRef.key", why)
        ref = value_from.get("configMapKeyRef")
        if ref and not ref.get("optional"):
            keys = cluster.configmap_keys(ns, ref.get("name"))
            if keys is None:
                report.error(obj, where + ".configMapKeyRef.name", "no ConfigMap %r in the manifests" % ref.get("name"))
            elif ref.get("key") not in keys:
                report.error(obj, where + ".configMapKeyRef.key",
                             "ConfigMap %r has no key %r" % (ref.get("name"), ref.get("key")))
    for ei, e in enumerate(c.get("envFrom") or []):
        ref = e.get("secretRef")
        if ref and not ref.get("optional") and cluster.secret_keys(ns, ref.get("name")) is None:
            report.error(obj, "%s.envFrom[%d].secretRef.name" % (cpath, ei), _unknown_secret(ref.get("name")))
        ref = e.get("configMapRef")
        if ref and not ref.get("optional") and cluster.configmap_keys(ns, ref.get("name")) is None:
            report.error(obj, "%s.envFrom[%d].configMapRef.name" % (cpath, ei),
                         "no ConfigMap %r in the manifests" % ref.get("name"))


# ------------------------------------------------------ Fulcrum contract ---

FULCRUM_BINARIES = ("fulcrum-scheduler", "fulcrum-server", "fulcrum-worker")
# Flags naming files the process reads at start (and exits without).
FILE_FLAGS = ("tls_cert", "tls_key", "tls_ca", "cluster_token_file", "token_file")
TLS_FLAGS = ("tls_cert", "tls_key", "tls_ca")
# The CLI's environment for the daemon's flag of the same file.
CLI_TLS_ENV = (("FULCRUM_TLS_CERT", "tls_cert"), ("FULCRUM_TLS_KEY", "tls_key"), ("FULCRUM_TLS_CA", "tls_ca"))
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


def mounted_file(path, mounts, volumes, cluster, ns):
    """(source, None) when a volume mount provides the file `path`, else (None, why not).

    source: ("secret" | "configMap", object name, key), or (volume type, volume
    name, path) for volumes whose content is not in the manifests (csi, projected).
    """
    under = [p for p in mounts if path.startswith(p.rstrip("/") + "/")]
    if not under:
        return None, "is on no volume mount of the container"
    mount_path = max(under, key=len)
    vol_name = mounts[mount_path]
    vol = volumes.get(vol_name)
    rel = path[len(mount_path.rstrip("/")) + 1:]
    if vol is None:
        return None, "is on the persistent volume %r, which nothing in the manifests fills" % vol_name
    for vtype, name_field, keys_of in (("secret", "secretName", cluster.secret_keys),
                                       ("configMap", "name", cluster.configmap_keys)):
        src = vol.get(vtype)
        if src is None:
            continue
        name = src.get(name_field)
        items = src.get("items")
        key = rel
        if items is not None:
            by_path = {i.get("path"): i.get("key") for i in items}
            if rel not in by_path:
                return None, "is not among the items of the %s volume %r (paths: %s)" % (
                    vtype, vol_name, ", ".join(sorted(str(p) for p in by_path)))
            key = by_path[rel]
        keys = keys_of(ns, name)
        if keys is not None and key not in keys:
            return None, "is not a key of %s %r (its keys: %s)" % (
                "Secret" if vtype == "secret" else "ConfigMap", name, ", ".join(sorted(keys)) or "none")
        return (vtype, name, key), None  # an unknown object is reported with the volume
    for vtype in ("csi", "projected"):
        if vol.get(vtype) is not None:
            return (vtype, vol_name, rel), None
    return None, "is on the volume %r, which is no Secret or ConfigMap the manifests fill" % vol_name


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
    from_files = {}
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
            if m:
                from_files[m.group(1)] = ((m.group(2) or "=")[1:], line)
    # What the process runs with: the flagfiles' values, then args.
    effective = dict(from_files)
    effective.update(flags)
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
    check_fulcrum_security(doc, c, cpath, binary, effective, named, mounts, volumes, cluster, report)


def _port_number(value):
    try:
        return int(str(value))
    except ValueError:
        return None


def check_fulcrum_security(doc, c, cpath, binary, effective, named, mounts, volumes, cluster, report):
    """TLS, tokens, the health port and the probes, the CLI's environment."""
    obj = name_of(doc)
    ns = (doc.get("metadata") or {}).get("namespace")
    value = lambda name: str(effective.get(name, ("",))[0])  # noqa: E731
    sources = {}
    for name in FILE_FLAGS:
        if not value(name):
            continue
        source, why = mounted_file(value(name), mounts, volumes, cluster, ns)
        if why:
            report.error(obj, cpath + ".args", "--%s=%s %s: the process exits without it"
                         % (name.replace("_", "-"), value(name), why))
        sources[name] = source
    tls_set = [n for n in TLS_FLAGS if value(n)]
    if tls_set and len(tls_set) != len(TLS_FLAGS):
        report.error(obj, cpath + ".args", "--tls-cert, --tls-key and --tls-ca go together (the process exits 2 "
                     "otherwise); set here: %s" % ", ".join("--" + n.replace("_", "-") for n in tls_set))
    tls = len(tls_set) == len(TLS_FLAGS)
    if value("token_file") and binary != "fulcrum-scheduler":
        report.error(obj, cpath + ".args", "--token-file is the scheduler's (JobService); %s has none" % binary)
    # Probes: grpc.health.v1 on --port, or on the plaintext --health-port.
    grpc_port = _port_number(value("port"))
    health = _port_number(value("health_port")) if value("health_port") else -1
    if health is None:
        report.error(obj, cpath + ".args", "--health-port=%s is not a port number" % value("health_port"))
        health = -1
    if health == 0:
        report.error(obj, cpath + ".args", "--health-port=0 picks a random port, which the probes cannot know")
    if health > 0:
        if named.get("health") != health:
            report.error(obj, cpath + ".args", "--health-port (%d) must be the container port named health (%s)"
                         % (health, named.get("health")))
        if str(health) in (value("port"), value("metrics_port")):
            report.error(obj, cpath + ".args", "--health-port (%d) must differ from --port and --metrics-port"
                         % health)
    elif tls:
        report.error(obj, cpath + ".args", "with TLS the gRPC port requires a client certificate, which kubelet's "
                     "probes cannot present: set --health-port (plaintext grpc.health.v1) and probe it")
    allowed = {health} if tls and health > 0 else {p for p in (grpc_port, health) if p is not None and p > 0}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        grpc = (c.get(probe) or {}).get("grpc")
        if grpc is None or grpc.get("port") in allowed:
            continue
        if tls and grpc.get("port") == grpc_port:
            why = "the gRPC port requires mTLS, which kubelet's probes cannot do: probe --health-port (%s)" % (
                health if health > 0 else "not set")
        else:
            why = "grpc.health.v1 is served on %s" % " and ".join(
                "--%s (%d)" % (n, p) for n, p in (("port", grpc_port), ("health-port", health))
                if p is not None and p > 0)
        report.error(obj, "%s.%s.grpc.port" % (cpath, probe), "%s: %s" % (grpc.get("port"), why))
    # The CLI in the pod (FULCRUM_SCHEDULER set for it) speaks as the daemon does.
    env = {e.get("name"): e for e in c.get("env") or []}
    for ei, e in enumerate(c.get("env") or []):
        if e.get("name") == "FULCRUM_TOKEN" and "value" in e:
            report.error(obj, "%s.env[%d].value" % (cpath, ei),
                         "the JobService token in the manifest: take it from the Secret (secretKeyRef)")
    if "FULCRUM_SCHEDULER" in env:
        for var, flag in CLI_TLS_ENV:
            given = (env.get(var) or {}).get("value")
            if tls and given != value(flag):
                report.error(obj, cpath + ".env", "%s must be %s (--%s): the CLI in the pod (FULCRUM_SCHEDULER) "
                             "speaks mTLS to the cluster" % (var, value(flag), flag.replace("_", "-")))
            elif not tls and var in env:
                report.error(obj, cpath + ".env", "%s set, but the cluster is plaintext (no --tls-cert)" % var)
        given = (env.get("FULCRUM_CLUSTER_TOKEN_FILE") or {}).get("value")
        if value("cluster_token_file") and given != value("cluster_token_file"):
            report.error(obj, cpath + ".env", "FULCRUM_CLUSTER_TOKEN_FILE must be %s (--cluster-token-file): "
                         "`fulcrum cluster` and `export` need the cluster credential" % value("cluster_token_file"))
        if binary == "fulcrum-scheduler" and value("token_file"):
            ref = ((env.get("FULCRUM_TOKEN") or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
            source = sources.get("token_file")
            if not ref:
                report.error(obj, cpath + ".env", "FULCRUM_TOKEN not set: the CLI in the scheduler's pod needs the "
                             "token of --token-file (secretKeyRef)")
            elif source and source[0] == "secret" and (ref.get("name"), ref.get("key")) != source[1:]:
                report.error(obj, cpath + ".env", "FULCRUM_TOKEN comes from Secret %s key %s, but --token-file "
                             "reads Secret %s key %s" % (ref.get("name"), ref.get("key"), source[1], source[2]))
    cluster.daemons.append({"obj": obj, "ns": ns, "tls": tls, "ca": sources.get("tls_ca"),
                            "cluster_token": sources.get("cluster_token_file") if value("cluster_token_file")
                            else None,
                            "binary": binary, "secrets": readable_secret_keys(c, mounts, volumes, cluster, ns),
                            "job_token": sources.get("token_file") if value("token_file") else None})


def readable_secret_keys(c, mounts, volumes, cluster, ns):
    """{(Secret name, key)} the container can read: mounted ones and env secretKeyRefs ("*": every key)."""
    readable = set()
    for vol_name in mounts.values():
        src = (volumes.get(vol_name) or {}).get("secret")
        if src is None:
            continue
        name = src.get("secretName")
        if src.get("items") is not None:
            readable |= {(name, i.get("key")) for i in src["items"]}
        else:
            keys = cluster.secret_keys(ns, name)
            readable |= {(name, k) for k in keys} if keys is not None else {(name, "*")}
    for e in c.get("env") or []:
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            readable.add((ref.get("name"), ref.get("key")))
    return readable


def check_fulcrum_cluster(cluster, report):
    """The daemons of a namespace can talk: all mTLS or none, one CA, one cluster credential."""
    by_ns = {}
    for d in cluster.daemons:
        by_ns.setdefault(d["ns"], []).append(d)
    for daemons in by_ns.values():
        for what, key, label in (("TLS", "tls", "--tls-*"), ("the cluster credential", "cluster_token",
                                                            "--cluster-token-file")):
            on = [d for d in daemons if d[key]]
            if on and len(on) != len(daemons):
                for d in daemons:
                    if not d[key]:
                        report.error(d["obj"], "spec.template.spec.containers", "%s is on in %s but not here (%s): "
                                     "the daemons could not talk" % (what, on[0]["obj"], label))
        # Least privilege: the JobService token submits and cancels jobs; only
        # the scheduler (which checks it) has any use for it.
        job_tokens = {d["job_token"][1:] for d in daemons if d["job_token"] and d["job_token"][0] == "secret"}
        for d in daemons:
            if d["binary"] == "fulcrum-scheduler":
                continue
            for name, key in sorted(job_tokens):
                if (name, key) in d["secrets"] or (name, "*") in d["secrets"]:
                    report.error(d["obj"], "spec.template.spec", "the JobService token (Secret %s key %s) is "
                                 "readable here, but only the scheduler uses it: mount only the keys %s needs "
                                 "(volume items)" % (name, key, d["binary"]))
        for what, key in (("CA (--tls-ca)", "ca"), ("cluster credential (--cluster-token-file)", "cluster_token")):
            seen = {d[key] for d in daemons if d[key] and d[key][0] in ("secret", "configMap")}
            if len(seen) > 1:
                report.error(daemons[0]["obj"], "spec.template.spec.containers",
                             "the daemons read their %s from different places: %s"
                             % (what, ", ".join("%s %s key %s" % s for s in sorted(seen))))


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

def validate(docs, binaries=None, out=sys.stdout, secrets=None):
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
    cluster = Cluster(objects, secrets)
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
    check_fulcrum_cluster(cluster, report)
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

# GOOD_FULCRUM with mTLS, tokens and the plaintext health port, as
# deploy/k8s/overlays/cpu-tls sets them up: the scheduler has its flags in
# args, the server in its flagfile. The Secret tls is declared (one the user
# creates), the Secret tokens is an object of the manifests.
TLS_SECRETS = {"tls": {"ca.crt", "tls.crt", "tls.key"}}
GOOD_FULCRUM_TLS = """
apiVersion: v1
kind: ConfigMap
metadata: {name: flags, namespace: f}
data:
  server.flags: |
    --log_level=info
    --tls_cert=/etc/fulcrum/tls/tls.crt
    --tls_key=/etc/fulcrum/tls/tls.key
    --tls_ca=/etc/fulcrum/tls/ca.crt
    --cluster_token_file=/etc/fulcrum/tokens/cluster-token
---
apiVersion: v1
kind: Secret
metadata: {name: tokens, namespace: f}
stringData: {cluster-token: not-a-secret, token: not-a-secret}
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
      securityContext: {runAsNonRoot: true, runAsUser: 10001, fsGroup: 10001}
      containers:
        - name: scheduler
          image: fulcrum:dev
          command: [fulcrum-scheduler]
          args: [--host=0.0.0.0, --port=7000, --metrics-port=9100, --data-dir=/var/lib/fulcrum/scheduler,
                 --tls-cert=/etc/fulcrum/tls/tls.crt, --tls-key=/etc/fulcrum/tls/tls.key,
                 --tls-ca=/etc/fulcrum/tls/ca.crt, --cluster-token-file=/etc/fulcrum/tokens/cluster-token,
                 --token-file=/etc/fulcrum/tokens/token, --health-port=8081]
          env:
            - {name: FULCRUM_SCHEDULER, value: "127.0.0.1:7000"}
            - {name: FULCRUM_TLS_CERT, value: /etc/fulcrum/tls/tls.crt}
            - {name: FULCRUM_TLS_KEY, value: /etc/fulcrum/tls/tls.key}
            - {name: FULCRUM_TLS_CA, value: /etc/fulcrum/tls/ca.crt}
            - {name: FULCRUM_CLUSTER_TOKEN_FILE, value: /etc/fulcrum/tokens/cluster-token}
            - {name: FULCRUM_TOKEN, valueFrom: {secretKeyRef: {name: tokens, key: token}}}
          ports: [{name: grpc, containerPort: 7000}, {name: metrics, containerPort: 9100},
                  {name: health, containerPort: 8081}]
          resources: {requests: {cpu: 1, memory: 1Gi}, limits: {cpu: 1, memory: 1Gi}}
          startupProbe: {grpc: {port: 8081}}
          readinessProbe: {grpc: {port: 8081}}
          livenessProbe: {grpc: {port: 8081}}
          volumeMounts:
            - {name: data, mountPath: /var/lib/fulcrum}
            - {name: tls, mountPath: /etc/fulcrum/tls, readOnly: true}
            - {name: tokens, mountPath: /etc/fulcrum/tokens, readOnly: true}
      volumes:
        - {name: tls, secret: {secretName: tls, defaultMode: 256}}
        - name: tokens
          secret:
            secretName: tokens
            defaultMode: 256
            items: [{key: cluster-token, path: cluster-token}, {key: token, path: token}]
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
      securityContext: {runAsNonRoot: true, runAsUser: 10001, fsGroup: 10001}
      containers:
        - name: server
          image: fulcrum:dev
          command: [fulcrum-server]
          args: [--flagfile=/etc/fulcrum/server.flags, --host=$(POD_IP), --port=7000, --metrics-port=9100,
                 --scheduler=sched.f.svc:7000, --id=$(POD_NAME), --data-dir=/var/lib/fulcrum/server,
                 --health-port=8081]
          env:
            - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
            - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
          ports: [{name: grpc, containerPort: 7000}, {name: metrics, containerPort: 9100},
                  {name: health, containerPort: 8081}]
          resources: {requests: {cpu: 1, memory: 1Gi}, limits: {cpu: 1, memory: 1Gi}}
          startupProbe: {grpc: {port: 8081}}
          readinessProbe: {grpc: {port: 8081}}
          livenessProbe: {grpc: {port: 8081}}
          volumeMounts:
            - {name: data, mountPath: /var/lib/fulcrum}
            - {name: config, mountPath: /etc/fulcrum}
            - {name: tls, mountPath: /etc/fulcrum/tls, readOnly: true}
            - {name: tokens, mountPath: /etc/fulcrum/tokens, readOnly: true}
      volumes:
        - {name: config, configMap: {name: flags}}
        - {name: tls, secret: {secretName: tls, defaultMode: 256}}
        - {name: tokens, secret: {secretName: tokens, defaultMode: 256,
                                  items: [{key: cluster-token, path: cluster-token}]}}
  volumeClaimTemplates:
    - metadata: {name: data}
      spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
---
apiVersion: v1
kind: Service
metadata: {name: sched, namespace: f}
spec:
  selector: {app.kubernetes.io/component: scheduler}
  ports: [{name: grpc, port: 7000, targetPort: 7000}]
"""

_SERVER_ARGS = "3:spec.template.spec.containers[0].args"
_SCHED = "2:spec.template.spec"
_SCHED_C = _SCHED + ".containers[0]"
_SERVER = "3:spec.template.spec"

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

TLS_SELF_TESTS = [
    ("probe on the mTLS port", _mutate(_SCHED_C + ".readinessProbe.grpc.port", 7000),
     "readinessProbe.grpc.port: 7000: the gRPC port requires mTLS, which kubelet's probes cannot do"),
    ("TLS without --health-port", _mutate(_SERVER_ARGS + "[7]", delete=True),
     "StatefulSet f/server: spec.template.spec.containers[0].args: with TLS the gRPC port requires a client "
     "certificate"),
    ("--health-port not the health container port", _mutate(_SCHED_C + ".args[9]", "--health-port=8082"),
     "--health-port (8082) must be the container port named health (8081)"),
    ("--health-port=0", _mutate(_SCHED_C + ".args[9]", "--health-port=0"),
     "--health-port=0 picks a random port"),
    ("Secret neither in the manifests nor declared", _mutate(_SCHED + ".volumes[0].secret.secretName", "tls-certs"),
     "volumes[0].secret.secretName: no Secret 'tls-certs' in the manifests, nor declared"),
    ("secretKeyRef to an unknown Secret", _mutate(_SCHED_C + ".env[5].valueFrom.secretKeyRef.name", "tokenz"),
     "env[5].valueFrom.secretKeyRef.name: no Secret 'tokenz'"),
    ("--tls-cert not a key of the Secret", _mutate(_SCHED_C + ".args[4]", "--tls-cert=/etc/fulcrum/tls/tls.cert"),
     "--tls-cert=/etc/fulcrum/tls/tls.cert is not a key of Secret 'tls'"),
    ("--token-file not among the volume's items", _mutate(_SCHED_C + ".args[8]",
                                                          "--token-file=/etc/fulcrum/tokens/job-token"),
     "--token-file=/etc/fulcrum/tokens/job-token is not among the items of the secret volume 'tokens'"),
    ("--tls-cert on no mount", _mutate(_SCHED_C + ".args[4]", "--tls-cert=/tls/tls.crt"),
     "--tls-cert=/tls/tls.crt is on no volume mount"),
    ("items key missing from the Secret", _mutate(_SCHED + ".volumes[1].secret.items[1].key", "jobtoken"),
     "volumes[1].secret.items[1].key: Secret 'tokens' has no key 'jobtoken'"),
    ("incomplete TLS triple", _mutate(_SCHED_C + ".args[6]", delete=True),
     "--tls-cert, --tls-key and --tls-ca go together"),
    ("TLS on the scheduler only",
     _mutate("0:data.server\\.flags", "--cluster_token_file=/etc/fulcrum/tokens/cluster-token\n"),
     "StatefulSet f/server: spec.template.spec.containers: TLS is on in StatefulSet f/sched but not here"),
    ("cluster credential on the scheduler only",
     _mutate("0:data.server\\.flags", "--tls_cert=/etc/fulcrum/tls/tls.crt\n--tls_key=/etc/fulcrum/tls/tls.key\n"
             "--tls_ca=/etc/fulcrum/tls/ca.crt\n"),
     "the cluster credential is on in StatefulSet f/sched but not here"),
    ("the JobService token mounted in a server", _mutate(_SERVER + ".volumes[2].secret.items", delete=True),
     "StatefulSet f/server: spec.template.spec: the JobService token (Secret tokens key token) is readable here"),
    ("--token-file on a server", _mutate(_SERVER_ARGS + "[6]", "--token-file=/etc/fulcrum/tokens/token"),
     "--token-file is the scheduler's (JobService); fulcrum-server has none"),
    ("no FULCRUM_TOKEN in the scheduler's pod", _mutate(_SCHED_C + ".env[5]", delete=True),
     "FULCRUM_TOKEN not set: the CLI in the scheduler's pod needs the token"),
    ("the token written into the manifest", _mutate(_SCHED_C + ".env[5]", {"name": "FULCRUM_TOKEN", "value": "x"}),
     "env[5].value: the JobService token in the manifest"),
    ("FULCRUM_TOKEN from another key", _mutate(_SCHED_C + ".env[5].valueFrom.secretKeyRef.key", "cluster-token"),
     "FULCRUM_TOKEN comes from Secret tokens key cluster-token, but --token-file reads Secret tokens key token"),
    ("FULCRUM_TLS_CA not the daemon's CA", _mutate(_SCHED_C + ".env[3].value", "/etc/fulcrum/tls/tls.crt"),
     "FULCRUM_TLS_CA must be /etc/fulcrum/tls/ca.crt (--tls-ca)"),
    ("no FULCRUM_CLUSTER_TOKEN_FILE for the CLI", _mutate(_SCHED_C + ".env[4]", delete=True),
     "FULCRUM_CLUSTER_TOKEN_FILE must be /etc/fulcrum/tokens/cluster-token"),
    ("mode 0400 without fsGroup", _mutate(_SCHED + ".securityContext.fsGroup", delete=True),
     "volumes[0].secret.defaultMode: mode 0400: only root could read the files"),
    ("a decimal mode meant as octal", _mutate(_SCHED + ".volumes[0].secret.defaultMode", 644),
     "volumes[0].secret.defaultMode: 644 is not a file mode from 0 to 0777"),
    ("Secret mounted writable", _mutate(_SCHED_C + ".volumeMounts[1].readOnly", False),
     "volumeMounts[1].readOnly: the Secret volume 'tls' must be mounted readOnly: true"),
]


def self_test():
    """Valid examples pass; each broken variant is rejected with the expected message."""
    failures, total = 0, 0
    sink = open(os.devnull, "w")
    for fixture, cases, secrets in ((GOOD, SELF_TESTS, None), (GOOD_FULCRUM, FULCRUM_SELF_TESTS, None),
                                    (GOOD_FULCRUM_TLS, TLS_SELF_TESTS, TLS_SECRETS)):
        base = list(yaml.safe_load_all(fixture))
        _, errors = validate(copy.deepcopy(base), out=sink, secrets=secrets)
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
            _, errors = validate(docs, out=sink, secrets=secrets)
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
    parser.add_argument("--secret", action="append", default=[], metavar="NAME:KEY,KEY",
                        help="a Secret the user creates outside the manifests, with its keys (repeatable)")
    parser.add_argument("--self-test", action="store_true", help="check that bad objects are rejected")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    secrets = {}
    for spec in args.secret:
        name, colon, keys = spec.partition(":")
        if not name or not colon or not keys:
            parser.error("--secret %r: expected NAME:KEY[,KEY...]" % spec)
        secrets[name] = {k for k in keys.split(",") if k}
    docs = load(args.files)
    objects, errors = validate(docs, args.binaries, secrets=secrets)
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
