#!/usr/bin/env python3
"""A rendered pod's process, to run on this machine (check_k8s.sh).

    pod_command.py RENDERED.yaml KIND/NAME ROOT > run.sh

Finds the workload KIND/NAME (e.g. StatefulSet/fulcrum-scheduler) in the
rendered manifests and prints a shell fragment that sets the environment of
its first container and the array CMD (its command and args), with:

- every path under /etc/fulcrum (in args, env values and the flagfiles)
  moved to ROOT/etc/fulcrum, where the ConfigMap volumes' files are written
  as the kubelet would (the Secret
  volumes' files are for the caller to put there: ROOT/etc/fulcrum/tls/tls.crt
  ...);
- env from fieldRef, resourceFieldRef left out; env from secretKeyRef read
  from the file the Secret volume with that secretName mounts the key as;
- --host, --port, --metrics-port, --health-port, --data-dir dropped (the
  caller passes loopback ones).

Exit 1 with a message when something is not found.
"""

import os
import re
import shlex
import sys

import yaml

ETC = "/etc/fulcrum"
DROPPED = ("host", "port", "metrics_port", "metrics-port", "health_port", "health-port", "data_dir", "data-dir")


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__.split("\n\n")[1])
    rendered, target, root = sys.argv[1:]
    kind, _, name = target.partition("/")

    def local(text):  # /etc/fulcrum/... as a value, a --flag=value or in a list
        return re.sub(r"(^|[=,])%s/" % re.escape(ETC), lambda m: m.group(1) + root + ETC + "/", text, flags=re.M)

    docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
    work = [d for d in docs if d.get("kind") == kind and d["metadata"]["name"] == name]
    if not work:
        sys.exit("pod_command: no %s in %s" % (target, rendered))
    spec = work[0]["spec"]["template"]["spec"]
    container = spec["containers"][0]
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    ns = work[0]["metadata"].get("namespace")
    configmaps = {d["metadata"]["name"]: d for d in docs
                  if d.get("kind") == "ConfigMap" and d["metadata"].get("namespace") == ns}
    secret_files = {}  # (secret name, key) -> path inside the container
    for mount in container.get("volumeMounts") or []:
        vol = volumes.get(mount["name"]) or {}
        path = mount["mountPath"].rstrip("/")
        if "configMap" in vol:
            cm = configmaps.get(vol["configMap"]["name"])
            if cm is None:
                sys.exit("pod_command: no ConfigMap %s" % vol["configMap"]["name"])
            items = vol["configMap"].get("items") or [{"key": k, "path": k} for k in cm.get("data") or {}]
            for item in items:
                dest = root + path + "/" + item["path"]
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                with open(dest, "w") as f:
                    f.write(local(cm["data"][item["key"]]))
        elif "secret" in vol:
            sec = vol["secret"]
            items = sec.get("items")
            if items is None:
                sys.exit("pod_command: the Secret volume %s lists no items" % mount["name"])
            for item in items:
                secret_files[(sec["secretName"], item["key"])] = path + "/" + item["path"]

    out = []
    for e in container.get("env") or []:
        if "value" in e:
            out.append("export %s=%s" % (e["name"], shlex.quote(local(str(e["value"])))))
            continue
        ref = (e.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            path = secret_files.get((ref["name"], ref["key"]))
            if path is None:
                sys.exit("pod_command: no volume mounts Secret %s key %s, to read %s from"
                         % (ref["name"], ref["key"], e["name"]))
            if not os.path.isfile(root + path):
                sys.exit("pod_command: %s (Secret %s key %s) is missing: lay the Secrets' files out under %s first"
                         % (root + path, ref["name"], ref["key"], root))
            # The kubelet passes the Secret's value as it is.
            with open(root + path) as f:
                out.append("export %s=%s" % (e["name"], shlex.quote(f.read())))
    cmd = []
    for arg in list(container.get("command") or []) + [str(a) for a in container.get("args") or []]:
        flag = arg[2:].partition("=")[0] if arg.startswith("--") else ""
        if flag in DROPPED:
            continue
        cmd.append(local(arg))
    out.append("CMD=(%s)" % " ".join(shlex.quote(a) for a in cmd))
    print("\n".join(out))


if __name__ == "__main__":
    main()
