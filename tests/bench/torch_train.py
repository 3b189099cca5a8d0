#!/usr/bin/env python3
"""PyTorch's training throughput on an attnlab text run (by default nanoGPT's CPU Shakespeare run,
data/configs/shakespeare_char_cpu.json), in several variants, for tests/bench/compare_torch_train.sh,
which runs attnlab's own `train` beside it in one go.

The same run as `attnlab train --config CONFIG`: the data are attnlab's: the characters of the data
file, sorted by code point, are the vocabulary (lib/app/src/text.cpp), the first 90% of the encoded
text is the training part, and each batch is `batch` blocks of block + 1 contiguous tokens at
offsets drawn by attnlab's data stream (xoroshiro128+ seeded from the run seed, Rng::below), so
every variant and attnlab see the same batches. The step is attnlab's: forward, mean cross-entropy,
zero_grad, backward, clip_grad_norm_ to `clip`, torch.optim.AdamW (PyTorch's default
implementation, as nanoGPT uses on CPU) with the config's betas, eps 1e-8 and weight decay on every
parameter (attnlab has a single parameter group: norms, biases and embeddings decay too), the
learning rate set per step by attnlab's schedule (linear warmup to lr, then cosine to min_lr over
`steps`); float32 weights and optimizer state in every variant.

The variants (--variant, one or more; rows in this order):
  eager            python/attnlab_torch.py's Transformer built from the config's "model" (or, with
                   --init RUN, loaded with attnlab's weights from an attnlab run directory), eager
                   mode: the identical model, so its losses match attnlab's (--check). The default.
  compile          the same model (and its cross-entropy) under torch.compile, default mode
                   (Inductor's C++/OpenMP kernels; needs a C++ compiler). The compile time is
                   excluded from the timed figure: compiling happens in the first step, which is a
                   warm-up step (dynamo traces the forward there and AOTAutograd compiles the
                   backward with it); with --warmup-steps 0 it would count. "# compile ..." lines
                   give the first step's time, compile included. Inductor's kernels fix their
                   OpenMP thread count at compile time, so each run (thread count, repeat) starts
                   with torch._dynamo.reset() and compiles afresh (Inductor's on-disk cache, keyed
                   on the thread count, can make the later compiles quicker).
  nanogpt-eager    tests/bench/nanogpt_torch.py's GPT: nanoGPT's model-code style (fused c_attn,
                   F.scaled_dot_product_attention(is_causal=True), loss inside forward) with
                   attnlab's shapes and biases, so the same FLOPs and parameter count (its header
                   lists what differs from nanoGPT's own model.py and from attnlab's); eager mode.
                   With --init it starts from attnlab's weights (q, k and v stacked into c_attn),
                   so its losses track the eager variant's; without, nanoGPT's random init, seeded.
  nanogpt-compile  that model under torch.compile (default mode; compile time excluded as above).
  nanogpt-bf16     that model eager, forward and loss under torch.autocast("cpu", torch.bfloat16)
                   (weights, gradients and AdamW stay float32; no grad scaler, as bf16 needs none).
                   Its losses differ from float32's by about 1e-2.

Timing matches summary.json's tokens_per_second: a step's time is forward through optimizer step;
making the batch and setting the learning rate are outside it. For each variant, at each thread
count (torch's intra-op threads and, when torch calls OpenBLAS, OpenBLAS's own count, which
set_num_threads does not change) the run starts afresh and trains --warmup-steps + --steps steps;
the lines report the mean of the last --steps (the best over --repeats runs) and the mean over all
steps (for the compile variants, compile included).

Prints a "# torch VERSION, BLAS ..., MKL ..., oneDNN ..." line (alone with --info), then one line
per variant and thread count:
    train VARIANT THREADS MEAN_TIMED_SECONDS MEAN_ALL_SECONDS LAST_LOSS
The schedule spans --warmup-steps + --steps steps (attnlab's --steps). With --check METRICS_CSV
(an attnlab run trained with --eval-every 1 from the weights of --init), trains the eager variant on
one thread and prints the loss of each step beside attnlab's "loss" column instead:
    check STEP ATTNLAB_LOSS TORCH_LOSS
then "check max_abs_diff X", exiting 1 when X exceeds --tolerance.

Usage: python3 tests/bench/torch_train.py [--config C] [--init RUN] [--threads 1 2]
           [--variant eager compile nanogpt-eager nanogpt-compile nanogpt-bf16]
           [--warmup-steps 20] [--steps 100] [--repeats 1] [--check METRICS_CSV] [--info]
"""
import argparse
import contextlib
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attnlab_torch  # noqa: E402  (the path above first)
import nanogpt_torch  # noqa: E402

VARIANTS = ("eager", "compile", "nanogpt-eager", "nanogpt-compile", "nanogpt-bf16")

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


