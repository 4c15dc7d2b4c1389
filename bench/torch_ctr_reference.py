#!/usr/bin/env python3
"""PyTorch reference of Fulcrum's click models on the same synthetic data.

Reads a file written by fulcrum-ctr-data-dump and trains the same model
(bias + dense weights + a weight per id, an FM term over per-field
embedding bags, an optional MLP) with the same optimizers: Adagrad on the
tables (torch.nn.EmbeddingBag, sparse gradients), Adam on the dense
tensors, one process, in order. Prints the test AUC and the best AUC the
data allows (the true probabilities').

  build/bin/fulcrum-ctr-data-dump --out=/tmp/ctr.bin --examples=50000
  python3 bench/torch_ctr_reference.py /tmp/ctr.bin --model fm --epochs 2

With --start (written by `fulcrum-ctr-data-dump --spec=JOB.yaml
--start=FILE`) the reference runs that job: its model, optimizers, batch and
epochs from the spec in the file's metadata, its initial values (dense
tensors and table rows) and its order of examples, step by step; the model
flags are ignored. What is left to differ from Fulcrum is float rounding.

  build/bin/fulcrum-ctr-data-dump --spec=job.yaml --out=/tmp/ctr.bin --start=/tmp/start.safetensors
  python3 bench/torch_ctr_reference.py /tmp/ctr.bin --start /tmp/start.safetensors
"""
import argparse
import json
import struct

import numpy as np
import torch


def load(path):
    with open(path, 'rb') as f:
        train_n, test_n, fields, dense = struct.unpack('<qqii', f.read(24))
        row = np.dtype([('label', '<f4'), ('truth', '<f4'), ('dense', '<f4', (dense,)), ('ids', '<u8', (fields,))])
        train = np.frombuffer(f.read(train_n * row.itemsize), dtype=row)
        test = np.frombuffer(f.read(test_n * row.itemsize), dtype=row)
    return train, test, fields, dense


