#!/usr/bin/python3
"""Single-process PyTorch peer of the demo job (examples/fashion-mnist-mlp.yaml):
the same MLP 784-256-10 (ReLU), Fashion-MNIST scaled to [0, 1], the same
global batch (2 partitions x 64 = 128 a step), SGD with momentum 0.9 at
lr 0.05 with 100 warm-up steps and a cosine decay to 0.001, 3 epochs, the
test set evaluated at each epoch end, on the CPU with every core. Prints one
line:
    torch <seconds from the first step to the last> <test accuracy> <steps>
Uses Debian's python3-torch (run with /usr/bin/python3).
"""
import argparse
import gzip
import math
import struct
import time

import torch
import torch.nn as nn


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, count = struct.unpack(">II", data[:8])
    if magic == 0x803:
        rows, cols = struct.unpack(">II", data[8:16])
        return torch.frombuffer(bytearray(data[16:]), dtype=torch.uint8).reshape(count, rows * cols)
    return torch.frombuffer(bytearray(data[8:]), dtype=torch.uint8).long()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--min_lr", type=float, default=0.001)
    parser.add_argument("--threads", type=int, default=0, help="0: every core")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    else:
        import os
        torch.set_num_threads(os.cpu_count())
    torch.manual_seed(42)
    x = read_idx(f"{args.data}/train-images-idx3-ubyte.gz").float() / 255.0
    y = read_idx(f"{args.data}/train-labels-idx1-ubyte.gz")
    tx = read_idx(f"{args.data}/t10k-images-idx3-ubyte.gz").float() / 255.0
    ty = read_idx(f"{args.data}/t10k-labels-idx1-ubyte.gz")
    model = nn.Sequential(nn.Linear(784, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()
    steps_per_epoch = x.shape[0] // args.batch
    total = steps_per_epoch * args.epochs

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        progress = (step - args.warmup) / max(1, total - args.warmup)
        return args.min_lr + (args.lr - args.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))

    accuracy = 0.0
    step = 0
    start = time.perf_counter()
    for epoch in range(args.epochs):
        order = torch.randperm(x.shape[0])
        for s in range(steps_per_epoch):
            idx = order[s * args.batch:(s + 1) * args.batch]
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            opt.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            step += 1
        with torch.no_grad():
            accuracy = (model(tx).argmax(1) == ty).float().mean().item()
    seconds = time.perf_counter() - start
    print(f"torch {seconds:.3f} {accuracy:.4f} {step}")


if __name__ == "__main__":
    main()