class AttnlabLoss(torch.nn.Module):
    """attnlab_torch's Transformer with its loss: forward(x, y) -> (logits, mean cross-entropy), as
    nanogpt_torch.GPT, so that torch.compile sees the loss in both models."""

    def __init__(self, model, vocab):
        super().__init__()
        self.model, self.vocab = model, vocab

    def forward(self, x, y):
        logits = self.model([x])
        return logits, F.cross_entropy(logits.view(-1, self.vocab), y.view(-1))


def info_line(blas):
    """torch's version and CPU math libraries in one line (from torch.__config__.show())."""
    shown = torch.__config__.show()

    def after(marker, stop):
        if marker not in shown:
            return None
        return shown.split(marker, 1)[1].split(stop, 1)[0].strip()

    mkl = after("Math Kernel Library Version ", "-") if torch.backends.mkl.is_available() else None
    onednn = after("MKL-DNN v", " ")
    parts = [f"torch {torch.__version__}", f"BLAS {after('BLAS_INFO=', ',') or '?'}",
             f"MKL {mkl}" if mkl else "no MKL",
             ("oneDNN " + (f"v{onednn} " if onednn else "") + "available"
              if torch.backends.mkldnn.is_available() else "oneDNN unavailable"),
             f"CPU capability {after('CPU capability usage: ', chr(10)) or '?'}",
             f"OpenMP {'yes' if torch.backends.openmp.is_available() else 'no'}"]
    if blas is not None:
        parts.append(f"OpenBLAS core {blas.openblas_get_corename().decode()}")
    return ", ".join(parts)


class Run:
    """One training run of a variant from the start: model, optimizer and data stream."""

    def __init__(self, config, chars, train, init, variant="eager"):
        torch.manual_seed(config.get("seed", 0))
        self.vocab = len(chars)
        if init:
            attnlab_model, _ = attnlab_torch.load_run(init)
            want = resolved_model(config, chars)
            for key in ("vocab_sizes", "out_vocab", "max_len", "layers"):
                if attnlab_model.config.get(key) != want[key]:
                    raise SystemExit(f"torch_train: {init}: model {key} {attnlab_model.config.get(key)} "
                                     f"differs from the config's {want[key]}")
        else:
            attnlab_model = attnlab_torch.Transformer(resolved_model(config, chars))
        if variant.startswith("nanogpt"):
            try:
                gpt = nanogpt_torch.GPT(attnlab_model.config)  # nanoGPT's init, seeded above
            except ValueError as e:
                raise SystemExit(f"torch_train: {variant}: {e}")
            count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
            if count(gpt) != count(attnlab_model):
                raise SystemExit(f"torch_train: {variant}: {count(gpt)} parameters, attnlab's model "
                                 f"{count(attnlab_model)}")
            if init:
                gpt.load_attnlab(attnlab_model)
            self.model = gpt
        else:
            self.model = AttnlabLoss(attnlab_model, self.vocab)
        self.model.train()
        self.forward = self.model
        if variant.endswith("compile"):
            # Inductor's CPU kernels fix their thread count when compiled: start afresh per run.
            torch._dynamo.reset()
            self.forward = torch.compile(self.model)  # default mode; compiles in the first step
        if variant.endswith("bf16"):
            self.autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)
        else:
            self.autocast = contextlib.nullcontext
        self.config, self.train = config, train
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=config["lr"],
                                     betas=(config.get("beta1", 0.9), config.get("beta2", 0.95)),
                                     eps=1e-8, weight_decay=config.get("weight_decay", 0.0))
        self.params = list(self.model.parameters())
        self.rng = Rng(data_seed(config.get("seed", 0)))
        self.block, self.batch = config["task"]["block"], config["batch"]
        self.span = torch.arange(self.block + 1)
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
        with self.autocast():
            _, loss = self.forward(x, y)
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
    parser.add_argument("--variant", nargs="+", action="extend", choices=VARIANTS, metavar="VARIANT",
                        help=f"one or more of {', '.join(VARIANTS)} (repeatable; default eager)")
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
    print(f"# {info_line(blas)}, vocab {len(chars)}, {len(train)} training tokens", flush=True)
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
    if args.warmup_steps < 1 and any(v.endswith("compile") for v in args.variant or []):
        raise SystemExit("torch_train: the compile variants need --warmup-steps >= 1 (the first step compiles)")
    for variant in dict.fromkeys(args.variant or ["eager"]):  # in order, once each
        for threads in args.threads:
            set_threads(threads, blas)
            best_timed, best_all, last = math.inf, math.inf, math.nan
            for _ in range(args.repeats):
                run = Run(config, chars, train, args.init, variant)
                times = []
                for _ in range(config["steps"]):
                    seconds, last = run.step()
                    times.append(seconds)
                if variant.endswith("compile"):
                    print(f"# compile {variant} {threads} threads: first step {times[0]:.2f} s "
                          f"(compile included), then {sum(times[1:]) / max(1, len(times) - 1):.4f} s "
                          f"a step", flush=True)
                best_timed = min(best_timed, sum(times[args.warmup_steps:]) / args.steps)
                best_all = min(best_all, sum(times) / len(times))
            print(f"train {variant} {threads} {best_timed:.6f} {best_all:.6f} {last:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
