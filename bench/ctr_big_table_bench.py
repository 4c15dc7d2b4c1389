#!/usr/bin/env python3
"""A click model whose embedding table does not fit one server's memory
budget, trained across several servers that each have that budget.

The job (FM over 8 fields of Zipf-distributed ids from a large vocabulary,
16-float embeddings with Adagrad state, one pass) touches millions of
distinct ids. It runs three times, each on a fresh local cluster
(`fulcrum local up`), one worker each:

  1. one server without a budget: the reference AUC and the table's size;
  2. one server with --server-memory-budget B: refused, RESOURCE_EXHAUSTED
     naming the table, when its rows outgrow B;
  3. N servers with B each: trains to the end; the rows spread over them.

Printed: each run's outcome, test AUC against the best reachable (the true
click probabilities'), examples/s, and the table rows and bytes each server
holds at the end (its /metrics, fulcrum_server_table_rows and _bytes).

    bench/ctr_big_table_bench.py [--servers 4] [--budget 512MiB] [--examples 3000000]
                                 [--vocabulary 2000000] [--bin build/bin]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

SPEC = """name: ctr-big-table
model:
  kind: FM
  embeddingDim: 16
  tables:
    - name: linear
      optimizer: {{kind: ADAGRAD, lr: 0.05}}
    - name: embedding
      optimizer: {{kind: ADAGRAD, lr: 0.05}}
data:
  dataset: SYNTHETIC_CTR
  syntheticCtr:
    examples: {examples}
    fields: 8
    vocabulary: {vocabulary}
    zipfExponent: 0.9
    dense: 4
    fmDim: 4
  batchSize: 512
  epochs: 1
  shuffleSeed: 1
optimizer:
  kind: ADAM
  lr: 0.001
mode: ASP
numWorkers: 1
replicas: 1
seed: 42
"""


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def table_metrics(cluster_json):
    """(server id, table) -> (rows, bytes), scraped from each server's /metrics."""
    held = {}
    for process in json.load(open(cluster_json))["processes"]:
        if process.get("role") != "server" or not process.get("metrics_address"):
            continue
        text = urllib.request.urlopen(f"http://{process['metrics_address']}/metrics", timeout=10).read().decode()
        for name, key in (("fulcrum_server_table_rows", 0), ("fulcrum_server_table_bytes", 1)):
            for m in re.finditer(name + r'\{([^}]*)\} ([0-9.e+]+)', text):
                table = re.search(r'table="([^"]*)"', m.group(1)).group(1)
                entry = held.setdefault((process["id"], table), [0, 0])
                entry[key] = float(m.group(2))
    return held


def wait_for_servers_to_finish(cluster_json, job, timeout=60):
    """Until every server logs the job finished (the scheduler's DropJob,
    after which its table metrics are final)."""
    logs = [p["log"] for p in json.load(open(cluster_json))["processes"] if p.get("role") == "server"]
    deadline = time.time() + timeout
    while time.time() < deadline:
        if all(f"job {job}: finished" in open(log, errors="replace").read() for log in logs):
            return
        time.sleep(0.1)
    raise RuntimeError(f"the servers did not finish {job} within {timeout} s")


def one_run(fulcrum, spec_text, servers, budget):
    work = tempfile.mkdtemp(prefix="fulcrum-big-table-")
    try:
        up = [fulcrum, "local", "up", "--servers", str(servers), "--workers", "1", "--replicas", "1",
              "--dir", work, "--detach"]
        if budget:
            up += ["--server-memory-budget", budget]
        run(up)
        spec_path = os.path.join(work, "spec.yaml")
        with open(spec_path, "w") as f:
            f.write(spec_text)
        job = run([fulcrum, "submit", "-f", spec_path, "--dir", work]).strip()
        subprocess.run([fulcrum, "watch", job, "--dir", work], capture_output=True)
        status = json.loads(run([fulcrum, "get", job, "-o", "json", "--dir", work]))
        if status["state"] == "SUCCEEDED":
            wait_for_servers_to_finish(os.path.join(work, "cluster.json"), job)
        held = table_metrics(os.path.join(work, "cluster.json"))
        best = None
        for line in open(os.path.join(work, "logs", "worker-0.log"), errors="replace"):
            m = re.search(r"best reachable AUC \(the true probabilities'\) ([0-9.]+)", line)
            if m:
                best = float(m.group(1))
        return status, held, best
    finally:
        subprocess.run([fulcrum, "local", "down", "--dir", work], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def describe(label, status, held, best):
    progress = status.get("progress", {})
    auc = progress.get("testAuc")
    rate = None
    if progress.get("elapsedSeconds"):
        data = status["spec"]["data"]
        covered = int(progress.get("step", 0)) * int(data["batchSize"]) * max(1, int(data.get("gradientAccumulation", 1)))
        rate = covered / float(progress["elapsedSeconds"])
    print(f"\n{label}: {status['state']}" + (f" - {status.get('reason', '')}" if status["state"] != "SUCCEEDED" else ""))
    if status["state"] == "SUCCEEDED":
        print(f"  test AUC {float(auc):.4f} (best reachable {best}), {rate:.0f} examples/s, "
              f"{float(progress['elapsedSeconds']):.1f} s")
    for (server, table), (rows, nbytes) in sorted(held.items()):
        print(f"  {server} {table}: {rows:.0f} rows, {nbytes / 2**20:.1f} MiB")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--budget", default="512MiB")
    parser.add_argument("--examples", type=int, default=3000000)
    parser.add_argument("--vocabulary", type=int, default=2000000)
    parser.add_argument("--bin", default="build/bin")
    args = parser.parse_args()
    fulcrum = os.path.join(args.bin, "fulcrum")
    spec_text = SPEC.format(examples=args.examples, vocabulary=args.vocabulary)
    print(f"FM, 8 fields x {args.vocabulary} ids (Zipf 0.9), 16-float embeddings with Adagrad, "
          f"{args.examples} examples, one worker, {os.cpu_count()} cores")
    for label, servers, budget in (("1 server, no budget", 1, None),
                                   (f"1 server, {args.budget}", 1, args.budget),
                                   (f"{args.servers} servers, {args.budget} each", args.servers, args.budget)):
        status, held, best = one_run(fulcrum, spec_text, servers, budget)
        describe(label, status, held, best)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
