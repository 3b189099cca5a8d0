"""A compact GPT in nanoGPT's model-code style, for tests/bench/torch_train.py's nanogpt-* variants.

Written for this benchmark (not a copy of nanoGPT's model.py): token + learned position embeddings,
pre-LN blocks (LayerNorm with bias, eps 1e-5), causal self-attention through one fused c_attn
Linear (C -> 3C) and c_proj, F.scaled_dot_product_attention(is_causal=True) (PyTorch picks its CPU
flash kernel), an MLP c_fc (C -> d_ff) / GELU / c_proj (d_ff -> C), a final LayerNorm and lm_head;
forward(idx, targets) returns (logits, mean cross-entropy) as nanoGPT's does, so that
torch.compile sees the loss too.

Shapes and biases are attnlab's (python/attnlab_torch.py's Transformer for the same "model"
config), so the FLOPs and the parameter count are the same: the MLP's Linears have biases; the
attention projections (c_attn = attnlab's q, k and v projections stacked, c_proj = its out_proj) and
the head have none; the head is a separate matrix, not tied to the token embedding. Where this
differs from nanoGPT's own model code (on purpose, to match attnlab):
  - GELU is the tanh approximation (attnlab's); nanoGPT's nn.GELU() is the exact erf form.
  - lm_head is untied; nanoGPT ties it to wte (one V x C matrix fewer to update, same FLOPs).
  - the attention projections have no bias; nanoGPT's default bias=True gives them one (and the
    LayerNorms always have one here, as attnlab's).
  - lm_head runs on every position (attnlab's step trains on all T targets; nanoGPT's training
    forward does the same, only its inference path slices the last position).
  - the optimizer is the caller's (torch_train.py: attnlab's single AdamW group, so that norms,
    biases and embeddings decay too; nanoGPT decays the 2-D weights only).
What remains different from attnlab_torch.Transformer in the computation: the fused qkv GEMM (one
C x 3C instead of three C x C), SDPA's fused kernel instead of explicit softmax(QK^T)V, and
nanoGPT's initialization (N(0, 0.02), c_proj's N(0, 0.02 / sqrt(2 L)), zero biases) unless
load_attnlab() copies an attnlab model's weights in.
"""
import math

import torch
from torch import nn
from torch.nn import functional as F

LAYERNORM_EPS = 1e-5


class CausalSelfAttention(nn.Module):
    def __init__(self, C, H, dropout):
        super().__init__()
        self.H, self.dropout = H, dropout
        self.c_attn = nn.Linear(C, 3 * C, bias=False)
        self.c_proj = nn.Linear(C, C, bias=False)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.H, C // self.H).transpose(1, 2)
        k = k.view(B, T, self.H, C // self.H).transpose(1, 2)
        v = v.view(B, T, self.H, C // self.H).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, C, d_ff, dropout):
        super().__init__()
        self.c_fc = nn.Linear(C, d_ff)
        self.c_proj = nn.Linear(d_ff, C)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, C, H, d_ff, attn_dropout, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=LAYERNORM_EPS)
        self.attn = CausalSelfAttention(C, H, attn_dropout)
        self.ln_2 = nn.LayerNorm(C, eps=LAYERNORM_EPS)
        self.mlp = MLP(C, d_ff, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT(model): model is attnlab's resolved "model" config (vocab_sizes, out_vocab, max_len set);
    only what this architecture can express is accepted (ValueError otherwise)."""

    def __init__(self, model):
        super().__init__()
        block = model["block"]
        att = block["attention"]
        sdpa = att.get("sdpa", {})
        C, H = att["d_model"], att["heads"]
        unsupported = [name for name, bad in [
            ("one input field", len(model["vocab_sizes"]) != 1),
            ("out_vocab == vocab", model["out_vocab"] != model["vocab_sizes"][0]),
            ("positions learned", model.get("positions", "learned") != "learned"),
            ("norm layernorm", block.get("norm", "layernorm") != "layernorm"),
            ("an MLP (attn_only false)", block.get("attn_only", False)),
            ("d_k = d_v = d_model / heads", (att.get("d_k", 0) or C // H) != C // H
             or (att.get("d_v", 0) or C // H) != C // H or C % H),
            ("kv_heads = heads", (att.get("kv_heads", 0) or H) != H),
            ("causal attention without a window", not sdpa.get("causal", False) or sdpa.get("window", 0)),
            ("scaling sqrt_dk", sdpa.get("scaling", "sqrt_dk") != "sqrt_dk" or sdpa.get("scale") is not None),
            ("no qk_norm, learnable_scale, alibi or rope", any(att.get(k, False) for k in
                                                               ("qk_norm", "learnable_scale", "alibi", "rope"))),
            ("no logit_softcap", model.get("logit_softcap", 0) or 0),
        ] if bad]
        if unsupported:
            raise ValueError("nanogpt_torch: the config needs what this model lacks: " + ", ".join(unsupported))
        V, T, L = model["vocab_sizes"][0], int(model["max_len"]), int(model["layers"])
        d_ff = block.get("d_ff", 0) or 4 * C
        dropout = float(block.get("dropout", 0.0))
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(C, H, d_ff, float(att.get("dropout", 0.0)), dropout) for _ in range(L))
        self.ln_f = nn.LayerNorm(C, eps=LAYERNORM_EPS)
        self.lm_head = nn.Linear(C, model["out_vocab"], bias=False)
        # nanoGPT's initialization
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * L))
            elif p.dim() == 2:
                nn.init.normal_(p, mean=0.0, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    @torch.no_grad()
    def load_attnlab(self, other):
        """Copies the weights of an attnlab_torch.Transformer of the same config."""
        self.wte.weight.copy_(other.embed.fields[0].weight)
        self.wpe.weight.copy_(other.pos.weight)
        for mine, theirs in zip(self.h, other.blocks):
            a = theirs.attn
            mine.ln_1.load_state_dict(theirs.ln1.state_dict())
            mine.attn.c_attn.weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], 0))
            mine.attn.c_proj.weight.copy_(a.out_proj.weight)
            mine.ln_2.load_state_dict(theirs.ln2.state_dict())
            mine.mlp.c_fc.load_state_dict(theirs.mlp.fc1.state_dict())
            mine.mlp.c_proj.load_state_dict(theirs.mlp.fc2.state_dict())
        self.ln_f.load_state_dict(other.ln_f.state_dict())
        self.lm_head.weight.copy_(other.head.weight)
        return self
