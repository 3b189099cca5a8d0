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

import json
import math
import os

import numpy as np
import torch
import torch.nn.functional as F

DT = torch.float64
ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
GOLDEN_DIR = os.path.join(ROOT, "tests", "data", "golden")
INTEROP_DIR = os.path.join(ROOT, "tests", "data", "interop")
GENERATOR = "tests/golden/make_goldens.py"

torch.use_deterministic_algorithms(True)


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(g, *shape):
    return torch.randn(*shape, generator=g, dtype=DT)


def tensor_entry(t):
    t = t.detach()
    if t.dtype == torch.bool:
        data = [int(v) for v in t.reshape(-1).tolist()]
    elif t.dtype.is_floating_point:
        assert torch.isfinite(t).all(), "non-finite value in golden tensor"
        data = [float(v) for v in t.to(DT).reshape(-1).tolist()]
    else:
        data = [int(v) for v in t.reshape(-1).tolist()]
    return {"shape": list(t.shape), "data": data}


def case(name, config, tensors):
    return {"name": name, "config": config,
            "tensors": {k: tensor_entry(v) for k, v in tensors.items()}}


def write_json(filename, cases):
    """One tensor per line keeps the files diffable without bloating them."""
    dump = lambda o: json.dumps(o, allow_nan=False, separators=(", ", ": "))
    lines = ["{", f' "generator": {dump(GENERATOR)},',
             f' "torch_version": {dump(torch.__version__)},', ' "cases": [']
    for ci, c in enumerate(cases):
        lines.append(f'  {{"name": {dump(c["name"])}, "config": {dump(c["config"])}, "tensors": {{')
        items = list(c["tensors"].items())
        for ti, (k, v) in enumerate(items):
            sep = "," if ti + 1 < len(items) else ""
            lines.append(f"   {dump(k)}: {dump(v)}{sep}")
        lines.append("  }}" + ("," if ci + 1 < len(cases) else ""))
    lines += [" ]", "}"]
    text = "\n".join(lines) + "\n"
    json.loads(text)  # sanity: valid JSON
    path = os.path.join(GOLDEN_DIR, filename)
    with open(path, "w") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(path, ROOT)} ({len(text)} bytes, {len(cases)} cases)")


def close(a, b, tol=1e-12):
    assert torch.allclose(a, b, rtol=tol, atol=tol), (a - b).abs().max().item()


# --------------------------------------------------------------------------
# 1. scaled dot-product attention
# --------------------------------------------------------------------------

def effective_scale(scaling, scale, d):
    if scale is not None:
        return float(scale)
    return {"none": 1.0, "sqrt_dk": 1.0 / math.sqrt(d), "dk": 1.0 / d}[scaling]


def visibility(b, h, tq, tk, causal, mask):
    """Bool (B, H, Tq, Tk): true where query i may attend key j."""
    vis = torch.ones(b, h, tq, tk, dtype=torch.bool)
    if causal:  # top-left aligned, like is_causal: key j visible iff j <= i
        vis &= torch.ones(tq, tk, dtype=torch.bool).tril()
    if mask is not None:  # (B, Tk), true = may attend
        vis &= mask[:, None, None, :]
    return vis


def masked_attention(q, k, v, scale, vis, bias=None):
    """softmax(scale * q k^T [+ bias] over visible keys) v; rows with no visible
    key give P = 0 and out = 0, with zero (not NaN) gradients."""
    s = scale * (q @ k.transpose(-2, -1))
    if bias is not None:
        s = s + bias
    p = masked_softmax(s, vis)
    return p @ v, p


def masked_softmax(s, vis):
    """softmax of the scores s over the visible keys; 0 for hidden keys and in
    rows with none visible, with zero (not NaN) gradients."""
    row_max = s.detach().masked_fill(~vis, -math.inf).amax(-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    # masked entries are shifted to exactly 0 (exp = 1) and then dropped by
    # where(), so neither the forward nor the backward can see inf/NaN.
    shifted = torch.where(vis, s - row_max, torch.zeros_like(s))
    e = torch.where(vis, torch.exp(shifted), torch.zeros_like(s))
    denom = e.sum(-1, keepdim=True)
    return e / torch.where(denom > 0, denom, torch.ones_like(denom))


SDPA_CASES = [
    # name, B, H, Tq, Tk, D, Dv, scaling, scale, causal, mask-kind
    ("sqrt_dk_plain",        2, 2, 4, 4, 4, 4, "sqrt_dk", None, False, None),
    ("scaling_none",         2, 2, 4, 4, 4, 4, "none",    None, False, None),
    ("scaling_dk",           2, 2, 4, 4, 4, 4, "dk",      None, False, None),
    ("explicit_scale_0.37",  2, 2, 4, 4, 4, 4, "sqrt_dk", 0.37, False, None),
    ("causal_square",        2, 2, 5, 5, 4, 4, "sqrt_dk", None, True,  None),
    ("causal_tq3_tk5",       2, 2, 3, 5, 4, 4, "sqrt_dk", None, True,  None),
    ("key_mask_empty_batch", 2, 2, 3, 5, 4, 4, "sqrt_dk", None, False, "empty_batch"),
    ("causal_key_mask",      2, 2, 4, 4, 4, 4, "sqrt_dk", None, True,  "first_key"),
    ("dv_ne_d",              2, 2, 4, 5, 4, 3, "sqrt_dk", None, False, None),
    ("d1",                   2, 2, 4, 4, 1, 1, "sqrt_dk", None, False, None),
    ("tq_ne_tk_noncausal",   2, 2, 3, 6, 4, 4, "sqrt_dk", None, False, None),
]

SDPA_MASKS = {
    # batch 0: partial mask; batch 1: every key masked -> all its rows empty
    "empty_batch": [[1, 1, 0, 1, 0], [0, 0, 0, 0, 0]],
    # batch 0: key 0 masked, so causal query 0 sees nothing; batch 1: key 2 masked
    "first_key": [[0, 1, 1, 1], [1, 1, 0, 1]],
}


def sdpa_cases():
    out_cases = []
    for idx, (name, b, h, tq, tk, d, dv, scaling, scale, causal, mkind) in enumerate(SDPA_CASES):
        seed = 1000 + idx
        g = gen(seed)
        q, k, v = randn(g, b, h, tq, d), randn(g, b, h, tk, d), randn(g, b, h, tk, dv)
        r = randn(g, b, h, tq, dv)
        mask = torch.tensor(SDPA_MASKS[mkind], dtype=torch.bool) if mkind else None
        sc = effective_scale(scaling, scale, d)
        vis = visibility(b, h, tq, tk, causal, mask)

        q.requires_grad_(); k.requires_grad_(); v.requires_grad_()
        out, p = masked_attention(q, k, v, sc, vis)
        dq, dk, dv_ = torch.autograd.grad((out * r).sum(), (q, k, v))
        for t in (out, p, dq, dk, dv_):
            assert torch.isfinite(t).all()

        empty = ~vis.any(-1)  # (B, H, Tq)
        if empty.any():
            assert (p[empty] == 0).all() and (out[empty] == 0).all() and (dq[empty] == 0).all()
            # keys that no query sees get zero gradient
            unseen = ~vis.any(-2)  # (B, H, Tk)
            assert (dk[unseen] == 0).all() and (dv_[unseen] == 0).all()

        # independent cross-check against PyTorch's own SDPA. Empty rows are
        # given every key there (so it stays finite) and a zero upstream, so
        # they drop out of the comparison of dk, dv.
        ref_mask = vis | empty[..., None]
        r_ref = r.masked_fill(empty[..., None], 0.0)
        qc, kc, vc = (t.detach().clone().requires_grad_() for t in (q, k, v))
        ref = F.scaled_dot_product_attention(
            qc, kc, vc, attn_mask=None if ref_mask.all() else ref_mask, scale=sc)
        rdq, rdk, rdv = torch.autograd.grad((ref * r_ref).sum(), (qc, kc, vc))
        keep = ~empty
        close(out[keep], ref[keep]); close(dq[keep], rdq[keep]); close(dk, rdk); close(dv_, rdv)
        if causal and mask is None:  # also via is_causal (top-left alignment)
            ref2 = F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(),
                                                  is_causal=True, scale=sc)
            close(out, ref2)

        config = {"scaling": scaling, "scale": scale, "causal": causal,
                  "has_mask": mask is not None, "effective_scale": sc, "seed": seed}
        tensors = {"q": q, "k": k, "v": v, "r": r}
        if mask is not None:
            tensors["mask"] = mask
        tensors.update({"out": out, "p": p, "dq": dq, "dk": dk, "dv": dv_})
        out_cases.append(case(name, config, tensors))
    return out_cases