def auc(scores, labels):
    order = np.argsort(scores, kind='mergesort')
    ranks = np.empty(len(scores))
    s = scores[order]
    i = 0
    while i < len(s):  # ties get their average rank
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    pos = labels > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return (ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def read_safetensors(path):
    """The tensors (name -> numpy array) and the metadata of a safetensors file."""
    with open(path, 'rb') as f:
        b = f.read()
    n = struct.unpack('<Q', b[:8])[0]
    header = json.loads(b[8:8 + n])
    meta = header.pop('__metadata__', {})
    out = {}
    for name, h in header.items():
        lo, hi = h['data_offsets']
        dtype = {'F32': '<f4', 'U64': '<u8'}[h['dtype']]
        out[name] = np.frombuffer(b[8 + n + lo:8 + n + hi], dtype=dtype).reshape(h['shape'])
    return out, meta


ACTIVATIONS = {'RELU': torch.nn.ReLU, 'TANH': torch.nn.Tanh, 'SIGMOID': torch.nn.Sigmoid, 'NONE': torch.nn.Identity}
MODEL_KINDS = {'LOGISTIC_REGRESSION': 'lr', 'FM': 'fm', 'WIDE_AND_DEEP': 'wide_and_deep', 'DEEPFM': 'deepfm',
               'DLRM': 'dlrm'}


class ClickModel(torch.nn.Module):
    def __init__(self, vocab, fields, dense, dim, fm, hidden, init_scale, bottom=None, activation=torch.nn.ReLU):
        super().__init__()
        self.fields, self.fm = fields, fm
        self.bias = torch.nn.Parameter(torch.zeros(1))
        # DLRM (bottom is a list): no linear terms; a bottom MLP over the dense
        # features to x0, and the top MLP over x0 and every pair's dot product.
        self.dlrm = bottom is not None
        self.dense_weight = None if self.dlrm else torch.nn.Parameter(torch.zeros(dense))
        self.linear = None
        if not self.dlrm:
            self.linear = torch.nn.EmbeddingBag(vocab, 1, mode='sum', sparse=True)
            torch.nn.init.zeros_(self.linear.weight)
        self.embedding = None
        if dim > 0:
            self.embedding = torch.nn.EmbeddingBag(vocab, dim, mode='sum', sparse=True)
            torch.nn.init.uniform_(self.embedding.weight, -init_scale, init_scale)
        self.bottom = None
        if self.dlrm and dense > 0:
            layers, width = [], dense
            for h in bottom + [dim]:
                layers += [torch.nn.Linear(width, h), activation()]
                width = h
            self.bottom = torch.nn.Sequential(*layers)
        vectors = fields + (1 if self.bottom is not None else 0)
        layers = []
        width = (dim if self.bottom is not None else 0) + vectors * (vectors - 1) // 2 if self.dlrm else fields * dim + dense
        for h in hidden:
            layers += [torch.nn.Linear(width, h), activation()]
            width = h
        self.deep = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1)) if hidden else None

    def forward(self, ids, x):
        n = ids.shape[0]
        flat = ids.reshape(-1)
        offsets = torch.arange(0, flat.numel(), 1)  # one id per (example, field) bag
        if self.dlrm:
            v = self.embedding(flat, offsets).view(n, self.fields, -1)
            vecs = v if self.bottom is None else torch.cat([self.bottom(x).unsqueeze(1), v], 1)
            pairs = torch.triu_indices(vecs.shape[1], vecs.shape[1], 1)
            dots = torch.bmm(vecs, vecs.transpose(1, 2))[:, pairs[0], pairs[1]]
            top = dots if self.bottom is None else torch.cat([vecs[:, 0], dots], 1)
            return self.bias + self.deep(top).squeeze(1)
        z = self.bias + x @ self.dense_weight
        z = z + self.linear(flat, offsets).view(n, self.fields).sum(1)
        if self.embedding is not None:
            v = self.embedding(flat, offsets).view(n, self.fields, -1)
            if self.fm:
                z = z + 0.5 * (v.sum(1).pow(2) - v.pow(2).sum(1)).sum(1)
            if self.deep is not None:
                z = z + self.deep(torch.cat([v.reshape(n, -1), x], 1)).squeeze(1)
        return z


    def load_start(self, start, ids):
        """Fulcrum's initial values: its dense tensors by name ([in, out]
        weights, so transposed into torch's Linear) and its tables' rows of
        `ids` (the sorted ids the EmbeddingBags index)."""
        def put(param, values):
            values = torch.from_numpy(np.array(values, dtype=np.float32))
            assert tuple(param.shape) == tuple(values.shape), (tuple(param.shape), tuple(values.shape))
            with torch.no_grad():
                param.copy_(values)
        put(self.bias, start['bias'])
        if self.dense_weight is not None and self.dense_weight.numel() > 0:
            put(self.dense_weight, start['dense.weight'])
        for prefix, seq in (('deep', self.deep), ('bottom', self.bottom)):
            if seq is None:
                continue
            linears = [m for m in seq if isinstance(m, torch.nn.Linear)]
            for i, layer in enumerate(linears):
                put(layer.weight, start['%s%d.weight' % (prefix, i)].T)
                put(layer.bias, start['%s%d.bias' % (prefix, i)])
        for name, bag in (('linear', self.linear), ('embedding', self.embedding)):
            if bag is None:
                continue
            assert np.array_equal(start['table.%s.ids' % name], ids), 'the start file holds other ids than the data'
            put(bag.weight, start['table.%s.rows' % name])


def spec_settings(spec):
    """What the reference reads of a job spec (JSON, the scheduler's defaults
    applied): the model, its optimizers, batch and epochs."""
    model, data, opt = spec['model'], spec['data'], spec['optimizer']
    kind = MODEL_KINDS.get(model['kind'])
    if kind is None:
        raise SystemExit('model.kind %s is not a click model' % model['kind'])
    tables = {t['name']: t['optimizer'] for t in model.get('tables', [])}
    for name, t in tables.items():
        if t.get('kind', 'ADAGRAD') not in ('ADAGRAD', 'KIND_UNSPECIFIED'):
            raise SystemExit('table %s: the reference runs ADAGRAD tables only, not %s' % (name, t['kind']))
    if opt['kind'] not in ('ADAM', 'KIND_UNSPECIFIED', 'SGD'):
        raise SystemExit('optimizer.kind %s: the reference runs ADAM and SGD' % opt['kind'])
    if spec.get('lrSchedule', {}).get('kind', 'CONSTANT') not in ('CONSTANT', 'KIND_UNSPECIFIED'):
        raise SystemExit('the reference runs a constant learning rate')
    if int(data.get('gradientAccumulation', 1)) > 1:
        print('note: gradient accumulation is one step of the whole batch here')
    return dict(kind=kind, dim=int(model.get('embeddingDim', 0)), hidden=[int(h) for h in model.get('hiddenSizes', [])],
                bottom=[int(h) for h in model.get('bottomSizes', [])],
                activation=ACTIVATIONS[model.get('activation', 'RELU').replace('ACTIVATION_UNSPECIFIED', 'RELU')],
                tables=tables, opt=opt)


