"""attnlab <-> PyTorch: the attnlab Transformer as a plain torch.nn.Module, and checkpoints both ways.

    import attnlab_torch as at
    model, run_config = at.load_run("runs/train")        # an attnlab run directory
    logits = model([keys, values])                        # one (B, T) LongTensor per field
    at.export_run(model, "runs/from_torch", run_config)   # back: `attnlab eval --checkpoint ...`

The module is written independently of attnlab's C++ code, from the definitions in
lib/include/attnlab/nn/*.hpp (pre-LN blocks, a GELU-tanh or ReLU² MLP, no head bias, ...), and covers
every option of attnlab's TransformerConfig: several input fields, learned / sinusoidal / no positions,
LayerNorm / RMSNorm / no norm, attention-only blocks, d_k and d_v apart from d_model / heads,
grouped-query attention (kv_heads), the scaling modes none / sqrt_dk / dk and an explicit scale,
QK-norm, a learnable per-head scale, causal attention, a sliding window, ALiBi, rotary positions
(positions "rope": rope_theta, rope_fraction, rope_interleaved), the attention-score softcap
(sdpa.softcap: c tanh(s q.k / c) before ALiBi and the mask), the output-logit softcap, the tied
embedding and head (tie_embeddings: head.weight is embed.fields.0.weight), and dropout on the
attention weights and the residual branches (in train() mode; its random draws are
PyTorch's, not attnlab's Philox masks). Cross-attention (d_context) is not part of the Transformer.

Names: attnlab stores Linear weights as (in, out) and calls them "w"; PyTorch stores (out, in) and
calls them "weight". The mapping (to_torch_name) renames and transposes:
    embed.fields.<i>.table  <-> embed.fields.<i>.weight      (nn.Embedding, same layout)
    pos.table               <-> pos.weight                   (learned positions only)
    *.gamma / *.beta        <-> *.weight / *.bias            (norms)
    attn.w_q|w_k|w_v|w_o    <-> attn.q_proj|k_proj|v_proj|out_proj.weight   (transposed)
    mlp.fc<i>.w / .b        <-> mlp.fc<i>.weight / .bias     (weight transposed)
    head.w                  <-> head.weight                  (transposed; absent when tied, where
                                                              head.weight is embed.fields.0.weight)
    attn.log_scale          <-> attn.log_scale

Files are safetensors, read and written by the small codec below (the format is an 8-byte header
length, a JSON header and raw little-endian data), so nothing but torch is needed; the `safetensors`
package reads what it writes. save_torch_state() writes the PyTorch-layout file that Hugging Face
tools expect, marked {"format": "pt"}; attnlab's own checkpoints keep attnlab's (in, out) layout and
are not so marked.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
import tempfile

import torch
from torch import nn
from torch.nn import functional as F

FORMAT_VERSION = "attnlab-1"
LAYERNORM_EPS = 1e-5  # attnlab's kLayerNormEps and kRmsNormEps (PyTorch's default)

# ---------------------------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------------------------

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
}
_NAMES = {v: k for k, v in _DTYPES.items()}


def read_safetensors(path):
    """Returns ({name: tensor}, {metadata}) of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"read_safetensors: {path}: expected a safetensors file, got {len(data)} bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"read_safetensors: {path}: header length {n} exceeds the file")
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {}) or {}
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"read_safetensors: {path}: tensor {name!r}: unsupported dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        raw = bytearray(data[base + begin : base + end])
        flat = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(info["shape"]).clone()
    return tensors, metadata


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} atomically (temporary file, fsync, rename), data in the given order."""
    header = {}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        if t.dtype not in _NAMES:
            raise ValueError(f"write_safetensors: tensor {name!r}: unsupported dtype {t.dtype}")
        # bytes of the tensor through a same-width integer view (works for bfloat16 too)
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        raw = t.reshape(-1).view(width).numpy().tobytes()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)  # align the data to 8 bytes, as safetensors does

    def write(f):
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)

    _write_atomic(path, "wb", write)


def _write_atomic(path, mode, write):
    """write(f) into a temporary file beside path, fsync, rename over path (all or nothing)."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".tmp-", dir=directory)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write_text_atomic(path, text):
    _write_atomic(path, "w", lambda f: f.write(text))


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


def _head_dims(att):
    C, H = att["d_model"], att["heads"]
    D = att.get("d_k", 0) or C // H
    Dv = att.get("d_v", 0) or C // H
    Hkv = att.get("kv_heads", 0) or H
    return C, H, Hkv, D, Dv


