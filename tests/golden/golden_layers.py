"""The layer and optimizer goldens of make_goldens.py: SwiGLU, softmax, AdamW and SGD, Muon, the
elementwise and norm layers, cross-entropy with z-loss, and the safetensors interop file."""

import json
import math
import os

import numpy as np
import torch
import torch.nn.functional as F

from golden_common import (
    DT,
    INTEROP_DIR,
    ROOT,
    case,
    close,
    gen,
    grads_of,
    randn,
)


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


# --------------------------------------------------------------------------
# softmax over the last dim
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
# optimizers
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
# cross-entropy
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
# safetensors interop file
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
