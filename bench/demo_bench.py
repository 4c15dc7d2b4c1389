#!/usr/bin/env python3
"""The demo job side by side: Fulcrum with fp32 pushes, with gradient
compression (JobSpec.compression: int8, top-k), and single-process PyTorch
doing the same steps (bench/torch_demo_bench.py, Debian's python3-torch), the
variants alternating over rounds. Fulcrum runs on one local cluster (2
servers with 2 replicas, 2 workers); its time is the job's elapsed time
(from RUNNING, workers loading their data included, to the last step), the
peer's from its first step to its last (data already loaded): a comparison
that, if anything, flatters PyTorch. Per variant: the push bytes the servers
received (against fp32's), examples a second, training seconds and the
final test accuracy, min / median / max over the rounds.

    bench/demo_bench.py [--rounds 3] [--variants fp32,int8,topk:0.1,topk:0.01,torch]
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
    parser.add_argument("--variants", default="fp32,int8,topk:0.1,topk:0.01,torch")
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
                if variant == "torch":
                    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
                    line = run([python, os.path.join(os.path.dirname(__file__), "torch_demo_bench.py")]).split()
                    seconds, accuracy, steps = float(line[1]), float(line[2]), int(line[3])
                    results[variant]["bytes"].append(0.0)
                    results[variant]["rate"].append(steps * 128 / seconds)
                    results[variant]["seconds"].append(seconds)
                    results[variant]["accuracy"].append(accuracy)
                    print(f"round {r + 1}: torch: {seconds:.1f} s, accuracy {accuracy:.4f}", file=sys.stderr, flush=True)
                    continue
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
    print(f"\nDemo job ({args.spec}), {args.rounds} rounds alternating (min / median / max):\n")
    torch_s = statistics.median(results["torch"]["seconds"]) if "torch" in results else None
    print("| run | push MB received (servers) | vs fp32 | examples/s | training s | vs PyTorch (goal <= 2) | test accuracy |")
    print("|---|---|---|---|---|---|---|")
    for v in variants:
        res = results[v]
        if v == "torch":
            mb, ratio = "-", "-"
        else:
            mb = fmt([b / 1e6 for b in res["bytes"]], "{:.1f}")
            ratio = f"{statistics.median(res['bytes']) / fp32:.3f}" if fp32 else "-"
        vs_torch = f"{statistics.median(res['seconds']) / torch_s:.2f}" if torch_s else "-"
        print(f"| {'PyTorch, one process' if v == 'torch' else v} | {mb} | {ratio} | {fmt(res['rate'], '{:.0f}')} | "
              f"{fmt(res['seconds'], '{:.1f}')} | {vs_torch} | {fmt(res['accuracy'], '{:.4f}')} |")


if __name__ == "__main__":
    main()
