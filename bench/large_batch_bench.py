#!/usr/bin/env python3
"""Large-batch training side by side: examples/fashion-mnist-lamb.yaml (the
demo's MLP on Fashion-MNIST, global batch 2048, 3 epochs, warm-up and
cosine) with LAMB and with the other optimizers at the same batch, steps
and schedule. Each run on its own fresh local cluster (2 servers, 2
workers), the configurations alternating over rounds. Printed per
configuration: the final test accuracy (BSP: the same every round) and the
job's examples/s (min / median / max), and the median against Adam's, which
is what LAMB's second round trip per step (its norms) costs.

    /usr/bin/python3 bench/large_batch_bench.py [--rounds 3] [--bin build/bin]
        [--spec examples/fashion-mnist-lamb.yaml]
"""
import argparse
import os
import re
import statistics
import sys

from local_job import run_job

# (label, optimizer block of the spec)
CONFIGS = [
    ('LAMB lr 0.05', 'optimizer:\n  kind: LAMB\n  lr: 0.05\n  weightDecay: 0.01\n'),
    ('ADAM lr 0.001', 'optimizer:\n  kind: ADAM\n  lr: 0.001\n'),
    ('ADAM lr 0.01', 'optimizer:\n  kind: ADAM\n  lr: 0.01\n'),
    ('SGD lr 0.05 momentum 0.9', 'optimizer:\n  kind: SGD\n  lr: 0.05\n  momentum: 0.9\n'),
]


def one_run(fulcrum, base, optimizer):
    text = re.sub(r'(?m)^optimizer:\n(?:  .*\n)+', optimizer, base)
    # The schedule's minLr must stay below the rate.
    lr = float(re.search(r'lr: ([0-9.]+)', optimizer).group(1))
    text = re.sub(r'(?m)^  minLr: .*$', '  minLr: %g' % (lr / 20), text)
    status = run_job(fulcrum, text, 2, 2, prefix='fulcrum-large-batch-')
    progress = status['progress']
    examples = int(progress['step']) * int(status['spec']['data']['batchSize']) * 2
    return float(progress['testAccuracy']), examples / float(progress['elapsedSeconds'])


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--rounds', type=int, default=3)
    p.add_argument('--bin', default='build/bin')
    p.add_argument('--spec', default='examples/fashion-mnist-lamb.yaml')
    a = p.parse_args()
    fulcrum = os.path.join(a.bin, 'fulcrum')
    base = open(a.spec).read()
    accuracy = {c[0]: [] for c in CONFIGS}
    rate = {c[0]: [] for c in CONFIGS}
    for r in range(a.rounds):
        for label, optimizer in CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)]:
            acc, eps = one_run(fulcrum, base, optimizer)
            accuracy[label].append(acc)
            rate[label].append(eps)
            print('round %d: %s: test accuracy %.4f, %.0f examples/s' % (r + 1, label, acc, eps), file=sys.stderr,
                  flush=True)
    adam = statistics.median(rate['ADAM lr 0.001'])
    print('\n%s, %d rounds alternating, %d cores (min / median / max):\n' % (a.spec, a.rounds, os.cpu_count()))
    print('| optimizer | test accuracy | examples/s | vs ADAM |')
    print('|---|---|---|---|')
    for label, _ in CONFIGS:
        v = rate[label]
        print('| %s | %s | %.0f / %.0f / %.0f | %.2f |' % (
            label, ' / '.join('%.4f' % x for x in sorted(set(accuracy[label]))), min(v), statistics.median(v),
            max(v), statistics.median(v) / adam))


if __name__ == '__main__':
    main()
