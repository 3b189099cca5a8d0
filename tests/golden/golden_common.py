"""The helpers of the golden generator (make_goldens.py): the JSON layout, seeded draws in
float64, and attention written densely (visibility, masked softmax) for the case makers to share."""

import json
import math
import os

import torch

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


def attention_tensors(q, k, v, r, mask, out, p, dq, dk, dv):
    """An attention case's tensors, in the order the attention goldens store them."""
    tensors = {"q": q, "k": k, "v": v, "r": r}
    if mask is not None:
        tensors["mask"] = mask
    tensors.update({"out": out, "p": p, "dq": dq, "dk": dk, "dv": dv})
    return tensors


def close(a, b, tol=1e-12):
    assert torch.allclose(a, b, rtol=tol, atol=tol), (a - b).abs().max().item()


# --------------------------------------------------------------------------
# attention written densely: the reference of the attention cases
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


# --------------------------------------------------------------------------
# gradients by autograd, for the layer cases
# --------------------------------------------------------------------------

def grads_of(y, r, inputs):
    return torch.autograd.grad((y * r).sum(), inputs)
