#!/usr/bin/env python3
"""Generate golden reference values for the attnlab C++ tests, using PyTorch.

PyTorch serves as an independent implementation: the C++ tests compare their
own results against the numbers written here.

What it makes (all paths relative to the repository root):
  tests/data/golden/sdpa.json           scaled dot-product attention: out, P, dq, dk, dv
  tests/data/golden/gqa.json            grouped-query attention (Hkv < H): out, P, dq, dk, dv
  tests/data/golden/window.json         sliding-window causal attention (a band mask): the same
  tests/data/golden/alibi.json          ALiBi (a float bias on the scaled scores): the same
  tests/data/golden/bias.json           an additive bias (1|B, 1|H, Tq, Tk) and its gradient,
                                        with GQA, causal with an offset and a key mask
  tests/data/golden/dropout.json        attention dropout replaying attnlab's mask (drawn here by
                                        an independent Philox4x32-10), with GQA, a mask and a bias
  tests/data/golden/softmax.json        row softmax and its backward
  tests/data/golden/optim.json          AdamW and SGD trajectories (torch.optim)
  tests/data/golden/layers.json         linear, layernorm, rmsnorm, gelu, relu, relu_squared, softcap,
                                        embedding
  tests/data/golden/cross_entropy.json  mean cross-entropy with ignore_index=-100
  tests/data/golden/z_loss.json         cross-entropy + PaLM's z-loss z * logsumexp(logits)^2
                                        (mean over labelled positions), also after a softcap
  tests/data/golden/mha.json            multi-head attention (self, cross, QK-norm, learnable
                                        scale) and a pre-LN transformer block: outputs, attention
                                        weights, input and parameter gradients
  tests/data/golden/rope.json           rotary positions (complex multiplication, as Meta's
                                        LLaMA writes it): the op with offsets, partial and
                                        interleaved pairs; attention layers with RoPE (after
                                        QK-norm, GQA, a key mask)
  tests/data/golden/softcap.json        the attention-score softcap c tanh(s q.k / c) with ALiBi,
                                        a bias (and its gradient), GQA, causal with an offset and
                                        a key mask
  tests/data/golden/swiglu.json         SwiGLU: the op silu(a) * b on [a | b], and LLaMA's MLP
                                        w2(silu(w1 x) * w3 x) with and without biases, its weights
                                        stored as attnlab's fused fc1.w = [W_gate | W_up]
  tests/data/golden/flex.json           attention programs (score and mask functions) against
                                        FlexAttention's forward; gradients by autograd of the
                                        same programs written densely (FlexAttention has no CPU
                                        backward)
  tests/data/interop/torch_written.safetensors  file written by the Python safetensors package

The case makers live beside this driver: golden_attention.py (the attention cases),
golden_layers.py (layers, optimizers, losses, the interop file) and golden_common.py (their
helpers and the JSON layout).

How to run (from the repository root):
  python3 tests/golden/make_goldens.py            # every file
  python3 tests/golden/make_goldens.py mha.json   # only the named files
Requires torch, numpy and safetensors (pip install torch numpy safetensors).
The committed files were made with torch 2.15.0+cu132 (CPU only), numpy 2.4.6,
safetensors 0.8.0, Python 3.11.7; gqa.json, window.json, alibi.json, bias.json and dropout.json with Debian's python3-torch 1.13 (it needs neither
F.scaled_dot_product_attention nor enable_gqa, which it uses as a cross-check when present).
layers.json's softcap and relu_squared cases were added later with the same torch on an AMD EPYC
(Zen 4); there the linear case comes out up to 7e-16 different (MKL's GEMM on another CPU), and its
committed values were kept (the relu_squared case was spliced into the committed file). rope.json was made with the same torch on the same machine.
softcap.json and swiglu.json were made with Debian's python3-torch 1.13 on an AMD EPYC (Zen 4).
z_loss.json was made with Debian's python3-torch 1.13 (/usr/bin/python3 z_loss.json).
flex.json was made with pip's torch 2.15.0+cu132 (CPU) on an AMD EPYC (Zen 4).

Conventions:
  * Every computation is in float64. Inputs are drawn from a torch.Generator
    seeded per case (the seed is in each case's config as "seed"); standard
    normal unless noted.
  * Gradients are of loss = sum(output * r) for a stored random upstream "r"
    (so the gradient w.r.t. output is r).
  * JSON layout:
      {"generator": "tests/golden/make_goldens.py", "torch_version": "...",
       "cases": [{"name": ..., "config": {...}, "tensors": {
           KEY: {"shape": [...], "data": [flat row-major values]}}}]}
    Bool tensors are stored as 0/1 integers, integer tensors as integers,
    floats as full-precision doubles (Python repr). A scalar has shape [].
  * The output is deterministic: running the script again rewrites identical
    files (for the same torch version).
"""

import os

from golden_attention import (
    alibi_cases,
    bias_cases,
    dropout_cases,
    flex_cases,
    gqa_cases,
    mha_cases,
    rope_cases,
    sdpa_cases,
    softcap_cases,
    window_cases,
)
from golden_common import GOLDEN_DIR, write_json
from golden_layers import (
    cross_entropy_cases,
    layer_cases,
    muon_cases,
    optim_cases,
    softmax_cases,
    swiglu_cases,
    write_interop,
    z_loss_cases,
)


def main():
    import sys
    os.makedirs(GOLDEN_DIR, exist_ok=True)
    makers = {
        "sdpa.json": sdpa_cases,
        "gqa.json": gqa_cases,
        "window.json": window_cases,
        "alibi.json": alibi_cases,
        "bias.json": bias_cases,
        "dropout.json": dropout_cases,
        "softmax.json": softmax_cases,
        "optim.json": optim_cases,
        "muon.json": muon_cases,
        "layers.json": layer_cases,
        "cross_entropy.json": cross_entropy_cases,
        "z_loss.json": z_loss_cases,
        "mha.json": mha_cases,
        "rope.json": rope_cases,
        "softcap.json": softcap_cases,
        "swiglu.json": swiglu_cases,
        "flex.json": flex_cases,
    }
    wanted = sys.argv[1:] or list(makers) + ["interop"]
    for name in wanted:
        if name == "interop":
            write_interop()
        elif name in makers:
            write_json(name, makers[name]())
        else:
            raise SystemExit(f"unknown output {name!r}; choose from {sorted(makers)} or interop")


if __name__ == "__main__":
    main()
