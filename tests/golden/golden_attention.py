"""The attention goldens of make_goldens.py: scaled dot-product attention and its variants
(GQA, window, ALiBi, bias, softcap, dropout), attention programs against FlexAttention, multi-head
attention and RoPE."""

import math

import torch
import torch.nn.functional as F

from golden_common import (
    DT,
    attention_tensors,
    case,
    close,
    effective_scale,
    gen,
    masked_attention,
    masked_softmax,
    randn,
    visibility,
)


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
        tensors = attention_tensors(q, k, v, r, mask, out, p, dq, dk, dv_)
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
        tensors = attention_tensors(q, k, v, r, mask, out, p, dq, dk, dv_)
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
        tensors = attention_tensors(q, k, v, r, mask, out, p, dq, dk, dv_)
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
        tensors = attention_tensors(q, k, v, r, mask, out, p, dq, dk, dv_)
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
# multi-head attention and the pre-LN transformer block
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
