#!/usr/bin/env python3
"""Examples a second of the synthetic click job (examples/ctr-synthetic.yaml,
a DeepFM over sparse tables) at 1, 2 and 4 workers and 1, 2 and 4 servers.
Each configuration runs on its own fresh local cluster (`fulcrum local up
--servers S --workers W`), the configurations alternating over rounds.
A run's rate is the examples its steps covered over the job's elapsed time
(from RUNNING, workers loading included, to the last step); its AUC is the
final test AUC. Printed: min / median / max over the rounds, and each
configuration's median against 1 worker and 1 server.

    bench/ctr_scaling_bench.py [--rounds 3] [--workers 1,2,4] [--servers 1,2,4]
                               [--modes ASP] [--replicas 1] [--examples 300000]
                               [--spec examples/ctr-synthetic.yaml] [--bin build/bin]

--modes lists the consistency models to set on the spec, each a
configuration of its own: ASP, SSP (staleness 4), BSP (dense tensors and
tables synchronous), HYBRID (BSP with the `embedding` table ASYNC, as
PERSIA runs embeddings). --replicas lists replica counts (each a
configuration): 2 keeps every table bucket and dense chunk on two servers,
each push forwarded to the backup before the primary applies it.

The machine's cores bound what more processes can add: on the 2-core
development machine, 4 workers and 4 servers share 2 cores.
"""
import argparse
import os
import re
import statistics
import sys

from local_job import run_job


def fmt(values, spec):
    return " / ".join(spec.format(v) for v in (min(values), statistics.median(values), max(values)))


def spec_for(base, workers, examples, mode="ASP", replicas=1):
    text = re.sub(r"(?m)^numWorkers:.*$", f"numWorkers: {workers}", base)
    text = re.sub(r"(?m)^replicas:.*$", f"replicas: {replicas}", text)
    text = re.sub(r"(?m)^mode:.*$", "mode: " + {"HYBRID": "BSP", "SSP": "SSP\nstaleness: 4"}.get(mode, mode), text)
    if mode == "HYBRID":
        text = re.sub(r"(?m)^(\s+)- name: embedding$", r"\g<0>\n\g<1>  consistency: ASYNC", text)
    text = re.sub(r"(?m)^(\s+examples:).*$", rf"\g<1> {examples}", text)
    # No checkpoints: the figure is the training path's.
    text = re.sub(r"(?ms)^checkpoint:.*?(?=^\S)", "", text + "\n")
    return text


def one_run(fulcrum, base, servers, workers, examples, mode, replicas):
    status = run_job(fulcrum, spec_for(base, workers, examples, mode, replicas), servers, workers,
                     prefix="fulcrum-ctr-scaling-")
    progress, spec = status["progress"], status["spec"]
    step_examples = int(spec["data"]["batchSize"]) * max(1, int(spec["data"].get("gradientAccumulation", 1)))
    covered = int(progress["step"]) * step_examples * int(spec.get("maxWorkers", workers))
    return covered / float(progress["elapsedSeconds"]), float(progress.get("testAuc", 0.0))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--servers", default="1,2,4")
    parser.add_argument("--modes", default="ASP")
    parser.add_argument("--replicas", default="1")
    parser.add_argument("--examples", type=int, default=300000)
    parser.add_argument("--spec", default="examples/ctr-synthetic.yaml")
    parser.add_argument("--bin", default="build/bin")
    args = parser.parse_args()
    fulcrum = os.path.join(args.bin, "fulcrum")
    base = open(args.spec).read()
    configs = [(s, w, m, r) for m in args.modes.split(",") for r in map(int, args.replicas.split(","))
               for s in map(int, args.servers.split(",")) for w in map(int, args.workers.split(","))]
    rates = {c: [] for c in configs}
    aucs = {c: [] for c in configs}
    for r in range(args.rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for servers, workers, mode, replicas in order:
            rate, auc = one_run(fulcrum, base, servers, workers, args.examples, mode, replicas)
            rates[(servers, workers, mode, replicas)].append(rate)
            aucs[(servers, workers, mode, replicas)].append(auc)
            print(f"round {r + 1}: {mode}, {servers} servers, {workers} workers, {replicas} replicas: "
                  f"{rate:.0f} examples/s, AUC {auc:.4f}", file=sys.stderr, flush=True)
    first = statistics.median(rates[configs[0]])
    print(f"\nClick job ({args.spec}, {args.examples} examples), {args.rounds} rounds alternating, "
          f"{os.cpu_count()} cores (min / median / max):\n")
    print(f"| mode | servers | workers | replicas | examples/s | vs {configs[0][2]}, {configs[0][0]} server, "
          f"{configs[0][1]} worker, {configs[0][3]} replica | test AUC |")
    print("|---|---|---|---|---|---|---|")
    for c in configs:
        print(f"| {c[2]} | {c[0]} | {c[1]} | {c[3]} | {fmt(rates[c], '{:.0f}')} | "
              f"{statistics.median(rates[c]) / first:.2f} | {fmt(aucs[c], '{:.4f}')} |")


if __name__ == "__main__":
    main()
