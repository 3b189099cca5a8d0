#!/usr/bin/env python3
"""PyTorch eager's training step on the models of tests/bench/train_models.hpp, for attnlab_bench's
--torch=FILE column (tests/bench/compare_torch.sh runs both in one go).

The same step as tests/bench/bench_train.cpp: forward, mean softmax cross-entropy, zero_grad,
backward and a plain SGD update (no momentum), in float32, on random tokens, with attnlab's
Transformer: summed field embedding + learned positions, pre-LN blocks (LayerNorm, bias-free
q/k/v/o projections, causal softmax attention scaled by 1/sqrt(d_k), MLP fc1 -> GELU(tanh) -> fc2
with biases), a final LayerNorm and a bias-free head. Attention is written out (q k^T, mask,
softmax, @ v), as nanoGPT does without flash attention; torch 1.13 (Debian's python3-torch) has no
scaled_dot_product_attention. Prints "model threads seconds" lines: the best step of --steps timed
steps after 3 warm-up steps, at each thread count.

Usage: python3 tests/bench/torch_step.py [--steps 20] [--threads 1 2] > torch_times.txt
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# name, B, T, d_model, heads, d_k (0: d_model / heads), d_ff (0: 4 d_model), layers, attn_only, vocab;
# d_v is always d_model / heads (attnlab's default, which train_models.hpp keeps)
MODELS = [
    ("study", 64, 33, 64, 1, 256, 0, 1, True, 16),
    ("small", 16, 256, 128, 4, 0, 512, 2, False, 16),
    ("nanogpt", 12, 64, 128, 4, 0, 512, 4, False, 65),
]


class Block(nn.Module):
    def __init__(self, c, heads, d_k, d_v, d_ff, attn_only):
        super().__init__()
        self.heads, self.d_k, self.d_v = heads, d_k, d_v
        self.ln1 = nn.LayerNorm(c)
        self.w_q = nn.Linear(c, heads * d_k, bias=False)
        self.w_k = nn.Linear(c, heads * d_k, bias=False)
        self.w_v = nn.Linear(c, heads * d_v, bias=False)
        self.w_o = nn.Linear(heads * d_v, c, bias=False)
        self.attn_only = attn_only
        if not attn_only:
            self.ln2 = nn.LayerNorm(c)
            self.fc1 = nn.Linear(c, d_ff)
            self.fc2 = nn.Linear(d_ff, c)

    def forward(self, x, mask):
        b, t, _ = x.shape
        a = self.ln1(x)
        split = lambda y, d: y.view(b, t, self.heads, d).transpose(1, 2)
        q, k = split(self.w_q(a), self.d_k), split(self.w_k(a), self.d_k)
        v = split(self.w_v(a), self.d_v)
        s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d_k))
        p = F.softmax(s.masked_fill(mask[:t, :t], float("-inf")), dim=-1)
        o = (p @ v).transpose(1, 2).reshape(b, t, self.heads * self.d_v)
        x = x + self.w_o(o)
        if self.attn_only:
            return x
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Model(nn.Module):
    def __init__(self, b, t, c, heads, d_k, d_ff, layers, attn_only, vocab):
        super().__init__()
        d_v = c // heads  # attnlab's default d_v, whatever d_k is
        d_k = d_k or d_v
        self.embed = nn.Embedding(vocab, c)
        self.pos = nn.Parameter(torch.randn(t, c))
        self.blocks = nn.ModuleList(
            Block(c, heads, d_k, d_v, d_ff or 4 * c, attn_only) for _ in range(layers))
        self.ln_f = nn.LayerNorm(c)
        self.head = nn.Linear(c, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.ones(t, t, dtype=torch.bool), 1))

    def forward(self, ids):
        x = self.embed(ids) + self.pos[: ids.shape[1]]
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(self.ln_f(x))


def best_step(spec, steps):
    name, b, t, c, heads, d_k, d_ff, layers, attn_only, vocab = spec
    torch.manual_seed(5)
    model = Model(b, t, c, heads, d_k, d_ff, layers, attn_only, vocab)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ids = torch.randint(0, vocab, (b, t))
    targets = torch.randint(0, vocab, (b, t))
    best = math.inf
    for i in range(3 + steps):
        start = time.perf_counter()
        loss = F.cross_entropy(model(ids).view(-1, vocab), targets.view(-1))
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        elapsed = time.perf_counter() - start
        if i >= 3:
            best = min(best, elapsed)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    for spec in MODELS:
        for threads in args.threads:
            torch.set_num_threads(threads)
            print(f"{spec[0]} {threads} {best_step(spec, args.steps):.6f}", flush=True)


if __name__ == "__main__":
    main()
