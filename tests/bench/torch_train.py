#!/usr/bin/env python3
"""PyTorch eager's training throughput on an attnlab text run (by default nanoGPT's CPU Shakespeare
run, data/configs/shakespeare_char_cpu.json), for tests/bench/compare_torch_train.sh, which runs
attnlab's own `train` beside it in one go.

The same run as `attnlab train --config CONFIG`: the model is python/attnlab_torch.py's Transformer
built from the config's "model" (or, with --init RUN, loaded with attnlab's weights from an attnlab
run directory); the data are attnlab's: the characters of the data file, sorted by code point, are
the vocabulary (lib/app/src/text.cpp), the first 90% of the encoded text is the training part, and
each batch is `batch` blocks of block + 1 contiguous tokens at offsets drawn by attnlab's data
stream (xoroshiro128+ seeded from the run seed, Rng::below), so both sides see the same batches.
The step is attnlab's: forward, mean cross-entropy, zero_grad, backward, clip_grad_norm_ to `clip`,
torch.optim.AdamW with the config's betas, eps 1e-8 and weight decay on every parameter (attnlab
has a single parameter group: norms, biases and embeddings decay too), the learning rate set per
step by attnlab's schedule (linear warmup to lr, then cosine to min_lr over `steps`); float32.

Timing matches summary.json's tokens_per_second: a step's time is forward through optimizer step;
making the batch and setting the learning rate are outside it. At each thread count (torch's
intra-op threads and, when torch calls OpenBLAS, OpenBLAS's own count, which set_num_threads does
not change) the run starts afresh and trains --warmup-steps + --steps steps; the lines report the
mean of the last --steps (the best over --repeats runs) and the mean over all steps.

Prints a "# torch VERSION, BLAS ..." line (alone with --info), then one line per thread count:
    train THREADS MEAN_TIMED_SECONDS MEAN_ALL_SECONDS LAST_LOSS
The schedule spans --warmup-steps + --steps steps (attnlab's --steps). With --check METRICS_CSV
(an attnlab run trained with --eval-every 1 from the weights of --init), trains on one thread and
prints the loss of each step beside attnlab's "loss" column instead:
    check STEP ATTNLAB_LOSS TORCH_LOSS
then "check max_abs_diff X", exiting 1 when X exceeds --tolerance.

Usage: python3 tests/bench/torch_train.py [--config C] [--init RUN] [--threads 1 2]
           [--warmup-steps 20] [--steps 100] [--repeats 1] [--check METRICS_CSV] [--info]
"""
import argparse
import csv
import ctypes
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
import attnlab_torch  # noqa: E402  (the path above first)

MASK64 = (1 << 64) - 1


def splitmix64(x):
    """One splitmix64 step: (new state, output)."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return x, z ^ (z >> 31)


class Rng:
    """attnlab's Rng (lib/src/random.cpp): xoroshiro128+ seeded by splitmix64; below() only."""

    def __init__(self, seed):
        sm, self.s0 = splitmix64(seed & MASK64)
        _, self.s1 = splitmix64(sm)

    def next_u64(self):
        a, b = self.s0, self.s1
        result = (a + b) & MASK64
        b ^= a
        self.s0 = (((a << 24) | (a >> 40)) & MASK64) ^ b ^ ((b << 16) & MASK64)
        self.s1 = ((b << 37) | (b >> 27)) & MASK64
        return result

    def below(self, n):
        limit = MASK64 - MASK64 % n
        x = self.next_u64()
        while x >= limit:
            x = self.next_u64()
        return x % n


def data_seed(seed):
    """The data stream's seed (trainer.cpp's data_seed): splitmix64 of seed ^ 0xda7a5eed."""
    return splitmix64((seed ^ 0xDA7A5EED) & MASK64)[1]


def lr_at(step, config):
    """attnlab's LrSchedule::lr_at (lib/src/optim/schedule.cpp)."""
    lr = config["lr"]
    if config.get("schedule", "cosine") != "cosine":
        return lr
    warmup, total, min_lr = config.get("warmup", 0), config["steps"], config.get("min_lr", 0.0)
    if step < warmup:
        return lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / (total - warmup)
    return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