GQA_CASES = [
    # name, B, H, Hkv, Tq, Tk, D, Dv, causal, mask-kind
    ("gqa_h4_kv2",            2, 4, 2, 4, 5, 3, 2, False, None),
    ("gqa_h6_kv3_causal",     2, 6, 3, 5, 5, 4, 3, True,  None),
    ("mqa_h4_kv1_mask",       2, 4, 1, 3, 5, 4, 4, False, "empty_batch"),
    ("gqa_h4_kv2_causal_mask", 2, 4, 2, 4, 4, 2, 3, True,  "first_key"),
]


def gqa_cases():
    """Grouped-query attention: query head h reads K/V head h // (H / Hkv). The
    reference expands K and V with repeat_interleave (what enable_gqa=True
    means) and lets autograd sum dK and dV over each group; with torch >= 2.5
    it is also checked against F.scaled_dot_product_attention(enable_gqa=True)."""
    out_cases = []
    for idx, (name, b, h, hkv, tq, tk, d, dv, causal, mkind) in enumerate(GQA_CASES):
        seed = 1500 + idx
        g = gen(seed)
        q, k, v = randn(g, b, h, tq, d), randn(g, b, hkv, tk, d), randn(g, b, hkv, tk, dv)
        r = randn(g, b, h, tq, dv)
        mask = torch.tensor(SDPA_MASKS[mkind], dtype=torch.bool) if mkind else None
        sc = 1.0 / math.sqrt(d)
        vis = visibility(b, h, tq, tk, causal, mask)
        q.requires_grad_(); k.requires_grad_(); v.requires_grad_()
        group = h // hkv
        out, p = masked_attention(q, k.repeat_interleave(group, dim=1),
                                  v.repeat_interleave(group, dim=1), sc, vis)
        dq, dk, dv_ = torch.autograd.grad((out * r).sum(), (q, k, v))
        assert dk.shape == (b, hkv, tk, d) and dv_.shape == (b, hkv, tk, dv)
        sdpa = getattr(F, "scaled_dot_product_attention", None)
        version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
        if sdpa is not None and version >= (2, 5) and not (~vis).any():
            ref = sdpa(q.detach(), k.detach(), v.detach(), scale=sc, enable_gqa=True)
            close(out, ref)
        config = {"heads": h, "kv_heads": hkv, "causal": causal, "has_mask": mask is not None,
                  "seed": seed}
        tensors = {"q": q, "k": k, "v": v, "r": r}
        if mask is not None:
            tensors["mask"] = mask
        tensors.update({"out": out, "p": p, "dq": dq, "dk": dk, "dv": dv_})
        out_cases.append(case(name, config, tensors))
    return out_cases


WINDOW_CASES = [
    # name, B, H, Tq, Tk, D, Dv, window, query offset, mask-kind
    ("window_1",             2, 2, 5, 5, 3, 2, 1, 0, None),
    ("window_3_mask",        2, 2, 4, 4, 4, 3, 3, 0, "first_key"),
    ("window_2_offset_3",    2, 2, 3, 6, 3, 3, 2, 3, None),
]


def window_cases():
    """Sliding-window causal attention: query i sees keys j with
    i + o - w < j <= i + o, as a boolean band mask over masked_attention."""
    out_cases = []
    for idx, (name, b, h, tq, tk, d, dv, w, o, mkind) in enumerate(WINDOW_CASES):
        seed = 1600 + idx
        g = gen(seed)
        q, k, v = randn(g, b, h, tq, d), randn(g, b, h, tk, d), randn(g, b, h, tk, dv)
        r = randn(g, b, h, tq, dv)
        mask = torch.tensor(SDPA_MASKS[mkind], dtype=torch.bool) if mkind else None
        i = torch.arange(tq)[:, None] + o
        j = torch.arange(tk)[None, :]
        band = (j <= i) & (j > i - w)
        vis = band[None, None].expand(b, h, tq, tk).clone()
        if mask is not None:
            vis &= mask[:, None, None, :]
        q.requires_grad_(); k.requires_grad_(); v.requires_grad_()
        out, p = masked_attention(q, k, v, 1.0 / math.sqrt(d), vis)
        dq, dk, dv_ = torch.autograd.grad((out * r).sum(), (q, k, v))
        config = {"window": w, "offset": o, "has_mask": mask is not None, "seed": seed}
        tensors = {"q": q, "k": k, "v": v, "r": r}
        if mask is not None:
            tensors["mask"] = mask
        tensors.update({"out": out, "p": p, "dq": dq, "dk": dk, "dv": dv_})
        out_cases.append(case(name, config, tensors))
    return out_cases


ALIBI_CASES = [
    # name, B, H, Tq, Tk, D, Dv, causal, query offset, mask-kind
    ("alibi_bidirectional",  2, 4, 4, 5, 3, 2, False, 0, None),
    ("alibi_causal_mask",    2, 4, 4, 4, 4, 3, True,  0, "first_key"),
    ("alibi_offset_2",       2, 2, 3, 5, 3, 3, True,  2, None),
]


def alibi_cases():
    """ALiBi: the paper's slopes m_h = 2^(-8(h+1)/H), a float bias
    -m_h (i + o - j) added to the scaled scores of visible keys."""
    out_cases = []
    for idx, (name, b, h, tq, tk, d, dv, causal, o, mkind) in enumerate(ALIBI_CASES):
        seed = 1700 + idx
        g = gen(seed)
        q, k, v = randn(g, b, h, tq, d), randn(g, b, h, tk, d), randn(g, b, h, tk, dv)
        r = randn(g, b, h, tq, dv)
        mask = torch.tensor(SDPA_MASKS[mkind], dtype=torch.bool) if mkind else None
        slopes = [2.0 ** (-8.0 * (hh + 1) / h) for hh in range(h)]
        i = torch.arange(tq, dtype=DT)[:, None] + o
        j = torch.arange(tk, dtype=DT)[None, :]
        bias = -torch.tensor(slopes, dtype=DT)[:, None, None] * (i - j)  # (H, Tq, Tk)
        vis = torch.ones(b, h, tq, tk, dtype=torch.bool)
        if causal:
            vis &= (j <= i)[None, None]
        if mask is not None:
            vis &= mask[:, None, None, :]
        q.requires_grad_(); k.requires_grad_(); v.requires_grad_()
        sc = 1.0 / math.sqrt(d)
        s = sc * (q @ k.transpose(-2, -1)) + bias
        p = masked_softmax(s, vis)
        out = p @ v
        dq, dk, dv_ = torch.autograd.grad((out * r).sum(), (q, k, v))
        config = {"causal": causal, "offset": o, "slopes": slopes, "has_mask": mask is not None,
                  "seed": seed}
        tensors = {"q": q, "k": k, "v": v, "r": r}
        if mask is not None:
            tensors["mask"] = mask
        tensors.update({"out": out, "p": p, "dq": dq, "dk": dk, "dv": dv_})
        out_cases.append(case(name, config, tensors))
    return out_cases


BIAS_CASES = [
    # name, B, H, Hkv, Tq, Tk, D, Dv, causal, query offset, mask-kind, bias batch, bias heads
    ("bias_per_head",          2, 2, 2, 4, 5, 3, 2, False, 0, None,        1, 2),
    ("bias_full_causal_mask",  2, 2, 2, 4, 4, 3, 3, True,  0, "first_key", 2, 2),
    ("bias_per_batch_gqa_off", 2, 4, 2, 3, 5, 3, 2, True,  2, None,        2, 1),
    ("bias_shared_mqa",        1, 2, 1, 3, 4, 2, 2, False, 0, None,        1, 1),
]


