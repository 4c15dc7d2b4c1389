#!/usr/bin/env python3
"""Gradient compression on the demo job, side by side: fp32 pushes against
JobSpec.compression (int8, top-k) on one local cluster (2 servers with 2
replicas, 2 workers), the variants alternating over rounds. Per variant: the
push bytes the servers received (against fp32's), training throughput
(examples a second, first step to last) and the final test accuracy, as
min / median / max over the rounds.

    bench/compression_bench.py [--rounds 3] [--variants fp32,int8,topk:0.1,topk:0.01]
                               [--spec examples/fashion-mnist-mlp.yaml] [--bin build/bin]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def push_bytes(cluster):
    total = 0.0
    for process in cluster["processes"]:
        if process["role"] != "server":
            continue
        text = urllib.request.urlopen(f"http://{process['metrics_address']}/metrics", timeout=10).read().decode()
        m = re.search(r'^fulcrum_rpc_received_bytes_total\{method="Push"\} (\S+)$', text, re.M)
        total += float(m.group(1)) if m else 0.0
    return total


def variant_spec(base, variant):
    if variant == "fp32":
        return base
    if variant == "int8":
        return base + "\ncompression:\n  kind: INT8\n"
    kind, ratio = variant.split(":")
    assert kind == "topk", variant
    return base + f"\ncompression:\n  kind: TOPK\n  topkRatio: {float(ratio)}\n"


def fmt(values, spec="{:.3f}"):
    return " / ".join(spec.format(v) for v in (min(values), statistics.median(values), max(values)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default="fp32,int8,topk:0.1,topk:0.01")
    parser.add_argument("--spec", default="examples/fashion-mnist-mlp.yaml")
    parser.add_argument("--bin", default="build/bin")
    args = parser.parse_args()
    fulcrum = os.path.join(args.bin, "fulcrum")
    variants = args.variants.split(",")
    base = open(args.spec).read()
    work = tempfile.mkdtemp(prefix="fulcrum-compression-")
    results = {v: {"bytes": [], "rate": [], "accuracy": [], "seconds": []} for v in variants}
    try:
        run([fulcrum, "local", "up", "--servers", "2", "--workers", "2", "--dir", work, "--detach"])
        cluster = json.load(open(os.path.join(work, "cluster.json")))
        for r in range(args.rounds):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for variant in order:
                spec_path = os.path.join(work, "spec.yaml")
                with open(spec_path, "w") as f:
                    f.write(variant_spec(base, variant))
                before = push_bytes(cluster)
                job = run([fulcrum, "submit", "-f", spec_path, "--dir", work]).strip()
                subprocess.run([fulcrum, "watch", job, "--dir", work], check=True, capture_output=True)
                status = json.loads(run([fulcrum, "get", job, "-o", "json", "--dir", work]))
                progress = status["progress"]
                spec = status["spec"]
                steps = int(progress["step"])
                examples = steps * int(spec["data"]["batchSize"]) * int(spec.get("maxWorkers", 1))
                seconds = float(progress["elapsedSeconds"])
                results[variant]["bytes"].append(push_bytes(cluster) - before)
                results[variant]["rate"].append(examples / seconds)
                results[variant]["seconds"].append(seconds)
                results[variant]["accuracy"].append(float(progress["testAccuracy"]))
                print(f"round {r + 1}: {variant}: {seconds:.1f} s, accuracy {float(progress['testAccuracy']):.4f}",
                      file=sys.stderr, flush=True)
    finally:
        subprocess.run([fulcrum, "local", "down", "--dir", work], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    fp32 = statistics.median(results["fp32"]["bytes"]) if "fp32" in results else None
    print(f"\nDemo job ({args.spec}) per push encoding, {args.rounds} rounds alternating (min / median / max):\n")
    print("| pushes | push MB received (servers) | vs fp32 | examples/s | training s | test accuracy |")
    print("|---|---|---|---|---|---|")
    for v in variants:
        res = results[v]
        mb = [b / 1e6 for b in res["bytes"]]
        ratio = f"{statistics.median(res['bytes']) / fp32:.3f}" if fp32 else "-"
        print(f"| {v} | {fmt(mb, '{:.1f}')} | {ratio} | {fmt(res['rate'], '{:.0f}')} | "
              f"{fmt(res['seconds'], '{:.1f}')} | {fmt(res['accuracy'], '{:.4f}')} |")


if __name__ == "__main__":
    main()