def main():
    p = argparse.ArgumentParser()
    p.add_argument('data')
    p.add_argument('--start', help="a job's start (fulcrum-ctr-data-dump --spec --start): its model, values and order")
    p.add_argument('--model', choices=['lr', 'fm', 'wide_and_deep', 'deepfm', 'dlrm'], default='fm')
    p.add_argument('--bottom', type=int, nargs='*', default=[8], help='DLRM bottom MLP hidden widths')
    p.add_argument('--dim', type=int, default=4)
    p.add_argument('--hidden', type=int, nargs='*', default=[16])
    p.add_argument('--epochs', type=int, default=2)
    p.add_argument('--batch', type=int, default=64)
    p.add_argument('--table_lr', type=float, default=0.1)
    p.add_argument('--dense_lr', type=float, default=0.01)
    p.add_argument('--init_scale', type=float, default=0.05)
    a = p.parse_args()
    torch.manual_seed(0)
    train, test, fields, dense = load(a.data)
    ids = np.concatenate([train['ids'].reshape(-1), test['ids'].reshape(-1)])
    uniq, inverse = np.unique(ids, return_inverse=True)
    train_ids = torch.from_numpy(inverse[:len(train) * fields].reshape(len(train), fields).astype(np.int64))
    test_ids = torch.from_numpy(inverse[len(train) * fields:].reshape(len(test), fields).astype(np.int64))
    activation = torch.nn.ReLU
    table_opts = {}
    dense_kind, dense_lr = 'ADAM', a.dense_lr
    if a.start:
        start, meta = read_safetensors(a.start)
        job = spec_settings(json.loads(meta['spec']))
        a.model, a.dim, a.hidden, a.bottom = job['kind'], job['dim'], job['hidden'], job['bottom']
        activation, table_opts = job['activation'], job['tables']
        dense_kind, dense_lr = job['opt']['kind'], float(job['opt']['lr'])
        steps = start['order'].astype(np.int64)
    else:
        steps = [np.arange(first, first + a.batch) for _ in range(a.epochs)
                 for first in range(0, len(train) - a.batch + 1, a.batch)]
    dim = 0 if a.model == 'lr' else a.dim
    hidden = a.hidden if a.model in ('wide_and_deep', 'deepfm', 'dlrm') else []
    model = ClickModel(len(uniq), fields, dense, dim, a.model in ('fm', 'deepfm'), hidden, a.init_scale,
                       a.bottom if a.model == 'dlrm' else None, activation)
    if a.start:
        model.load_start(start, uniq)
    tables = ([('linear', model.linear.weight)] if model.linear is not None else []) + \
        ([('embedding', model.embedding.weight)] if model.embedding is not None else [])
    others = [q for q in model.parameters() if all(q is not t for _, t in tables)]
    sparse_opts = []
    for name, weight in tables:
        o = table_opts.get(name, {})
        sparse_opts.append(torch.optim.Adagrad([weight], lr=float(o.get('lr', a.table_lr)),
                                               eps=float(o.get('epsilon', 1e-10)),
                                               initial_accumulator_value=float(o.get('initialAccumulator', 0))))
    dense_opt = torch.optim.SGD(others, lr=dense_lr) if dense_kind == 'SGD' else torch.optim.Adam(others, lr=dense_lr)
    x_train = torch.from_numpy(np.array(train['dense']))
    y_train = torch.from_numpy(np.array(train['label']))
    for rows in steps:
        rows = torch.from_numpy(np.asarray(rows))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(train_ids[rows], x_train[rows]), y_train[rows])
        for opt in sparse_opts + [dense_opt]:
            opt.zero_grad()
        loss.backward()
        for opt in sparse_opts + [dense_opt]:
            opt.step()
    with torch.no_grad():
        scores = model(test_ids, torch.from_numpy(np.array(test['dense']))).numpy()
    print('model %s: test AUC %.6f; best reachable (true probabilities) %.4f' %
          (a.model, auc(scores, test['label']), auc(test['truth'], test['label'])))


if __name__ == '__main__':
    main()