def bias_cases():
    """An additive float bias on the scaled scores, shaped (1|B, 1|H, Tq, Tk)
    and broadcast (PyTorch's float attn_mask), with its gradient from autograd
    (summed over the broadcast axes); grouped-query attention by
    repeat_interleave; causal with a query offset o: key j visible iff
    j <= i + o."""
    out_cases = []
    for idx, (name, b, h, hkv, tq, tk, d, dv, causal, o, mkind, bb, bh) in enumerate(BIAS_CASES):
        seed = 1800 + idx
        g = gen(seed)
        q, k, v = randn(g, b, h, tq, d), randn(g, b, hkv, tk, d), randn(g, b, hkv, tk, dv)
        r = randn(g, b, h, tq, dv)
        bias = randn(g, bb, bh, tq, tk)
        mask = torch.tensor(SDPA_MASKS[mkind], dtype=torch.bool) if mkind else None
        vis = torch.ones(b, h, tq, tk, dtype=torch.bool)
        if causal:
            i = torch.arange(tq)[:, None] + o
            j = torch.arange(tk)[None, :]
            vis &= (j <= i)[None, None]
        if mask is not None:
            vis &= mask[:, None, None, :]
        q.requires_grad_(); k.requires_grad_(); v.requires_grad_(); bias.requires_grad_()
        group = h // hkv
        out, p = masked_attention(q, k.repeat_interleave(group, dim=1),
                                  v.repeat_interleave(group, dim=1), 1.0 / math.sqrt(d), vis,
                                  bias)
        dq, dk, dv_, dbias = torch.autograd.grad((out * r).sum(), (q, k, v, bias))
        assert dbias.shape == (bb, bh, tq, tk)
        config = {"heads": h, "kv_heads": hkv, "causal": causal, "offset": o,
                  "has_mask": mask is not None, "seed": seed}
        tensors = {"q": q, "k": k, "v": v, "r": r, "bias": bias}
        if mask is not None:
            tensors["mask"] = mask
        tensors.update({"out": out, "p": p, "dq": dq, "dk": dk, "dv": dv_, "dbias": dbias})
        out_cases.append(case(name, config, tensors))
    return out_cases


SOFTCAP_CASES = [
    # name, B, H, Hkv, Tq, Tk, D, Dv, causal, query offset, mask-kind, cap, alibi, bias, scale
    ("softcap_bidirectional",     2, 2, 2, 4, 5, 3, 2, False, 0, None,        0.8, False, False, 3.0),
    ("softcap_causal_mask_alibi", 2, 4, 4, 4, 4, 4, 3, True,  0, "first_key", 1.5, True,  False, 2.0),
    ("softcap_gqa_offset_bias",   2, 4, 2, 3, 5, 3, 2, True,  2, None,        0.6, False, True,  1.5),
    ("softcap_all",               2, 2, 1, 4, 4, 3, 3, True,  0, "first_key", 2.0, True,  True,  2.5),
]


def softcap_cases():
    """Score softcap (Gemma 2, FlashAttention's softcap): S = c tanh(s q.k / c),
    then ALiBi's -m_h (i + o - j) and an additive bias (1, H, Tq, Tk), then the
    mask; gradients by autograd, dbias included. A large explicit scale s pushes
    the dots into the tanh's curve."""
    out_cases = []
    for idx, (name, b, h, hkv, tq, tk, d, dv, causal, o, mkind, cap, alibi, has_bias,
              sc) in enumerate(SOFTCAP_CASES):
        seed = 2100 + idx
        g = gen(seed)
        q, k, v = randn(g, b, h, tq, d), randn(g, b, hkv, tk, d), randn(g, b, hkv, tk, dv)
        r = randn(g, b, h, tq, dv)
        bias = randn(g, 1, h, tq, tk) if has_bias else None
        mask = torch.tensor(SDPA_MASKS[mkind], dtype=torch.bool) if mkind else None
        i = torch.arange(tq, dtype=DT)[:, None] + o
        j = torch.arange(tk, dtype=DT)[None, :]
        vis = torch.ones(b, h, tq, tk, dtype=torch.bool)
        if causal:
            vis &= (j <= i)[None, None]
        if mask is not None:
            vis &= mask[:, None, None, :]
        slopes = [2.0 ** (-8.0 * (hh + 1) / h) for hh in range(h)]
        q.requires_grad_(); k.requires_grad_(); v.requires_grad_()
        if bias is not None:
            bias.requires_grad_()
        group = h // hkv
        kk, vv = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        s = cap * torch.tanh(sc * (q @ kk.transpose(-2, -1)) / cap)
        if alibi:
            s = s - torch.tensor(slopes, dtype=DT)[:, None, None] * (i - j)
        if bias is not None:
            s = s + bias
        p = masked_softmax(s, vis)
        out = p @ vv
        inputs = (q, k, v) + ((bias,) if bias is not None else ())
        grads = torch.autograd.grad((out * r).sum(), inputs)
        config = {"heads": h, "kv_heads": hkv, "causal": causal, "offset": o, "softcap": cap,
                  "scale": sc, "slopes": slopes if alibi else [], "has_mask": mask is not None,
                  "seed": seed}
        tensors = {"q": q, "k": k, "v": v, "r": r}
        if bias is not None:
            tensors["bias"] = bias
        if mask is not None:
            tensors["mask"] = mask
        tensors.update({"out": out, "p": p, "dq": grads[0], "dk": grads[1], "dv": grads[2]})
        if bias is not None:
            tensors["dbias"] = grads[3]
        out_cases.append(case(name, config, tensors))
    return out_cases


FLEX_CASES = [
    # name, B, H, T, D, score program, mask program
    ("relative bias + learned cap, causal documents", 2, 2, 12, 4, "capped_relative", "document"),
    ("learned ALiBi slopes, prefix-LM", 2, 2, 10, 3, "alibi", "prefix_lm"),
    ("relative bias, no mask", 1, 3, 9, 4, "relative", None),
    ("causal documents, no score program", 2, 2, 16, 4, None, "document"),
]
FLEX_DOCUMENTS = {12: [0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2],
                  16: [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2]}
FLEX_PREFIX = 4
FLEX_RADIUS = 2


def flex_cases():
    """Attention programs against PyTorch's FlexAttention (score_mod, mask_mod, a block
    mask from create_block_mask). FlexAttention has no CPU backward, so the forward is
    FlexAttention's and the gradients (q, k, v and the captured parameters) come from
    autograd of the same program written densely, which must equal FlexAttention's
    forward to 1e-12 here. Programs: a relative-position bias table (H, 2R + 1) with a
    learned per-head cap c_h tanh(s / c_h); learned ALiBi slopes s + m_h (j - i); masks:
    causal documents (ids per position), prefix-LM (prefix 4)."""
    from torch.nn.attention.flex_attention import flex_attention, create_block_mask
    out_cases = []
    for idx, (name, b, h, t, d, score, mask) in enumerate(FLEX_CASES):
        seed = 2600 + idx
        g = gen(seed)
        q, k, v, r = (randn(g, b, h, t, d) for _ in range(4))
        params = []
        if score == "capped_relative":
            params = [0.5 * randn(g, h * (2 * FLEX_RADIUS + 1)), 2.0 + 0.3 * randn(g, h)]
        elif score == "relative":
            params = [0.5 * randn(g, h * (2 * FLEX_RADIUS + 1))]
        elif score == "alibi":
            params = [torch.tensor([0.5 / (hh + 1) for hh in range(h)], dtype=DT)]
        ids = torch.tensor(FLEX_DOCUMENTS.get(t, [0] * t))

        def score_of(s, bb, hh, i, j, prm):
            if score in ("capped_relative", "relative"):
                rel = torch.clamp(j - i, -FLEX_RADIUS, FLEX_RADIUS) + FLEX_RADIUS
                bias = prm[0][hh * (2 * FLEX_RADIUS + 1) + rel]
                if score == "relative":
                    return s + bias
                cap = prm[1][hh]
                return cap * torch.tanh(s / cap) + bias
            if score == "alibi":
                return s + prm[0][hh] * (j - i).to(DT)
            return s

        def visible(bb, hh, i, j):
            if mask == "document":
                return (ids[i] == ids[j]) & (j <= i)
            if mask == "prefix_lm":
                return (j < FLEX_PREFIX) | (j <= i)
            return i >= 0

        block = None
        if mask is not None:
            block = create_block_mask(visible, None, None, t, t, device="cpu", BLOCK_SIZE=4)
        flex_out = flex_attention(q, k, v, score_mod=lambda s, bb, hh, i, j:
                                  score_of(s, bb, hh, i, j, params), block_mask=block)
        # The same program densely, for autograd.
        leaves = [q.clone().requires_grad_(), k.clone().requires_grad_(),
                  v.clone().requires_grad_()] + [p.clone().requires_grad_() for p in params]
        qq, kk, vv = leaves[:3]
        prm = leaves[3:]
        s = (qq @ kk.transpose(-2, -1)) / math.sqrt(d)
        bi = torch.arange(b)[:, None, None, None]
        hi = torch.arange(h)[None, :, None, None]
        ii = torch.arange(t)[None, None, :, None]
        jj = torch.arange(t)[None, None, None, :]
        s = score_of(s, bi, hi, ii, jj, prm)
        vis = visible(bi, hi, ii, jj).expand(b, h, t, t)
        out = masked_softmax(s, vis) @ vv
        close(out, flex_out)
        grads = torch.autograd.grad((out * r).sum(), leaves)
        config = {"score": score or "", "mask": mask or "", "radius": FLEX_RADIUS,
                  "prefix": FLEX_PREFIX, "documents": ids.tolist(), "seed": seed,
                  "params": len(params)}
        tensors = {"q": q, "k": k, "v": v, "r": r, "out": flex_out,
                   "dq": grads[0], "dk": grads[1], "dv": grads[2]}
        for pi, p in enumerate(params):
            tensors[f"param{pi}"] = p
            tensors[f"dparam{pi}"] = grads[3 + pi]
        out_cases.append(case(name, config, tensors))
    return out_cases


