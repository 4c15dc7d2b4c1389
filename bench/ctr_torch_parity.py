#!/usr/bin/env python3
"""Fulcrum's click models against PyTorch, step for step.

For each model kind, one BSP job (by default 2 workers, 2 servers) on a
fresh local cluster; then `fulcrum-ctr-data-dump --spec` writes that job's
data, initial values (dense tensors and table rows) and order of examples,
and bench/torch_ctr_reference.py --start trains the same model with
PyTorch (EmbeddingBag, torch.optim) from those values in that order. Both
print the test AUC of the same test set; what can differ is float rounding
(summation orders, BLAS against torch's kernels) growing over the steps.

    /usr/bin/python3 bench/ctr_torch_parity.py [--models lr,fm,wide_and_deep,deepfm,dlrm]
        [--examples 50000] [--epochs 2] [--batch 64] [--workers 2] [--servers 2] [--bin build/bin]

PyTorch: Debian's python3-torch (apt-get install python3-torch).

The data: 4 fields of 100 ids, 2 dense features, true FM interactions of
width 2 and scale 0.5 (mf: 2 fields, users and items, of 500 ids, no dense
features, true interactions of width 4) (the true click probabilities' AUC is the best
reachable). AUCs are printed to 6 places: the test set has 10,000 examples.
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile

from local_job import run, run_job

KINDS = {'lr': 'LOGISTIC_REGRESSION', 'fm': 'FM', 'wide_and_deep': 'WIDE_AND_DEEP', 'deepfm': 'DEEPFM',
         'dlrm': 'DLRM', 'mf': 'FM'}


def spec_for(model, a):
    spec = {
        'name': 'parity-' + model.replace('_', '-'),
        'model': {
            'kind': KINDS[model],
            'tables': [],
        },
        'data': {
            'dataset': 'SYNTHETIC_CTR',
            'syntheticCtr': {'examples': a.examples, 'fields': 4, 'vocabulary': 100, 'dense': 2, 'fmDim': 2,
                             'fmScale': 0.5},
            'batchSize': a.batch // a.workers,
            'epochs': a.epochs,
            'shuffleSeed': 3,
        },
        'optimizer': {'kind': 'ADAM', 'lr': 0.01},
        'mode': 'BSP',
        'numWorkers': a.workers,
        'replicas': 1,
        'seed': 5,
    }
    for table in (['linear'] if model != 'dlrm' else []) + (['embedding'] if model != 'lr' else []):
        spec['model']['tables'].append({'name': table, 'optimizer': {'kind': 'ADAGRAD', 'lr': 0.1}})
    if model != 'lr':
        spec['model']['embeddingDim'] = 4
    if model == 'mf':
        # Matrix factorization: FM over two fields (user, item) and no dense
        # features is bias + b_user + b_item + <p_user, q_item>; the data's
        # true model is one too (latent width 4).
        spec['data']['syntheticCtr'].update({'fields': 2, 'vocabulary': 500, 'dense': 0, 'fmDim': 4})
    if model in ('wide_and_deep', 'deepfm', 'dlrm'):
        spec['model']['hiddenSizes'] = [16]
    if model == 'dlrm':
        spec['model']['bottomSizes'] = [8]
    return spec


def fulcrum_auc(fulcrum, spec_path, a):
    with open(spec_path) as f:
        status = run_job(fulcrum, f.read(), a.servers, a.workers, prefix='fulcrum-parity-')
    return float(status['progress']['testAuc'])


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--models', default='lr,fm,wide_and_deep,deepfm,dlrm,mf')
    p.add_argument('--examples', type=int, default=50000)
    p.add_argument('--epochs', type=int, default=2)
    p.add_argument('--batch', type=int, default=64, help='the global batch (split over the workers)')
    p.add_argument('--workers', type=int, default=2)
    p.add_argument('--servers', type=int, default=2)
    p.add_argument('--bin', default='build/bin')
    a = p.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    fulcrum = os.path.join(a.bin, 'fulcrum')
    rows = []
    work = tempfile.mkdtemp(prefix='fulcrum-parity-files-')
    try:
        for model in a.models.split(','):
            spec_path = os.path.join(work, model + '.json')
            with open(spec_path, 'w') as f:
                json.dump(spec_for(model, a), f)
            ours = fulcrum_auc(fulcrum, spec_path, a)
            data, start = os.path.join(work, 'ctr.bin'), os.path.join(work, 'start.safetensors')
            run([os.path.join(a.bin, 'fulcrum-ctr-data-dump'), '--spec=' + spec_path, '--out=' + data,
                 '--start=' + start])
            out = run([sys.executable, os.path.join(here, 'torch_ctr_reference.py'), data, '--start', start])
            m = re.search(r'test AUC ([0-9.]+); best reachable \(true probabilities\) ([0-9.]+)', out)
            theirs, best = float(m.group(1)), float(m.group(2))
            print('%s: Fulcrum %.6f, PyTorch %.6f, best %.4f' % (model, ours, theirs, best), file=sys.stderr,
                  flush=True)
            rows.append((model, ours, theirs, best))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print('\nClick models, BSP on %d servers and %d workers against PyTorch from the same initial values in the '
          'same order (%d examples, %d epochs, global batch %d):\n' % (a.servers, a.workers, a.examples, a.epochs,
                                                                       a.batch))
    print('| model | Fulcrum test AUC | PyTorch test AUC | difference | best reachable |')
    print('|---|---|---|---|---|')
    for model, ours, theirs, best in rows:
        print('| %s | %.6f | %.6f | %.6f | %.4f |' % (model, ours, theirs, abs(ours - theirs), best))


if __name__ == '__main__':
    main()
