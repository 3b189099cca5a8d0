#!/usr/bin/env python3
"""PyTorch's attention on the shape of attnlab_bench's bf16 tiles table (bench_bf16_tiles.cpp):
forward + backward of scaled_dot_product_attention, B 4, H 8, T 1024, D 64, not causal, on the
CPU, for the columns beside attnlab's in tests/bench/README.md ("bf16 tiles of the fused attention
on a CPU with AMX").

Variants: fp32 eager; bf16 autocast eager (what a user of torch's bf16 would run); and both under
torch.compile. Each is timed as the minimum over --iters iterations after 2 warm-up ones, at each
thread count of --threads. Prints "variant threads ms" lines. Needs torch >= 2.0 (pip's wheel in a
venv, never in CI).

Usage: python3 tests/bench/torch_attention.py [--iters 5] [--threads 1 2] [--no-compile]
"""
import argparse
import time

import torch
import torch.nn.functional as F

B, H, T, D = 4, 8, 1024, 64


def step(q, k, v, dout, bf16):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = F.scaled_dot_product_attention(q, k, v)
    out.backward(dout.to(out.dtype))
    return out


def best_ms(fn, q, k, v, dout, bf16, iters):
    for _ in range(2):
        fn(q, k, v, dout, bf16)
    best = float("inf")
    for _ in range(iters):
        for t in (q, k, v):
            t.grad = None
        start = time.perf_counter()
        fn(q, k, v, dout, bf16)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(5)
    q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
    dout = torch.randn(B, H, T, D)
    variants = [("fp32_eager", step, False), ("bf16_autocast_eager", step, True)]
    if not args.no_compile:
        compiled = torch.compile(step)
        variants += [("fp32_compile", compiled, False), ("bf16_autocast_compile", compiled, True)]
    print(f"# torch {torch.__version__}, B {B}, H {H}, T {T}, D {D}, not causal, fwd+bwd, min ms")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name, fn, bf16 in variants:
            print(f"{name} {threads} {best_ms(fn, q, k, v, dout, bf16, args.iters):.1f}", flush=True)


if __name__ == "__main__":
    main()
