#!/usr/bin/env python3
"""PyTorch eager peer of fulcrum-gpu-bench: the same models, batch and
precision, forward + backward + packing the gradients to bf16, timed the same
way (10 warm-up steps, then the median of many steps, each closed by a
device synchronize). Prints one line per case:
    torch <model> <precision> <samples/s> <TFLOP/s>
"""
import argparse
import time

import torch
import torch.nn as nn

CASES = [
    ("mlp-784-1024-1024-10/b4096", [784, 1024, 1024, 10], 4096),
    ("mlp-4096x4/b8192", [4096, 4096, 4096, 4096], 8192),
]


def build(dims):
    layers = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i + 2 < len(dims):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers).cuda()


def run(dims, batch, precision, steps):
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    model = build(dims)
    x = torch.rand(batch, dims[0], device="cuda") * 2 - 1
    y = torch.arange(batch, device="cuda") % dims[-1]
    loss_fn = nn.CrossEntropyLoss()
    params = list(model.parameters())

    def step():
        for p in params:
            p.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = loss_fn(model(x), y)
        loss.backward()
        packed = torch.cat([p.grad.reshape(-1) for p in params]).to(torch.bfloat16)
        torch.cuda.synchronize()
        return packed

    for _ in range(10):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    times.sort()
    median = times[len(times) // 2]
    macs = sum(dims[i] * dims[i + 1] for i in range(len(dims) - 1))
    return batch / median, 6.0 * batch * macs / median / 1e12


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    for name, dims, batch in CASES:
        for precision in ("fp32", "tf32", "bf16"):
            sps, tflops = run(dims, batch, precision, args.steps)
            print(f"torch {name} {precision} {sps:.1f} {tflops:.2f}", flush=True)


if __name__ == "__main__":
    main()