def load_text(config):
    """(chars, training tokens) of a text run: attnlab's char vocabulary and 90% split."""
    task = config["task"]
    if task.get("kind") != "text" or task.get("vocab", "char") != "char":
        raise SystemExit("torch_train: expected a config of task kind text with vocab char")
    path = config["data_file"]
    if not os.path.isabs(path):
        path = os.path.join(ROOT, path)
    with open(path, "rb") as f:
        text = f.read().decode("utf-8")  # bytes as they are: no newline translation
    chars = "".join(sorted(set(text)))
    index = {c: i for i, c in enumerate(chars)}
    tokens = torch.tensor([index[c] for c in text], dtype=torch.long)
    n = len(tokens)
    return chars, tokens[: n - n // 10]


def resolved_model(config, chars):
    """The "model" of the config as attnlab resolves it for a char text task."""
    model = json.loads(json.dumps(config["model"]))
    model["vocab_sizes"] = [len(chars)]
    model["out_vocab"] = len(chars)
    model["max_len"] = config["task"]["block"]
    return model


def openblas():
    """The OpenBLAS library torch has loaded (through libblas.so.3 on Debian), or None."""
    with open("/proc/self/maps") as f:
        paths = sorted({line.split()[-1] for line in f if "blas" in line and "/" in line})
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_set_num_threads  # noqa: B018  (raises AttributeError when absent)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib
        except (OSError, AttributeError):
            continue
    return None


def set_threads(threads, blas):
    torch.set_num_threads(threads)
    if blas is not None:
        blas.openblas_set_num_threads(threads)


class Run:
    """One training run from the start: model, optimizer and data stream."""

    def __init__(self, config, chars, train, init):
        torch.manual_seed(config.get("seed", 0))
        if init:
            self.model, _ = attnlab_torch.load_run(init)
            want = resolved_model(config, chars)
            for key in ("vocab_sizes", "out_vocab", "max_len", "layers"):
                if self.model.config.get(key) != want[key]:
                    raise SystemExit(f"torch_train: {init}: model {key} {self.model.config.get(key)} "
                                     f"differs from the config's {want[key]}")
        else:
            self.model = attnlab_torch.Transformer(resolved_model(config, chars))
        self.model.train()
        self.config, self.train = config, train
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=config["lr"],
                                     betas=(config.get("beta1", 0.9), config.get("beta2", 0.95)),
                                     eps=1e-8, weight_decay=config.get("weight_decay", 0.0))
        self.params = list(self.model.parameters())
        self.rng = Rng(data_seed(config.get("seed", 0)))
        self.block, self.batch = config["task"]["block"], config["batch"]
        self.span = torch.arange(self.block + 1)
        self.vocab = len(chars)
        self.step_index = 0

    def next_batch(self):
        n = len(self.train) - self.block
        offsets = torch.tensor([self.rng.below(n) for _ in range(self.batch)], dtype=torch.long)
        rows = self.train[offsets[:, None] + self.span]
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def step(self):
        """One training step: (seconds, loss)."""
        for group in self.opt.param_groups:
            group["lr"] = lr_at(self.step_index, self.config)
        x, y = self.next_batch()
        start = time.perf_counter()
        logits = self.model([x])
        loss = F.cross_entropy(logits.view(-1, self.vocab), y.view(-1))
        value = loss.item()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if self.config.get("clip", 0) > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.config["clip"])
        self.opt.step()
        elapsed = time.perf_counter() - start
        self.step_index += 1
        return elapsed, value


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=os.path.join(ROOT, "data/configs/shakespeare_char_cpu.json"))
    parser.add_argument("--init", help="an attnlab run directory whose weights start the run")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--warmup-steps", type=int, default=20, help="untimed steps first")
    parser.add_argument("--steps", type=int, default=100, help="timed steps")
    parser.add_argument("--repeats", type=int, default=1, help="runs per thread count (the best counts)")
    parser.add_argument("--check", metavar="METRICS_CSV",
                        help="compare the losses with this attnlab metrics.csv (--eval-every 1)")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="--check: the largest |diff|")
    parser.add_argument("--info", action="store_true", help="print the '# torch ...' line only")
    args = parser.parse_args()

    with open(args.config, encoding="utf-8") as f:
        config = json.load(f)
    chars, train = load_text(config)
    blas = openblas()
    print(f"# torch {torch.__version__}, BLAS {torch.__config__.show().split('BLAS_INFO=')[1].split(',')[0]}"
          + (f", OpenBLAS core {blas.openblas_get_corename().decode()}" if blas is not None else "")
          + f", vocab {len(chars)}, {len(train)} training tokens", flush=True)
    if args.info:
        return 0

    if args.check:
        if not args.init:
            raise SystemExit("torch_train: --check needs --init (the attnlab run's initial weights)")
        with open(args.check, newline="") as f:
            ref = [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(f) if r["loss"] != "nan"]
        config["steps"] = args.warmup_steps + args.steps  # the schedule of the attnlab run
        set_threads(1, blas)
        run = Run(config, chars, train, args.init)
        worst = 0.0
        for step, attnlab_loss in ref:
            if step != run.step_index + 1:
                raise SystemExit(f"torch_train: {args.check}: expected a row per step (--eval-every 1), got step {step}")
            _, loss = run.step()
            worst = max(worst, abs(loss - attnlab_loss))
            print(f"check {step} {attnlab_loss:.6f} {loss:.6f}", flush=True)
        print(f"check max_abs_diff {worst:.3g}", flush=True)
        return 0 if ref and worst <= args.tolerance else 1

    config["steps"] = args.warmup_steps + args.steps
    for threads in args.threads:
        set_threads(threads, blas)
        best_timed, best_all, last = math.inf, math.inf, math.nan
        for _ in range(args.repeats):
            run = Run(config, chars, train, args.init)
            times = []
            for _ in range(config["steps"]):
                seconds, last = run.step()
                times.append(seconds)
            best_timed = min(best_timed, sum(times[args.warmup_steps:]) / args.steps)
            best_all = min(best_all, sum(times) / len(times))
        print(f"train {threads} {best_timed:.6f} {best_all:.6f} {last:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
