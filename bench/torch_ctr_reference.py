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
"""
import argparse
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


class ClickModel(torch.nn.Module):
    def __init__(self, vocab, fields, dense, dim, fm, hidden, init_scale, bottom=None):
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
                layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
                width = h
            self.bottom = torch.nn.Sequential(*layers)
        vectors = fields + (1 if self.bottom is not None else 0)
        layers = []
        width = (dim if self.bottom is not None else 0) + vectors * (vectors - 1) // 2 if self.dlrm else fields * dim + dense
        for h in hidden:
            layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument('data')
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
    dim = 0 if a.model == 'lr' else a.dim
    hidden = a.hidden if a.model in ('wide_and_deep', 'deepfm', 'dlrm') else []
    model = ClickModel(len(uniq), fields, dense, dim, a.model in ('fm', 'deepfm'), hidden, a.init_scale,
                       a.bottom if a.model == 'dlrm' else None)
    tables = ([model.linear.weight] if model.linear is not None else []) + \
        ([model.embedding.weight] if model.embedding is not None else [])
    others = [q for q in model.parameters() if all(q is not t for t in tables)]
    sparse_opt = torch.optim.Adagrad(tables, lr=a.table_lr, eps=1e-10)
    dense_opt = torch.optim.Adam(others, lr=a.dense_lr)
    x_train = torch.from_numpy(np.array(train['dense']))
    y_train = torch.from_numpy(np.array(train['label']))
    for _ in range(a.epochs):
        for first in range(0, len(train) - a.batch + 1, a.batch):
            sl = slice(first, first + a.batch)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(train_ids[sl], x_train[sl]), y_train[sl])
            sparse_opt.zero_grad()
            dense_opt.zero_grad()
            loss.backward()
            sparse_opt.step()
            dense_opt.step()
    with torch.no_grad():
        scores = model(test_ids, torch.from_numpy(np.array(test['dense']))).numpy()
    print('model %s: test AUC %.4f; best reachable (true probabilities) %.4f' %
          (a.model, auc(scores, test['label']), auc(test['truth'], test['label'])))


if __name__ == '__main__':
    main()