def swiglu_cases():
    """SwiGLU (Shazeer 2020; LLaMA's MLP): the op y = silu(a) * b on h = [a | b]
    (h.chunk(2, -1)), inputs of scale 3 so that the gate reaches both tails; and
    the MLP fc2(silu(x W_gate) * (x W_up)) with LLaMA's separate w1 / w3 weights,
    which attnlab stores side by side as fc1.w = [W_gate | W_up] (in, 2F), with
    and without biases. torch differentiates silu itself."""
    out_cases = []
    g = gen(4100)
    h = (3.0 * randn(g, 2, 3, 8)).requires_grad_()
    r = randn(g, 2, 3, 4)
    a, b = h.chunk(2, dim=-1)
    y = F.silu(a) * b
    close(y, a * torch.sigmoid(a) * b)
    (dh,) = grads_of(y, r, (h,))
    out_cases.append(case("swiglu_op", {"F": 4, "input_scale": 3.0, "seed": 4100},
                          {"h": h, "r": r, "y": y, "dh": dh}))
    for seed, bias in [(4101, True), (4102, False)]:
        g = gen(seed)
        C, F_ = 5, 6
        x = randn(g, 2, 3, C).requires_grad_()
        w1 = randn(g, F_, C).div(math.sqrt(C)).requires_grad_()   # torch layout (out, in)
        w3 = randn(g, F_, C).div(math.sqrt(C)).requires_grad_()
        w2 = randn(g, C, F_).div(math.sqrt(F_)).requires_grad_()
        b13 = randn(g, 2 * F_).requires_grad_() if bias else None
        b2 = randn(g, C).requires_grad_() if bias else None
        r = randn(g, 2, 3, C)
        gate = F.linear(x, w1, b13[:F_] if bias else None)
        up = F.linear(x, w3, b13[F_:] if bias else None)
        y = F.linear(F.silu(gate) * up, w2, b2)
        inputs = (x, w1, w3, w2) + ((b13, b2) if bias else ())
        grads = grads_of(y, r, inputs)
        tensors = {"x": x, "fc1_w": torch.cat([w1.t(), w3.t()], dim=1), "fc2_w": w2.t(),
                   "r": r, "y": y, "dx": grads[0],
                   "dfc1_w": torch.cat([grads[1].t(), grads[2].t()], dim=1),
                   "dfc2_w": grads[3].t()}
        if bias:
            tensors.update({"fc1_b": b13, "fc2_b": b2, "dfc1_b": grads[4], "dfc2_b": grads[5]})
        out_cases.append(case("swiglu_mlp_bias" if bias else "swiglu_mlp_no_bias",
                              {"C": C, "F": F_, "bias": bias, "seed": seed}, tensors))
    return out_cases


def philox4x32_10(ctr, key):
    """Philox4x32-10 (Salmon et al. 2011) in plain Python integers: the
    generator of attnlab/attention/dropout.hpp, written again from the paper."""
    m0, m1, w0, w1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
    x0, x1, x2, x3 = ctr
    k0, k1 = key
    for rnd in range(10):
        if rnd > 0:
            k0, k1 = (k0 + w0) & 0xFFFFFFFF, (k1 + w1) & 0xFFFFFFFF
        p0, p1 = m0 * x0, m1 * x2
        x0, x1, x2, x3 = (p1 >> 32) ^ x1 ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ x3 ^ k1, p0 & 0xFFFFFFFF
    return (x0, x1, x2, x3)