def _mode_scale(att, D):
    sdpa = att.get("sdpa", {})
    if sdpa.get("scale") is not None:
        return float(sdpa["scale"])
    scaling = sdpa.get("scaling", "sqrt_dk")
    if scaling == "none":
        return 1.0
    if scaling == "sqrt_dk":
        return 1.0 / math.sqrt(D)
    if scaling == "dk":
        return 1.0 / D
    raise ValueError(f"attnlab_torch: block.attention.sdpa.scaling expected none|sqrt_dk|dk, got {scaling!r}")


def alibi_slopes(heads):
    """ALiBi's slopes 2^(-8(h+1)/H) (Press et al. 2022), as attnlab's alibi_slopes()."""
    return [2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)]


def rope_dims(fraction, D):
    """The rotated dims of a head of D: floor(fraction * D), even and >= 2, as attnlab's rope_dims."""
    rot = int(math.floor(fraction * D + 1e-9))
    if not (0 < fraction <= 1) or rot < 2 or rot % 2:
        raise ValueError(f"attnlab_torch: rope_fraction expected floor(fraction * d_k) even and >= 2 "
                         f"(d_k = {D}), got {fraction}")
    return rot


def apply_rope(x, theta, fraction, interleaved=False, offset=0):
    """x (B, H, T, D) at positions offset ..: the first rot dims turn in rot/2 pairs, pair i by
    p * theta^(-2i/rot); pair i is (i, i + rot/2) (GPT-NeoX, Hugging Face's rotate_half) or
    (2i, 2i + 1) when interleaved. The angles are formed in double, as attnlab's table."""
    T, D = x.shape[-2], x.shape[-1]
    rot = rope_dims(fraction, D)
    freq = theta ** (-torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    angle = torch.arange(offset, offset + T, dtype=torch.float64)[:, None] * freq[None, :]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    xr, rest = x[..., :rot], x[..., rot:]
    if interleaved:
        a, b = xr[..., 0::2], xr[..., 1::2]
        turned = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    else:
        a, b = xr[..., : rot // 2], xr[..., rot // 2 :]
        turned = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    return torch.cat([turned, rest], dim=-1)


def sinusoidal_table(max_len, dim):
    """Vaswani et al. 2017, §3.5: sin at even columns, cos at odd ones, base 10000."""
    t = torch.arange(max_len, dtype=torch.float64)[:, None]
    c = torch.arange(dim)
    freq = torch.pow(torch.tensor(10000.0, dtype=torch.float64), -(c - c % 2).double() / dim)
    angle = t * freq[None, :]
    return torch.where(c % 2 == 0, torch.sin(angle), torch.cos(angle))


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight (torch 1.13 has no nn.RMSNorm)."""

    def __init__(self, dim, eps=LAYERNORM_EPS):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _make_norm(kind, dim, bias=True):
    if kind == "layernorm":
        norm = nn.LayerNorm(dim, eps=LAYERNORM_EPS)
        if not bias:  # "bias": false: no beta (nn.LayerNorm's bias=False, spelt for torch < 2.1)
            del norm.bias
            norm.register_parameter("bias", None)
        return norm
    if kind == "rmsnorm":
        return RMSNorm(dim)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"attnlab_torch: norm expected layernorm|rmsnorm|none, got {kind!r}")


class Attention(nn.Module):
    """Multi-head self-attention as attnlab's MultiHeadAttention (no projection biases)."""

    def __init__(self, att, rope=False):
        super().__init__()
        C, H, Hkv, D, Dv = _head_dims(att)
        self.rope = bool(rope or att.get("rope", False))
        self.rope_theta = float(att.get("rope_theta", 10000.0))
        self.rope_fraction = float(att.get("rope_fraction", 1.0))
        self.rope_interleaved = bool(att.get("rope_interleaved", False))
        if self.rope:
            if not (math.isfinite(self.rope_theta) and self.rope_theta > 0):
                raise ValueError(f"attnlab_torch: rope_theta expected a finite base > 0, got {self.rope_theta}")
            rope_dims(self.rope_fraction, D)
        if H % Hkv:
            raise ValueError(f"attnlab_torch: kv_heads expected a divisor of heads = {H}, got {Hkv}")
        self.H, self.Hkv, self.D, self.Dv = H, Hkv, D, Dv
        sdpa = att.get("sdpa", {})
        self.causal = bool(sdpa.get("causal", False))
        self.window = int(sdpa.get("window", 0))
        if self.window and not self.causal:
            raise ValueError("attnlab_torch: sdpa.window expected causal attention")
        self.softcap = float(sdpa.get("softcap", 0.0))
        if not (math.isfinite(self.softcap) and self.softcap >= 0):
            raise ValueError(f"attnlab_torch: sdpa.softcap expected a finite cap > 0 or 0, got {self.softcap}")
        self.q_proj = nn.Linear(C, H * D, bias=False)
        self.k_proj = nn.Linear(C, Hkv * D, bias=False)
        self.v_proj = nn.Linear(C, Hkv * Dv, bias=False)
        self.out_proj = nn.Linear(H * Dv, C, bias=False)
        self.qk_norm = bool(att.get("qk_norm", False))
        if self.qk_norm:
            self.q_norm = nn.LayerNorm(D, eps=LAYERNORM_EPS)
            self.k_norm = nn.LayerNorm(D, eps=LAYERNORM_EPS)
        self.fixed_scale = _mode_scale(att, D)
        self.learnable_scale = bool(att.get("learnable_scale", False))
        if self.learnable_scale:
            self.log_scale = nn.Parameter(torch.full((H,), math.log(self.fixed_scale)))
        self.alibi = bool(att.get("alibi", False))
        if self.alibi:
            self.register_buffer("slopes", torch.tensor(alibi_slopes(H), dtype=torch.float64),
                                 persistent=False)
        self.dropout = nn.Dropout(float(att.get("dropout", 0.0)))
        self.last_weights = None  # (B, H, T, T) of the last forward

    def forward(self, x):
        B, T, _ = x.shape
        H, Hkv, D, Dv = self.H, self.Hkv, self.D, self.Dv
        q = self.q_proj(x).view(B, T, H, D).transpose(1, 2)
        k = self.k_proj(x).view(B, T, Hkv, D).transpose(1, 2)
        v = self.v_proj(x).view(B, T, Hkv, Dv).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope:  # after QK-norm, as attnlab
            q = apply_rope(q, self.rope_theta, self.rope_fraction, self.rope_interleaved)
            k = apply_rope(k, self.rope_theta, self.rope_fraction, self.rope_interleaved)
        if Hkv != H:  # grouped-query attention: query head h reads K/V head h // (H / Hkv)
            k = k.repeat_interleave(H // Hkv, dim=1)
            v = v.repeat_interleave(H // Hkv, dim=1)
        if self.learnable_scale:
            scale = self.log_scale.exp().view(1, H, 1, 1)
        else:
            scale = self.fixed_scale
        s = (q @ k.transpose(-1, -2)) * scale
        if self.softcap:  # c tanh(s q.k / c), before ALiBi and the mask, as attnlab
            s = self.softcap * torch.tanh(s / self.softcap)
        i = torch.arange(T, device=x.device)[:, None]
        j = torch.arange(T, device=x.device)[None, :]
        if self.alibi:  # -m_h (i - j) at the visible keys
            s = s + (self.slopes.to(s.dtype).view(1, H, 1, 1) * (j - i).to(s.dtype))
        if self.causal:
            visible = j <= i
            if self.window:
                visible = visible & (j > i - self.window)
            s = s.masked_fill(~visible, float("-inf"))
        p = torch.softmax(s, dim=-1)
        self.last_weights = p.detach()
        o = self.dropout(p) @ v
        return self.out_proj(o.transpose(1, 2).reshape(B, T, H * Dv))


def default_mlp_width(C, activation):
    """4C, or for SwiGLU LLaMA's rule: int(2 * 4C / 3) rounded up to a multiple of 16."""
    if activation != "swiglu":
        return 4 * C
    return (8 * C // 3 + 15) // 16 * 16


class MLP(nn.Module):
    """fc1 -> activation -> fc2: GELU's tanh form, ReLU² (max(x, 0)², "mlp": "relu2"), or SwiGLU
    ("mlp": "swiglu": fc1 is (C -> 2F) = [gate | up], silu(gate) * up; LLaMA's w1 and w3 side by
    side)."""

    def __init__(self, C, F_, activation="gelu", bias=True):
        super().__init__()
        if activation not in ("gelu", "relu2", "swiglu"):
            raise ValueError(f"attnlab_torch: mlp expected gelu|relu2|swiglu, got {activation!r}")
        self.activation = activation
        self.fc1 = nn.Linear(C, 2 * F_ if activation == "swiglu" else F_, bias=bias)
        self.fc2 = nn.Linear(F_, C, bias=bias)

    def forward(self, x):
        h = self.fc1(x)
        if self.activation == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        elif self.activation == "relu2":
            h = F.relu(h).square()
        else:
            h = F.gelu(h, approximate="tanh")
        return self.fc2(h)


class Block(nn.Module):
    """Pre-LN: h = x + drop(attn(ln1(x))); y = h + drop(mlp(ln2(h))) (without the MLP: y = h)."""

    def __init__(self, block, rope=False):
        super().__init__()
        att = block["attention"]
        C = att["d_model"]
        norm = block.get("norm", "layernorm")
        bias = bool(block.get("bias", True))
        self.ln1 = _make_norm(norm, C, bias)
        self.attn = Attention(att, rope)
        self.attn_only = bool(block.get("attn_only", False))
        if not self.attn_only:
            self.ln2 = _make_norm(norm, C, bias)
            activation = block.get("mlp", "gelu")
            self.mlp = MLP(C, block.get("d_ff", 0) or default_mlp_width(C, activation), activation,
                           bias)
        self.dropout = nn.Dropout(float(block.get("dropout", 0.0)))

    def forward(self, x):
        h = x + self.dropout(self.attn(self.ln1(x)))
        if self.attn_only:
            return h
        return h + self.dropout(self.mlp(self.ln2(h)))


class Fields(nn.Module):
    def __init__(self, vocab_sizes, C):
        super().__init__()
        self.fields = nn.ModuleList(nn.Embedding(v, C) for v in vocab_sizes)


class Transformer(nn.Module):
    """attnlab's Transformer: x = sum_i embed_i(fields[i]) + pos; blocks; logits = head(ln_f(x)),
    capped as c * tanh(logits / c) when the config's logit_softcap c is set.

    config: the "model" object of an attnlab run config (config.json), e.g. from load_run().
    forward(fields): one (B, T) integer tensor per input field, -1 marking an absent field (it adds
    nothing), T <= max_len. Returns the logits (B, T, out_vocab).
    """

    def __init__(self, config):
        super().__init__()
        self.config = json.loads(json.dumps(config))  # a private copy
        block = config["block"]
        C = block["attention"]["d_model"]
        self.max_len = int(config["max_len"])
        self.embed = Fields(config["vocab_sizes"], C)
        self.positions = config.get("positions", "learned")
        if self.positions == "learned":
            self.pos = nn.Embedding(self.max_len, C)
        elif self.positions == "sinusoidal":
            self.register_buffer("pos_table", sinusoidal_table(self.max_len, C).float(),
                                 persistent=False)
        elif self.positions not in ("none", "rope"):
            raise ValueError(f"attnlab_torch: positions expected learned|sinusoidal|none|rope, got {self.positions!r}")
        rope = self.positions == "rope"
        self.blocks = nn.ModuleList(Block(block, rope) for _ in range(int(config["layers"])))
        self.ln_f = _make_norm(block.get("norm", "layernorm"), C, bool(block.get("bias", True)))
        self.head = nn.Linear(C, int(config["out_vocab"]), bias=False)
        self.tie_embeddings = bool(config.get("tie_embeddings", False))
        if self.tie_embeddings:  # nanoGPT's wte.weight = lm_head.weight: one Parameter, (V, C)
            if len(self.embed.fields) != 1 or config["vocab_sizes"][0] != int(config["out_vocab"]):
                raise ValueError("attnlab_torch: tie_embeddings expected one field whose vocabulary "
                                 f"is out_vocab, got vocab_sizes {config['vocab_sizes']} and "
                                 f"out_vocab {config['out_vocab']}")
            self.head.weight = self.embed.fields[0].weight
        self.logit_softcap = float(config.get("logit_softcap", 0) or 0)
        if not (self.logit_softcap == 0 or (math.isfinite(self.logit_softcap) and self.logit_softcap > 0)):
            raise ValueError(f"attnlab_torch: logit_softcap expected a finite cap > 0 (or 0), got {self.logit_softcap}")

    def forward(self, fields):
        if len(fields) != len(self.embed.fields):
            raise ValueError(f"Transformer.forward: fields expected {len(self.embed.fields)} tensors, got {len(fields)}")
        B, T = fields[0].shape
        if T > self.max_len:
            raise ValueError(f"Transformer.forward: sequence length expected <= max_len {self.max_len}, got {T}")
        x = 0
        for emb, ids in zip(self.embed.fields, fields):
            present = (ids >= 0).unsqueeze(-1).to(emb.weight.dtype)
            x = x + emb(ids.clamp(min=0)) * present
        if self.positions == "learned":
            x = x + self.pos.weight[:T]
        elif self.positions == "sinusoidal":
            x = x + self.pos_table[:T].to(x.dtype)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if self.logit_softcap:  # attnlab's output-logit softcap: c * tanh(logits / c)
            logits = self.logit_softcap * torch.tanh(logits / self.logit_softcap)
        return logits


# ---------------------------------------------------------------------------------------------
# Names and checkpoints
# ---------------------------------------------------------------------------------------------

_PROJ = {"w_q": "q_proj", "w_k": "k_proj", "w_v": "v_proj", "w_o": "out_proj"}


def to_torch_name(name):
    """attnlab parameter name -> (PyTorch state_dict name, transposed?)."""
    parts = name.split(".")
    last = parts[-1]
    if last == "table":
        return ".".join(parts[:-1] + ["weight"]), False
    if last == "gamma":
        return ".".join(parts[:-1] + ["weight"]), False
    if last == "beta":
        return ".".join(parts[:-1] + ["bias"]), False
    if last in _PROJ and len(parts) >= 2 and parts[-2] == "attn":
        return ".".join(parts[:-1] + [_PROJ[last], "weight"]), True
    if last == "w":
        return ".".join(parts[:-1] + ["weight"]), True
    if last == "b":
        return ".".join(parts[:-1] + ["bias"]), False
    if last == "log_scale":
        return name, False
    raise ValueError(f"to_torch_name: unknown attnlab parameter name {name!r}")


def to_torch_state(tensors, dtype=None):
    """attnlab tensors {name: (in, out) ...} -> a PyTorch state_dict (optimizer state dropped)."""
    state = {}
    for name, t in tensors.items():
        if name.startswith("optim."):
            continue
        torch_name, transpose = to_torch_name(name)
        t = t.t() if transpose else t
        state[torch_name] = t.contiguous().to(dtype) if dtype is not None else t.contiguous()
    return state


def from_torch_state(module, dtype=torch.float32):
    """A Transformer's parameters -> attnlab tensors {attnlab name: (in, out) layout}."""
    names = {}
    for name in _attnlab_names(module.config):
        names[to_torch_name(name)] = name
    state = module.state_dict()
    out = {}
    for (torch_name, transpose), name in names.items():
        if torch_name not in state:
            raise ValueError(f"from_torch_state: the module lacks {torch_name!r} (attnlab {name!r})")
        t = state[torch_name].detach().cpu()
        out[name] = (t.t() if transpose else t).contiguous().to(dtype)
    return out


def _attnlab_names(config):
    """The parameter names of an attnlab Transformer of this config, in attnlab's order."""
    block = config["block"]
    att = block["attention"]
    names = [f"embed.fields.{i}.table" for i in range(len(config["vocab_sizes"]))]
    if config.get("positions", "learned") == "learned":
        names.append("pos.table")
    norm = block.get("norm", "layernorm")
    bias = bool(block.get("bias", True))

    def norm_names(prefix):
        if norm == "layernorm":
            return [prefix + "gamma", prefix + "beta"] if bias else [prefix + "gamma"]
        if norm == "rmsnorm":
            return [prefix + "gamma"]
        return []

    for l in range(int(config["layers"])):
        p = f"blocks.{l}."
        names += norm_names(p + "ln1.")
        names += [p + "attn.w_q", p + "attn.w_k", p + "attn.w_v", p + "attn.w_o"]
        if att.get("qk_norm", False):
            names += [p + "attn.q_norm.gamma", p + "attn.q_norm.beta",
                      p + "attn.k_norm.gamma", p + "attn.k_norm.beta"]
        if att.get("learnable_scale", False):
            names.append(p + "attn.log_scale")
        if not block.get("attn_only", False):
            names += norm_names(p + "ln2.")
            names += ([p + "mlp.fc1.w", p + "mlp.fc1.b", p + "mlp.fc2.w", p + "mlp.fc2.b"] if bias
                      else [p + "mlp.fc1.w", p + "mlp.fc2.w"])
    names += norm_names("ln_f.")
    if not config.get("tie_embeddings", False):  # tied: the head is embed.fields.0.table
        names.append("head.w")
    return names


def _checkpoint_path(path):
    return os.path.join(path, "model.safetensors") if os.path.isdir(path) else path


def load_run(path, dtype=torch.float32):
    """An attnlab run directory (or its model.safetensors) -> (Transformer in eval mode, run config).

    The run config is the dict of the run's config.json (as stored in the checkpoint); its "model"
    entry built the module. Optimizer state in the file is ignored.
    """
    file = _checkpoint_path(path)
    tensors, meta = read_safetensors(file)
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"load_run: {file}: format_version expected {FORMAT_VERSION!r}, got {meta.get('format_version')!r}")
    run_config = json.loads(meta["model_config"])
    model = Transformer(run_config["model"]).to(dtype)
    state = to_torch_state(tensors, dtype)
    if model.tie_embeddings:  # one tensor, two names; a separate head.w is not this model's
        if "head.weight" in state:
            raise ValueError(f"load_run: {file}: parameters do not match the config: unexpected "
                             "['head.w'] (tie_embeddings: the head is embed.fields.0.table)")
        if "embed.fields.0.weight" in state:
            state["head.weight"] = state["embed.fields.0.weight"]
    expected = set(model.state_dict().keys())
    missing, extra = sorted(expected - state.keys()), sorted(state.keys() - expected)
    if missing or extra:
        raise ValueError(f"load_run: {file}: parameters do not match the config: missing {missing}, unexpected {extra}")
    model.load_state_dict(state, strict=True)
    return model.eval(), run_config


def export_run(module, out_dir, run_config=None):
    """Writes module as an attnlab weights-only run: out_dir/model.safetensors and config.json.

    run_config: the attnlab run config to store (at least its "task", so that `attnlab eval` can
    rebuild the eval set; missing fields take attnlab's defaults); its "model" entry is replaced by
    the module's config. `attnlab eval --checkpoint out_dir` then evaluates it; `--resume` refuses
    it (weights only).
    """
    config = json.loads(json.dumps(run_config or {}))
    config["model"] = module.config
    os.makedirs(out_dir, exist_ok=True)
    text = json.dumps(config, indent=2, sort_keys=True)
    meta = {
        "format_version": FORMAT_VERSION,
        "dtype": "F32",
        "model_config": text,
        "step": "0",
        "rng_state": "1 0 0 0",  # a valid data-stream state; unused, since resuming is refused
        "kind": "attnlab-train-run",
        "optimizer_steps": "0",
        "contents": "weights",
    }
    write_safetensors(os.path.join(out_dir, "model.safetensors"), from_torch_state(module), meta)
    _write_text_atomic(os.path.join(out_dir, "config.json"), text + "\n")


def save_torch_state(module, path):
    """The module's state_dict in PyTorch's layout, as Hugging Face keeps weights: a safetensors file
    with metadata {"format": "pt"} and the attnlab model config."""
    state = {k: v for k, v in module.state_dict().items()}
    write_safetensors(path, state, {"format": "pt", "attnlab_model_config": json.dumps(module.config)})


def load_torch_state(path):
    """The inverse of save_torch_state: a Transformer (eval mode) with those weights."""
    tensors, meta = read_safetensors(path)
    if meta.get("format") != "pt" or "attnlab_model_config" not in meta:
        raise ValueError(f"load_torch_state: {path}: expected a file written by save_torch_state "
                         "(metadata format 'pt' and attnlab_model_config)")
    model = Transformer(json.loads(meta["attnlab_model_config"]))
    model.load_state_dict(tensors, strict=True)
    return model.eval()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("to-torch", help="attnlab run -> PyTorch-layout safetensors ({'format': 'pt'})")
    a.add_argument("run", help="an attnlab run directory or its model.safetensors")
    a.add_argument("out", help="the .safetensors file to write")
    b = sub.add_parser("from-torch", help="PyTorch-layout safetensors -> attnlab weights-only run")
    b.add_argument("file", help="a file written by to-torch / save_torch_state")
    b.add_argument("out", help="the run directory to write")
    b.add_argument("--run-config", help="an attnlab config.json to take the task and training fields from")
    args = parser.parse_args(argv)
    try:
        if args.command == "to-torch":
            model, _ = load_run(args.run)
            save_torch_state(model, args.out)
        else:
            model = load_torch_state(args.file)
            run_config = None
            if args.run_config:
                with open(args.run_config, encoding="utf-8") as f:
                    run_config = json.load(f)
            export_run(model, args.out, run_config)
    except (OSError, ValueError, KeyError) as e:
        print(f"attnlab_torch: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