# Random123's known answers (kat_vectors), checked before any mask is drawn.
assert philox4x32_10((0, 0, 0, 0), (0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
assert philox4x32_10((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0)) \
    == (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)

ATTENTION_STREAM = 0xA77


def attention_keep_mask(seed, p, b, h, tq, tk):
    """Bool (B, H, Tq, Tk): weight (bh, i, j) is kept iff word j % 4 of
    philox((j // 4, i, bh, 0xA77), seed) >= floor(p * 2^32)."""
    threshold = int(p * 4294967296.0)
    key = (seed & 0xFFFFFFFF, seed >> 32)
    keep = torch.zeros(b, h, tq, tk, dtype=torch.bool)
    for bh in range(b * h):
        for i in range(tq):
            for j in range(tk):
                word = philox4x32_10((j // 4, i, bh, ATTENTION_STREAM), key)[j % 4]
                keep[bh // h, bh % h, i, j] = word >= threshold
    return keep


DROPOUT_CASES = [
    # name, B, H, Hkv, Tq, Tk, D, Dv, causal, mask-kind, p, seed, with a bias (1, H, Tq, Tk)
    ("dropout_0.3",            2, 2, 2, 4, 5, 3, 2, False, None,        0.3, 12345, False),
    ("dropout_0.5_causal_mask", 2, 2, 2, 4, 4, 3, 3, True, "first_key", 0.5, 0x9E3779B97F4A7C15, False),
    ("dropout_0.2_gqa_bias",   2, 4, 2, 3, 5, 3, 2, True,  None,        0.2, 7, True),
]


def dropout_cases():
    """Dropout on the attention weights, replaying attnlab's mask: the mask is
    drawn here from the same counter-based rule (an independent Philox), the
    weights are multiplied by keep / (1 - p) after the softmax, and autograd
    gives the gradients with the mask held fixed."""
    out_cases = []
    for idx, (name, b, h, hkv, tq, tk, d, dv, causal, mkind, p, seed, with_bias) in \
            enumerate(DROPOUT_CASES):
        g = gen(1900 + idx)
        q, k, v = randn(g, b, h, tq, d), randn(g, b, hkv, tk, d), randn(g, b, hkv, tk, dv)
        r = randn(g, b, h, tq, dv)
        bias = randn(g, 1, h, tq, tk) if with_bias else None
        mask = torch.tensor(SDPA_MASKS[mkind], dtype=torch.bool) if mkind else None
        vis = visibility(b, h, tq, tk, causal, mask)
        keep = attention_keep_mask(seed, p, b, h, tq, tk)
        q.requires_grad_(); k.requires_grad_(); v.requires_grad_()
        if bias is not None:
            bias.requires_grad_()
        group = h // hkv
        kk, vv = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        _, weights = masked_attention(q, kk, vv, 1.0 / math.sqrt(d), vis, bias)
        out = (weights * keep.to(DT) / (1.0 - p)) @ vv
        inputs = (q, k, v) + ((bias,) if bias is not None else ())
        grads = torch.autograd.grad((out * r).sum(), inputs)
        config = {"heads": h, "kv_heads": hkv, "causal": causal, "has_mask": mask is not None,
                  "p": p, "seed": seed, "has_bias": bias is not None, "input_seed": 1900 + idx}
        tensors = {"q": q, "k": k, "v": v, "r": r, "keep": keep}
        if mask is not None:
            tensors["mask"] = mask
        if bias is not None:
            tensors["bias"] = bias
            tensors["dbias"] = grads[3]
        tensors.update({"out": out, "dq": grads[0], "dk": grads[1], "dv": grads[2]})
        out_cases.append(case(name, config, tensors))
    return out_cases


# --------------------------------------------------------------------------
# 2. softmax over the last dim
# --------------------------------------------------------------------------

def softmax_cases():
    out_cases = []
    specs = [  # name, magnitude, per-row offsets: logits = randn * magnitude + offset
        ("normal", 1.0, [0.0, 0.0, 0.0, 0.0]),
        ("large_1e4", 1e4, [0.0, 0.0, 0.0, 0.0]),  # ~one-hot rows
        ("offset_1e4", 1.0, [1e4, -1e4, 3e4, 0.0]),  # non-trivial p; needs max-shift
    ]
    for idx, (name, mag, offsets) in enumerate(specs):
        seed = 2000 + idx
        g = gen(seed)
        off = torch.tensor(offsets, dtype=DT)[:, None]
        logits = (randn(g, 4, 7) * mag + off).requires_grad_()
        dp = randn(g, 4, 7)
        p = torch.softmax(logits, -1)
        (ds,) = torch.autograd.grad(p, logits, dp)
        # cross-check backward: ds = p * (dp - sum(p * dp))
        close(ds, p * (dp - (p * dp).sum(-1, keepdim=True)))
        out_cases.append(case(name, {"dim": -1, "magnitude": mag, "seed": seed},
                              {"logits": logits, "p": p, "dp": dp, "ds": ds}))
    return out_cases


# --------------------------------------------------------------------------
# 3. optimizers
# --------------------------------------------------------------------------

OPT_STEPS = 5
OPT_SHAPES = [(3, 4), (5,)]


def run_optimizer(make_opt, inits, grads):
    params = [torch.nn.Parameter(p.clone()) for p in inits]
    opt = make_opt(params)
    traj = [[] for _ in params]
    for t in range(OPT_STEPS):
        for p, gr in zip(params, grads):
            p.grad = gr[t].clone()
        opt.step()
        for i, p in enumerate(params):
            traj[i].append(p.detach().clone())
    return [torch.stack(tr) for tr in traj]


def manual_adamw(inits, grads, lr, b1, b2, eps, wd):
    out = []
    for p0, gs in zip(inits, grads):
        p, m, v, tr = p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0), []
        for t in range(1, OPT_STEPS + 1):
            gr = gs[t - 1]
            p = p * (1 - lr * wd)
            m = b1 * m + (1 - b1) * gr
            v = b2 * v + (1 - b2) * gr * gr
            mhat, vhat = m / (1 - b1 ** t), v / (1 - b2 ** t)
            p = p - lr * mhat / (vhat.sqrt() + eps)
            tr.append(p)
        out.append(torch.stack(tr))
    return out


def manual_sgd(inits, grads, lr, mom, wd):
    out = []
    for p0, gs in zip(inits, grads):
        p, buf, tr = p0.clone(), None, []
        for t in range(OPT_STEPS):
            d = gs[t] + wd * p
            buf = d if buf is None else mom * buf + d
            p = p - lr * (buf if mom != 0 else d)
            tr.append(p)
        out.append(torch.stack(tr))
    return out


def optim_cases():
    specs = [
        ("adamw_wd0.1_b0.95", {"optimizer": "adamw", "lr": 1e-2, "beta1": 0.9, "beta2": 0.95,
                               "eps": 1e-8, "weight_decay": 0.1}),
        ("adamw_wd0_b0.999", {"optimizer": "adamw", "lr": 1e-2, "beta1": 0.9, "beta2": 0.999,
                              "eps": 1e-8, "weight_decay": 0.0}),
        ("sgd_momentum0.9_wd0.01", {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9,
                                    "dampening": 0.0, "nesterov": False, "weight_decay": 0.01}),
        ("sgd_plain", {"optimizer": "sgd", "lr": 0.1, "momentum": 0.0,
                       "dampening": 0.0, "nesterov": False, "weight_decay": 0.0}),
    ]
    out_cases = []
    for idx, (name, cfg) in enumerate(specs):
        seed = 3000 + idx
        g = gen(seed)
        inits = [randn(g, *s) for s in OPT_SHAPES]
        grads = [randn(g, OPT_STEPS, *s) for s in OPT_SHAPES]
        if cfg["optimizer"] == "adamw":
            make = lambda ps: torch.optim.AdamW(
                ps, lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"],
                weight_decay=cfg["weight_decay"], amsgrad=False, foreach=False)
            manual = manual_adamw(inits, grads, cfg["lr"], cfg["beta1"], cfg["beta2"],
                                  cfg["eps"], cfg["weight_decay"])
        else:
            make = lambda ps: torch.optim.SGD(
                ps, lr=cfg["lr"], momentum=cfg["momentum"], dampening=cfg["dampening"],
                nesterov=cfg["nesterov"], weight_decay=cfg["weight_decay"], foreach=False)
            manual = manual_sgd(inits, grads, cfg["lr"], cfg["momentum"], cfg["weight_decay"])
        trajs = run_optimizer(make, inits, grads)
        for a, b in zip(trajs, manual):
            close(a, b)
        tensors = {}
        for i in range(len(OPT_SHAPES)):
            tensors[f"p{i}_init"] = inits[i]
            tensors[f"p{i}_grads"] = grads[i]   # (steps, *shape): grad fed at step t
            tensors[f"p{i}_traj"] = trajs[i]    # (steps, *shape): param after step t
        out_cases.append(case(name, dict(cfg, steps=OPT_STEPS, seed=seed), tensors))
    return out_cases


def zeropower_via_newtonschulz5(G, steps, coefficients, eps):
    """KellerJordan/Muon's muon.py, in the tensor's own dtype (float64 here; the
    reference casts to bfloat16 first)."""
    a, b, c = coefficients
    X = G
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + eps)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


class ReferenceMuon(torch.optim.Optimizer):
    """The published algorithm (muon.py's muon_update and Muon.step) on torch's
    (Out, In) weights, with the two update scales attnlab offers and its
    independent weight decay (Wortsman et al. 2023: p *= 1 - (lr_t / lr0) wd)."""

    def __init__(self, params, lr, momentum, nesterov, ns_steps, weight_decay, scale,
                 decay, coefficients=(3.4445, -4.7750, 2.0315), eps=1e-7):
        super().__init__(params, dict(lr=lr, lr0=lr, momentum=momentum, nesterov=nesterov,
                                      ns_steps=ns_steps, weight_decay=weight_decay,
                                      scale=scale, decay=decay))
        self.coefficients, self.eps = coefficients, eps

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                grad = p.grad.clone()
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                momentum = state["momentum_buffer"]
                beta = group["momentum"]
                momentum.lerp_(grad, 1 - beta)
                update = grad.lerp_(momentum, beta) if group["nesterov"] else momentum
                update = zeropower_via_newtonschulz5(update, group["ns_steps"],
                                                     self.coefficients, self.eps)
                fan_out, fan_in = p.size(-2), p.size(-1)
                if group["scale"] == "spectral":
                    update = update * max(1, fan_out / fan_in) ** 0.5
                else:  # Moonshot's "Muon is Scalable": match AdamW's update RMS
                    update = update * (0.2 * max(fan_out, fan_in) ** 0.5)
                if group["decay"] == "decoupled":
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                else:
                    p.mul_(1 - group["lr"] / group["lr0"] * group["weight_decay"])
                p.add_(update, alpha=-group["lr"])


MUON_SHAPES = [(6, 10), (12, 5), (7, 7)]   # attnlab's (In, Out): wide, tall, square
MUON_STEPS = 4


def muon_cases():
    """Muon against ReferenceMuon: each case trains three matrices (stored
    (In, Out) as attnlab stores them; the reference updates their transposes,
    torch's (Out, In)) for MUON_STEPS steps with the lr of step t lrs[t]."""
    specs = [
        ("nesterov_spectral_wd0.1", dict(momentum=0.95, nesterov=True, ns_steps=5,
                                         weight_decay=0.1, scale="spectral",
                                         decay="decoupled"), [0.02] * MUON_STEPS),
        ("plain_momentum_ns3", dict(momentum=0.9, nesterov=False, ns_steps=3, weight_decay=0.0,
                                    scale="spectral", decay="decoupled"), [0.05] * MUON_STEPS),
        ("rms_scale", dict(momentum=0.95, nesterov=True, ns_steps=5, weight_decay=0.01,
                           scale="rms", decay="decoupled"), [3e-3] * MUON_STEPS),
        ("independent_decay_schedule", dict(momentum=0.95, nesterov=True, ns_steps=5,
                                            weight_decay=0.05, scale="spectral",
                                            decay="independent"), [0.02, 0.015, 0.01, 0.004]),
    ]
    out_cases = []
    for idx, (name, cfg, lrs) in enumerate(specs):
        seed = 3100 + idx
        g = gen(seed)
        inits = [randn(g, *s) for s in MUON_SHAPES]
        grads = [randn(g, MUON_STEPS, *s) for s in MUON_SHAPES]
        params = [torch.nn.Parameter(p.T.clone()) for p in inits]
        opt = ReferenceMuon(params, lr=lrs[0], **cfg)
        traj = [[] for _ in params]
        for t in range(MUON_STEPS):
            for group in opt.param_groups:
                group["lr"] = lrs[t]
            for p, gr in zip(params, grads):
                p.grad = gr[t].T.clone()
            opt.step()
            for i, p in enumerate(params):
                traj[i].append(p.detach().T.clone())
        tensors = {}
        for i in range(len(MUON_SHAPES)):
            tensors[f"p{i}_init"] = inits[i]
            tensors[f"p{i}_grads"] = grads[i]
            tensors[f"p{i}_traj"] = torch.stack(traj[i])
        tensors["lrs"] = torch.tensor(lrs, dtype=torch.float64)
        out_cases.append(case(name, dict(cfg, steps=MUON_STEPS, seed=seed), tensors))
    return out_cases


# --------------------------------------------------------------------------
# 4. layers
# --------------------------------------------------------------------------

def grads_of(y, r, inputs):
    return torch.autograd.grad((y * r).sum(), inputs)


def layer_cases():
    out_cases = []

    # linear: y = x @ w + b with w stored as (in, out) = torch weight transposed
    g = gen(4000)
    x = randn(g, 2, 3, 5).requires_grad_()
    w = randn(g, 5, 4).requires_grad_()  # (in, out)
    b = randn(g, 4).requires_grad_()
    r = randn(g, 2, 3, 4)
    y = F.linear(x, w.t(), b)
    close(y, x @ w + b)
    dx, dw, db = grads_of(y, r, (x, w, b))
    out_cases.append(case("linear", {"in": 5, "out": 4, "bias": True,
                                     "weight_layout": "in_out", "seed": 4000},
                          {"x": x, "w": w, "b": b, "r": r, "y": y,
                           "dx": dx, "dw": dw, "db": db}))

    # layernorm over the last dim (biased variance)
    g = gen(4001)
    x = randn(g, 2, 3, 6).requires_grad_()
    gamma = randn(g, 6).requires_grad_()
    beta = randn(g, 6).requires_grad_()
    r = randn(g, 2, 3, 6)
    y = F.layer_norm(x, (6,), gamma, beta, eps=1e-5)
    mu, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    close(y, (x - mu) / torch.sqrt(var + 1e-5) * gamma + beta)
    dx, dgamma, dbeta = grads_of(y, r, (x, gamma, beta))
    out_cases.append(case("layernorm", {"eps": 1e-5, "seed": 4001},
                          {"x": x, "gamma": gamma, "beta": beta, "r": r, "y": y,
                           "dx": dx, "dgamma": dgamma, "dbeta": dbeta}))

    # rmsnorm: y = x / sqrt(mean(x^2) + eps) * gamma
    g = gen(4002)
    x = randn(g, 2, 3, 6).requires_grad_()
    gamma = randn(g, 6).requires_grad_()
    r = randn(g, 2, 3, 6)
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5) * gamma
    if hasattr(F, "rms_norm"):
        close(y, F.rms_norm(x, (6,), gamma, eps=1e-5))
    dx, dgamma = grads_of(y, r, (x, gamma))
    out_cases.append(case("rmsnorm", {"eps": 1e-5, "seed": 4002},
                          {"x": x, "gamma": gamma, "r": r, "y": y,
                           "dx": dx, "dgamma": dgamma}))

    # gelu, both forms
    for seed, approx in [(4003, "tanh"), (4004, "none")]:
        g = gen(seed)
        x = (randn(g, 2, 3, 5) * 2).requires_grad_()  # * 2: cover the tails too
        r = randn(g, 2, 3, 5)
        y = F.gelu(x, approximate=approx)
        if approx == "tanh":
            c = math.sqrt(2 / math.pi)
            close(y, 0.5 * x * (1 + torch.tanh(c * (x + 0.044715 * x ** 3))))
        else:
            close(y, 0.5 * x * (1 + torch.erf(x / math.sqrt(2))))
        (dx,) = grads_of(y, r, (x,))
        out_cases.append(case(f"gelu_{approx}", {"approximate": approx, "input_scale": 2.0,
                                                  "seed": seed},
                              {"x": x, "r": r, "y": y, "dx": dx}))

    # relu (random normal input never hits exactly 0)
    g = gen(4005)
    x = randn(g, 2, 3, 5).requires_grad_()
    r = randn(g, 2, 3, 5)
    y = F.relu(x)
    assert (x != 0).all()
    (dx,) = grads_of(y, r, (x,))
    out_cases.append(case("relu", {"seed": 4005}, {"x": x, "r": r, "y": y, "dx": dx}))

    # relu squared max(x, 0)^2 (So et al. 2021; modded-nanogpt's and nanochat's MLP), written as
    # nanochat writes it; torch differentiates relu and square itself
    g = gen(4008)
    x = (2.0 * randn(g, 2, 3, 5)).requires_grad_()
    r = randn(g, 2, 3, 5)
    y = F.relu(x).square()
    assert (x != 0).all()
    (dx,) = grads_of(y, r, (x,))
    out_cases.append(case("relu_squared", {"input_scale": 2.0, "seed": 4008},
                          {"x": x, "r": r, "y": y, "dx": dx}))

    # softcap c * tanh(x / c) (Gemma 2; nanochat caps the logits at 15), inputs of scale 20 so
    # that some saturate; torch differentiates tanh itself
    g = gen(4007)
    x = (20.0 * randn(g, 2, 3, 5)).requires_grad_()
    r = randn(g, 2, 3, 5)
    cap = 15.0
    y = cap * torch.tanh(x / cap)
    (dx,) = grads_of(y, r, (x,))
    out_cases.append(case("softcap", {"cap": cap, "input_scale": 20.0, "seed": 4007},
                          {"x": x, "r": r, "y": y, "dx": dx}))

    # embedding: ids repeat (3 twice, 5 three times), ids 0 and 6 unused -> zero grad rows
    g = gen(4006)
    table = randn(g, 7, 3).requires_grad_()
    ids = torch.tensor([[3, 1, 5, 3], [5, 2, 4, 5]], dtype=torch.int64)
    r = randn(g, 2, 4, 3)
    y = F.embedding(ids, table)
    (dtable,) = grads_of(y, r, (table,))
    out_cases.append(case("embedding", {"vocab": 7, "dim": 3, "seed": 4006},
                          {"table": table, "ids": ids, "r": r, "y": y, "dtable": dtable}))
    return out_cases


# --------------------------------------------------------------------------
# 5. cross-entropy
# --------------------------------------------------------------------------

def cross_entropy_cases():
    specs = [  # name, logits kind, positions (b, t) set to ignore_index
        ("basic_with_ignore", "normal", [(0, 1), (1, 3), (1, 4)]),
        ("large_logits_pm50", "uniform50", [(0, 0), (1, 2)]),
        ("no_ignore", "normal", []),
    ]
    out_cases = []
    for idx, (name, kind, ignored) in enumerate(specs):
        seed = 5000 + idx
        g = gen(seed)
        if kind == "normal":
            logits = randn(g, 2, 5, 6)
        else:  # uniform in [-50, 50]
            logits = (torch.rand(2, 5, 6, generator=g, dtype=DT) * 2 - 1) * 50
        logits.requires_grad_()
        targets = torch.randint(0, 6, (2, 5), generator=g, dtype=torch.int64)
        for bt in ignored:
            targets[bt] = -100
        loss = F.cross_entropy(logits.reshape(-1, 6), targets.reshape(-1),
                               ignore_index=-100, reduction="mean")
        (dlogits,) = torch.autograd.grad(loss, logits)
        # cross-check: mean over labelled positions of -log_softmax[target]
        keep = targets != -100
        lp = torch.log_softmax(logits, -1)
        manual = -lp[keep].gather(-1, targets[keep][:, None]).sum() / keep.sum()
        close(loss, manual)
        out_cases.append(case(name, {"ignore_index": -100, "reduction": "mean",
                                     "logits_kind": kind, "num_labelled": int(keep.sum()),
                                     "seed": seed},
                              {"logits": logits, "targets": targets,
                               "loss": loss, "dlogits": dlogits}))
    return out_cases


def z_loss_cases():
    """loss = F.cross_entropy + z * mean over labelled positions of logsumexp(logits)^2, by autograd.
    The softcap case caps raw logits first (c * tanh(x / c)) and differentiates w.r.t. the raw
    ones, as a model with logit_softcap trains."""
    specs = [  # name, logits kind, z, softcap (0: none), positions (b, t) set to ignore_index
        ("palm_1e-4_with_ignore", "normal", 1e-4, 0.0, [(0, 1), (1, 3), (1, 4)]),
        ("shifted_z0.1", "shifted", 0.1, 0.0, [(0, 0), (1, 2)]),
        ("softcap10_z0.01", "uniform30", 0.01, 10.0, [(1, 0)]),
    ]
    out_cases = []
    for idx, (name, kind, z, cap, ignored) in enumerate(specs):
        seed = 5100 + idx
        g = gen(seed)
        if kind == "normal":
            raw = randn(g, 2, 5, 6)
        elif kind == "shifted":  # log Z far from 0, so the z-loss term weighs in
            raw = randn(g, 2, 5, 6) * 2 + 4
        else:  # uniform in [-30, 30]
            raw = (torch.rand(2, 5, 6, generator=g, dtype=DT) * 2 - 1) * 30
        raw.requires_grad_()
        targets = torch.randint(0, 6, (2, 5), generator=g, dtype=torch.int64)
        for bt in ignored:
            targets[bt] = -100
        logits = cap * torch.tanh(raw / cap) if cap > 0 else raw
        keep = targets != -100
        ce = F.cross_entropy(logits.reshape(-1, 6), targets.reshape(-1),
                             ignore_index=-100, reduction="mean")
        log_z = torch.logsumexp(logits, -1)
        z_term = z * (log_z[keep] ** 2).mean()
        loss = ce + z_term
        (dlogits,) = torch.autograd.grad(loss, raw)
        # cross-check: the definition with log-softmax written out
        lp = logits - log_z[..., None]
        manual = (-lp[keep].gather(-1, targets[keep][:, None]).squeeze(-1)
                  + z * log_z[keep] ** 2).mean()
        close(loss, manual)
        out_cases.append(case(name, {"ignore_index": -100, "reduction": "mean", "z_loss": z,
                                     "softcap": cap, "logits_kind": kind,
                                     "num_labelled": int(keep.sum()), "seed": seed},
                              {"logits": raw, "targets": targets, "loss": loss,
                               "cross_entropy": ce, "z_term": z_term, "dlogits": dlogits}))
    return out_cases


# --------------------------------------------------------------------------
# 6. safetensors interop file
# --------------------------------------------------------------------------

INTEROP_README = """\
torch_written.safetensors: written by the Python `safetensors` package (safetensors.numpy.save_file), not by attnlab.
Tensors: "w" float32 (3,4) = arange(12)*0.5; "b" float64 (4,) = [1,-2,3.5,-4]; "i" int64 (2,) = [7,-9]; metadata {"format":"pt","note":"interop test"}.
Regenerate with `python3 tests/golden/make_goldens.py` from the repository root (see write_interop() there).
"""


def sort_metadata_keys(path):
    """safetensors keeps __metadata__ in a Rust HashMap, so its key order
    changes from run to run. Rewrite the header with the metadata keys sorted
    (same header length, same bytes otherwise) so reruns give identical files."""
    with open(path, "rb") as f:
        blob = f.read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= n
    with open(path, "wb") as f:
        f.write(blob[:8] + text.ljust(n, b" ") + blob[8 + n:])


def write_interop():
    from safetensors.numpy import load_file, save_file

    tensors = {
        "w": (np.arange(12, dtype=np.float32) * np.float32(0.5)).reshape(3, 4),
        "b": np.array([1.0, -2.0, 3.5, -4.0], dtype=np.float64),
        "i": np.array([7, -9], dtype=np.int64),
    }
    os.makedirs(INTEROP_DIR, exist_ok=True)
    path = os.path.join(INTEROP_DIR, "torch_written.safetensors")
    save_file(tensors, path, metadata={"format": "pt", "note": "interop test"})
    sort_metadata_keys(path)
    back = load_file(path)
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and np.array_equal(back[k], v)
    with open(os.path.join(INTEROP_DIR, "README.md"), "w") as f:
        f.write(INTEROP_README)
    print(f"wrote {os.path.relpath(path, ROOT)} ({os.path.getsize(path)} bytes)")



# --------------------------------------------------------------------------
# 7. multi-head attention and the pre-LN transformer block
# --------------------------------------------------------------------------
# attnlab stores projections as (in, out): q = x @ w_q with w_q (C, H*D); heads
# are split as q.view(B, T, H, D).transpose(1, 2) and merged back the same way.

def split_heads(t, h):
    b, n, hd = t.shape
    return t.view(b, n, h, hd // h).transpose(1, 2)


def merge_heads(t):
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


def mha_forward(x, ctx, w, cfg, mask):
    """w: dict of leaf tensors. Returns (y, p)."""
    h = cfg["heads"]
    q = split_heads(x @ w["w_q"], h)
    k = split_heads(ctx @ w["w_k"], h)
    v = split_heads(ctx @ w["w_v"], h)
    d = q.shape[-1]
    if cfg["qk_norm"]:
        q = F.layer_norm(q, (d,), w["q_norm.gamma"], w["q_norm.beta"], eps=1e-5)
        k = F.layer_norm(k, (d,), w["k_norm.gamma"], w["k_norm.beta"], eps=1e-5)
    if cfg["learnable_scale"]:
        scale = torch.exp(w["log_scale"])[:, None, None]  # (H, 1, 1)
    else:
        scale = effective_scale(cfg["scaling"], cfg["scale"], d)
    vis = visibility(x.shape[0], h, q.shape[2], k.shape[2], cfg["causal"], mask)
    o, p = masked_attention(q, k, v, scale, vis)
    return merge_heads(o) @ w["w_o"], p


MHA_CASES = [
    # name, B, Tq, Tk, C, Cc, H, D, Dv, scaling, scale, causal, mask, qk_norm, learnable_scale, cross
    ("self_sqrt_dk",            2, 4, 4, 8, 8, 2, 4, 4, "sqrt_dk", None, False, None, False, False, False),
    ("self_causal_dk_free_dv",  2, 5, 5, 6, 6, 2, 5, 3, "dk",      None, True,  None, False, False, False),
    ("self_explicit_scale_mask", 2, 5, 5, 6, 6, 3, 2, 4, "sqrt_dk", 0.37, False,
     [[1, 0, 1, 1, 0], [0, 1, 1, 1, 1]], False, False, False),
    ("cross_masked",            2, 3, 5, 6, 7, 2, 4, 4, "none",    None, False,
     [[1, 1, 0, 1, 1], [1, 0, 1, 1, 0]], False, False, True),
    ("qk_norm_learnable_scale", 2, 4, 4, 6, 6, 2, 4, 4, "sqrt_dk", None, True,
     [[1, 1, 1, 0], [0, 1, 1, 1]], True, True, False),
    ("one_head_dk_4x_dmodel",   2, 3, 3, 4, 4, 1, 16, 4, "sqrt_dk", None, False, None, False, False, False),
]


def mha_cases():
    out_cases = []
    for idx, (name, b, tq, tk, c, cc, h, d, dv, scaling, scale, causal, mask_rows, qk_norm,
              learnable, cross) in enumerate(MHA_CASES):
        seed = 6000 + idx
        g = gen(seed)
        cfg = {"d_model": c, "d_context": cc, "heads": h, "d_k": d, "d_v": dv,
               "scaling": scaling, "scale": scale, "causal": causal, "has_mask": mask_rows is not None,
               "qk_norm": qk_norm, "learnable_scale": learnable, "cross": cross, "seed": seed}
        x = randn(g, b, tq, c).requires_grad_()
        ctx = randn(g, b, tk, cc).requires_grad_() if cross else x
        w = {"w_q": randn(g, c, h * d) / math.sqrt(c), "w_k": randn(g, cc, h * d) / math.sqrt(cc),
             "w_v": randn(g, cc, h * dv) / math.sqrt(cc), "w_o": randn(g, h * dv, c) / math.sqrt(h * dv)}
        if qk_norm:
            for nm in ("q_norm", "k_norm"):
                w[nm + ".gamma"] = 1 + 0.3 * randn(g, d)
                w[nm + ".beta"] = 0.3 * randn(g, d)
        if learnable:
            w["log_scale"] = math.log(effective_scale(scaling, scale, d)) + 0.3 * randn(g, h)
        for t in w.values():
            t.requires_grad_()
        mask = torch.tensor(mask_rows, dtype=torch.bool) if mask_rows else None
        r = randn(g, b, tq, c)
        y, p = mha_forward(x, ctx, w, cfg, mask)
        inputs = [x] + ([ctx] if cross else []) + list(w.values())
        grads = torch.autograd.grad((y * r).sum(), inputs)
        if not (cross or qk_norm or learnable or mask is not None or causal) and d * h == c and dv == d:
            # independent cross-check: torch.nn.MultiheadAttention without biases
            ref = torch.nn.MultiheadAttention(c, h, bias=False, batch_first=True, dtype=DT)
            with torch.no_grad():
                ref.in_proj_weight.copy_(torch.cat([w["w_q"].t(), w["w_k"].t(), w["w_v"].t()]))
                ref.out_proj.weight.copy_(w["w_o"].t())
            y_ref, _ = ref(x, x, x, need_weights=False)
            close(y, y_ref)
        tensors = {"x": x}
        if cross:
            tensors["context"] = ctx
        tensors.update(w)
        if mask is not None:
            tensors["mask"] = mask
        tensors.update({"r": r, "y": y, "p": p, "dx": grads[0]})
        offset = 1
        if cross:
            tensors["dcontext"] = grads[1]
            offset = 2
        for key, gr in zip(w.keys(), grads[offset:]):
            tensors["d" + key] = gr
        out_cases.append(case(name, cfg, tensors))

    # a pre-LN transformer block: h = x + mha(ln1(x)); y = h + fc2(gelu_tanh(fc1(ln2(h))))
    seed = 6100
    g = gen(seed)
    b, t, c, h, d, f = 2, 5, 6, 2, 4, 10
    cfg = {"d_model": c, "heads": h, "d_k": d, "d_v": d, "d_ff": f, "scaling": "sqrt_dk",
           "scale": None, "causal": True, "norm": "layernorm", "qk_norm": False,
           "learnable_scale": False, "seed": seed}
    x = randn(g, b, t, c).requires_grad_()
    w = {"ln1.gamma": 1 + 0.3 * randn(g, c), "ln1.beta": 0.3 * randn(g, c),
         "attn.w_q": randn(g, c, h * d) / math.sqrt(c), "attn.w_k": randn(g, c, h * d) / math.sqrt(c),
         "attn.w_v": randn(g, c, h * d) / math.sqrt(c), "attn.w_o": randn(g, h * d, c) / math.sqrt(h * d),
         "ln2.gamma": 1 + 0.3 * randn(g, c), "ln2.beta": 0.3 * randn(g, c),
         "mlp.fc1.w": randn(g, c, f) / math.sqrt(c), "mlp.fc1.b": 0.3 * randn(g, f),
         "mlp.fc2.w": randn(g, f, c) / math.sqrt(f), "mlp.fc2.b": 0.3 * randn(g, c)}
    for v in w.values():
        v.requires_grad_()
    r = randn(g, b, t, c)
    a_in = F.layer_norm(x, (c,), w["ln1.gamma"], w["ln1.beta"], eps=1e-5)
    attn_w = {k[len("attn."):]: v for k, v in w.items() if k.startswith("attn.")}
    a, _ = mha_forward(a_in, a_in, attn_w, dict(cfg, cross=False), None)
    hid = x + a
    m_in = F.layer_norm(hid, (c,), w["ln2.gamma"], w["ln2.beta"], eps=1e-5)
    m = F.gelu(m_in @ w["mlp.fc1.w"] + w["mlp.fc1.b"], approximate="tanh") @ w["mlp.fc2.w"] + w["mlp.fc2.b"]
    y = hid + m
    grads = torch.autograd.grad((y * r).sum(), [x] + list(w.values()))
    tensors = {"x": x}
    tensors.update(w)
    tensors.update({"r": r, "y": y, "dx": grads[0]})
    for key, gr in zip(w.keys(), grads[1:]):
        tensors["d" + key] = gr
    out_cases.append(case("block_pre_ln_causal", cfg, tensors))
    return out_cases


def rope_complex(x, theta, fraction, interleaved, offset=0):
    """Rotary positions by complex multiplication (Su et al. 2021, eq. 13; Meta's LLaMA
    apply_rotary_emb): pair i of a row, as the complex number a + ib, is multiplied by
    e^{i p theta^(-2i/rot)}. Pairs are (2i, 2i+1) when interleaved, else (i, i + rot/2)."""
    d = x.shape[-1]
    rot = int(math.floor(fraction * d + 1e-9))
    half = rot // 2
    xr, rest = x[..., :rot], x[..., rot:]
    if interleaved:
        pairs = xr.reshape(*xr.shape[:-1], half, 2)
    else:
        pairs = torch.stack([xr[..., :half], xr[..., half:]], dim=-1)
    z = torch.view_as_complex(pairs.contiguous())
    freqs = 1.0 / theta ** (torch.arange(half, dtype=DT) * 2 / rot)
    pos = torch.arange(offset, offset + x.shape[-2], dtype=DT)
    turn = torch.polar(torch.ones(len(pos), half, dtype=DT), torch.outer(pos, freqs))
    out = torch.view_as_real(z * turn)  # (..., T, half, 2)
    if interleaved:
        out = out.reshape(*xr.shape)
    else:
        out = torch.cat([out[..., 0], out[..., 1]], dim=-1)
    return torch.cat([out, rest], dim=-1)


ROPE_OP_CASES = [
    # name, B, H, T, D, theta, fraction, interleaved, offset
    ("half_full",         2, 3, 5, 8, 10000.0, 1.0, False, 0),
    ("interleaved_full",  2, 3, 5, 8, 10000.0, 1.0, True, 0),
    ("half_partial",      1, 2, 6, 12, 100.0, 0.5, False, 0),
    ("interleaved_partial_offset", 2, 2, 3, 10, 500.0, 0.4, True, 7),
    ("half_offset_long",  1, 1, 4, 6, 10000.0, 1.0, False, 1000),
]

ROPE_MHA_CASES = [
    # name, B, T, C, H, Hkv, D, theta, fraction, interleaved, qk_norm, causal, mask
    ("mha_rope_causal",             2, 5, 8, 2, 2, 4, 10000.0, 1.0, False, False, True, None),
    ("mha_rope_qk_norm_partial",    2, 4, 6, 2, 2, 6, 100.0, 2.0 / 3.0, False, True, False,
     [[1, 1, 1, 0], [0, 1, 1, 1]]),
    ("mha_rope_interleaved_gqa",    2, 5, 8, 4, 2, 4, 50.0, 1.0, True, False, True,
     [[1, 1, 0, 1, 1], [1, 1, 1, 1, 1]]),
]


def rope_cases():
    out_cases = []
    for idx, (name, b, h, t, d, theta, fraction, interleaved, offset) in enumerate(ROPE_OP_CASES):
        seed = 9000 + idx
        g = gen(seed)
        x = randn(g, b, h, t, d).requires_grad_()
        r = randn(g, b, h, t, d)
        y = rope_complex(x, theta, fraction, interleaved, offset)
        (dx,) = torch.autograd.grad((y * r).sum(), [x])
        cfg = {"theta": theta, "fraction": fraction, "interleaved": interleaved, "offset": offset,
               "seed": seed}
        out_cases.append(case(name, cfg, {"x": x, "r": r, "y": y, "dx": dx}))
    for idx, (name, b, t, c, h, hkv, d, theta, fraction, interleaved, qk_norm, causal,
              mask_rows) in enumerate(ROPE_MHA_CASES):
        seed = 9100 + idx
        g = gen(seed)
        x = randn(g, b, t, c).requires_grad_()
        w = {"w_q": randn(g, c, h * d) / math.sqrt(c), "w_k": randn(g, c, hkv * d) / math.sqrt(c),
             "w_v": randn(g, c, hkv * d) / math.sqrt(c), "w_o": randn(g, h * d, c) / math.sqrt(h * d)}
        if qk_norm:
            for nm in ("q_norm", "k_norm"):
                w[nm + ".gamma"] = 1 + 0.3 * randn(g, d)
                w[nm + ".beta"] = 0.3 * randn(g, d)
        for v in w.values():
            v.requires_grad_()
        r = randn(g, b, t, c)
        q = (x @ w["w_q"]).view(b, t, h, d).transpose(1, 2)
        k = (x @ w["w_k"]).view(b, t, hkv, d).transpose(1, 2)
        v = (x @ w["w_v"]).view(b, t, hkv, d).transpose(1, 2)
        if qk_norm:
            q = F.layer_norm(q, (d,), w["q_norm.gamma"], w["q_norm.beta"], eps=1e-5)
            k = F.layer_norm(k, (d,), w["k_norm.gamma"], w["k_norm.beta"], eps=1e-5)
        q = rope_complex(q, theta, fraction, interleaved)
        k = rope_complex(k, theta, fraction, interleaved)
        k = k.repeat_interleave(h // hkv, dim=1)
        v = v.repeat_interleave(h // hkv, dim=1)
        mask = torch.tensor(mask_rows, dtype=torch.bool) if mask_rows else None
        vis = visibility(b, h, t, t, causal, mask)
        o, p = masked_attention(q, k, v, 1 / math.sqrt(d), vis)
        y = merge_heads(o) @ w["w_o"]
        grads = torch.autograd.grad((y * r).sum(), [x] + list(w.values()))
        cfg = {"d_model": c, "heads": h, "kv_heads": hkv, "d_k": d, "theta": theta,
               "fraction": fraction, "interleaved": interleaved, "qk_norm": qk_norm,
               "causal": causal, "has_mask": mask is not None, "seed": seed}
        tensors = {"x": x}
        tensors.update(w)
        if mask is not None:
            tensors["mask"] = mask
        tensors.update({"r": r, "y": y, "p": p, "dx": grads[0]})
        for key, gr in zip(w.keys(), grads[1:]):
            tensors["d" + key] = gr
        out_cases.append(case(name, cfg, tensors))
    return out_cases


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
