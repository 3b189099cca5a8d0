"""PyTorch interop (python/attnlab_torch.py) against the attnlab CLI.

Usage: test_attnlab_torch.py ATTNLAB_CLI   (run by CTest through run_torch_tests.sh)

1. attnlab -> PyTorch: for configurations that together use every model option, train a few steps
   with `attnlab train`, load the checkpoint into the PyTorch module and compare its logits with
   those `attnlab eval --logits` wrote for the same batch (<= 1e-5 relative, float).
2. PyTorch -> attnlab: a module initialised in PyTorch (every parameter randomised, so a swapped or
   untransposed name shows), exported, then evaluated by `attnlab eval`: logits and loss agree.
3. The PyTorch-layout file ({"format": "pt"}) round trip, through the script's command line, gives
   bit-identical attnlab logits; the `safetensors` package, when importable, reads it too.
4. A checkpoint whose tensors do not match its config is refused with a clear error.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import attnlab_torch as at  # noqa: E402

CLI = None
TOL = 1e-5

# Each entry: (name, task flags, model flags). Together they cover every TransformerConfig option.
CASES = [
    ("recall: two fields with absent ones, learned positions, LayerNorm, 1/sqrt(d_k)",
     ["--task", "recall", "--pairs", "6", "--keys", "16", "--values", "16"],
     ["--d-model", "32", "--heads", "2", "--layers", "2"]),
    ("recall: causal, GQA 4/2, d_k 12, d_v 6, QK-norm, learnable scale, RMSNorm, window, 1/d_k, "
     "sinusoidal positions",
     ["--task", "recall", "--pairs", "9", "--keys", "12", "--values", "10"],
     ["--d-model", "24", "--heads", "4", "--kv-heads", "2", "--d-k", "12", "--d-v", "6",
      "--qk-norm", "--learnable-scale", "--norm", "rmsnorm", "--causal", "--window", "4",
      "--scaling", "dk", "--layers", "2", "--d-ff", "40", "--positions", "sinusoidal"]),
    ("reverse: ALiBi without positions, multi-query, attention-only, no norm, explicit scale, "
     "dropout in training",
     ["--task", "reverse", "--length", "9", "--symbols", "10"],
     ["--d-model", "16", "--heads", "4", "--kv-heads", "1", "--alibi", "--positions", "none",
      "--attn-only", "--norm", "none", "--scale", "0.4", "--layers", "3",
      "--attn-dropout", "0.1", "--dropout", "0.1"]),
    ("mqar: causal ALiBi with learned positions, unscaled, output logits capped at 1.5",
     ["--task", "mqar", "--pairs", "4", "--queries", "3", "--keys", "8", "--values", "8"],
     ["--d-model", "16", "--heads", "2", "--causal", "--alibi", "--scaling", "none",
      "--logit-softcap", "1.5"]),
    ("recall: causal RoPE after QK-norm, partial (half of d_k 8), interleaved, base 500",
     ["--task", "recall", "--pairs", "6", "--keys", "12", "--values", "12"],
     ["--d-model", "16", "--heads", "2", "--causal", "--qk-norm", "--positions", "rope",
      "--rope-theta", "500", "--rope-fraction", "0.5", "--rope-interleaved"]),
    ("recall: ReLU² MLP, RMSNorm, causal",
     ["--task", "recall", "--pairs", "6", "--keys", "12", "--values", "12"],
     ["--d-model", "16", "--heads", "2", "--causal", "--mlp", "relu2", "--norm", "rmsnorm"]),
    ("mqar: causal RoPE, half-split pairs, multi-query",
     ["--task", "mqar", "--pairs", "4", "--queries", "3", "--keys", "8", "--values", "8"],
     ["--d-model", "16", "--heads", "4", "--kv-heads", "1", "--causal", "--positions", "rope"]),
    ("recall: no biases (the MLP's and the LayerNorms' beta), causal, 2 layers",
     ["--task", "recall", "--pairs", "6", "--keys", "12", "--values", "12"],
     ["--d-model", "16", "--heads", "2", "--causal", "--no-bias", "--layers", "2"]),
    ("recall: SwiGLU MLP at its default width, no biases, RMSNorm, causal",
     ["--task", "recall", "--pairs", "6", "--keys", "12", "--values", "12"],
     ["--d-model", "16", "--heads", "2", "--causal", "--mlp", "swiglu", "--no-bias",
      "--norm", "rmsnorm"]),
    ("mqar: attention scores capped at 0.8 with a large scale, ALiBi, learnable scale, causal",
     ["--task", "mqar", "--pairs", "4", "--queries", "3", "--keys", "8", "--values", "8"],
     ["--d-model", "16", "--heads", "2", "--causal", "--attn-softcap", "0.8", "--scale", "3",
      "--alibi", "--positions", "none", "--learnable-scale"]),
    ("mqar: tied embedding and head (lm_head.weight = wte.weight), causal, 2 layers",
     ["--task", "mqar", "--pairs", "4", "--queries", "3", "--keys", "8", "--values", "8"],
     ["--d-model", "16", "--heads", "2", "--causal", "--tie-embeddings", "--layers", "2"]),
]


def run(*args):
    r = subprocess.run([CLI, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"attnlab {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def read_data_file(path):
    """attnlab's data-file format (data/README.md) -> (fields: [LongTensor (N, T)], targets (N, T))."""
    rows, targets = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            left, right = line.split("|")
            rows.append([[-1 if x == "_" else int(x) for x in pos.split(":")] for pos in left.split()])
            targets.append([-1 if x == "_" else int(x) for x in right.split()])
    ids = torch.tensor(rows, dtype=torch.long)  # (N, T, fields)
    return [ids[:, :, i] for i in range(ids.shape[2])], torch.tensor(targets, dtype=torch.long)


def eval_logits(run_dir, valid, work):
    out = os.path.join(work, "logits.safetensors")
    text = run("eval", "--checkpoint", run_dir, "--valid", valid, "--logits", out, "--show", "0")
    tensors, meta = at.read_safetensors(out)
    assert meta.get("format") == "pt", meta
    loss = float(text.split("loss ")[1].split()[0])
    return tensors["logits"], loss


def mean_loss(logits, targets):
    """Cross-entropy over the labelled positions (-1: unlabelled), as attnlab eval reports it."""
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1).item()


def relative_error(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1.0)).item()


class Interop(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.work = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def train_case(self, task, model, steps=4):
        run_dir = os.path.join(self.work, "run")
        run("train", *task, *model, "--steps", str(steps), "--batch", "8", "--lr", "0.01",
            "--eval-size", "8", "--eval-every", "2", "--out", run_dir, "--quiet", "--seed", "3")
        data = os.path.join(self.work, "data")
        run("make-data", *task, "--out", data, "--train-size", "4", "--valid-size", "12")
        kind = task[task.index("--task") + 1]
        return run_dir, os.path.join(data, kind, "valid.txt")

    def test_attnlab_to_torch_logits_match(self):
        for name, task, model in CASES:
            with self.subTest(name):
                run_dir, valid = self.train_case(task, model)
                ref, loss = eval_logits(run_dir, valid, self.work)
                fields, targets = read_data_file(valid)
                for dtype in (torch.float32, torch.float64):
                    module, config = at.load_run(run_dir, dtype=dtype)
                    self.assertFalse(module.training)
                    with torch.no_grad():
                        got = module(fields)
                    self.assertEqual(tuple(got.shape), tuple(ref.shape))
                    err = relative_error(got, ref)
                    print(f"\n  {name} [{dtype}]: max |logit difference| / max |logit| = {err:.2e}")
                    self.assertLessEqual(err, TOL, f"{name}, {dtype}: relative error {err:.3g}")
                self.assertAlmostEqual(mean_loss(got, targets), loss, delta=1.5e-4)
                # the module really used the options: its config is the run's
                self.assertEqual(module.config, config["model"])

    def test_torch_to_attnlab_eval(self):
        for name, task, model in CASES[1:3] + CASES[-2:]:
            with self.subTest(name):
                run_dir, valid = self.train_case(task, model, steps=1)
                _, config = at.load_run(run_dir)
                torch.manual_seed(7)
                module = at.Transformer(config["model"])
                with torch.no_grad():  # every parameter moved off its init, norms included
                    for p in module.parameters():
                        p.add_(0.3 * torch.randn_like(p))
                module.eval()
                if module.tie_embeddings:  # one Parameter under two names, moved once
                    self.assertIs(module.head.weight, module.embed.fields[0].weight)
                out = os.path.join(self.work, "from_torch")
                run_config = {k: v for k, v in config.items() if k in ("task", "seed")}
                at.export_run(module, out, run_config)
                ref, loss = eval_logits(out, valid, self.work)
                fields, targets = read_data_file(valid)
                with torch.no_grad():
                    got = module(fields)
                err = relative_error(ref, got)
                print(f"\n  exported {name}: max |logit difference| / max |logit| = {err:.2e}")
                self.assertLessEqual(err, TOL, f"{name}: relative error {err:.3g}")
                self.assertAlmostEqual(mean_loss(got, targets), loss, delta=1.5e-4)
                # weights only: attnlab refuses to resume it
                r = subprocess.run([CLI, "train", "--resume", out, "--steps", "2", "--quiet"],
                                   capture_output=True, text=True)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn("weights only", r.stderr)

    def test_pt_layout_round_trip_through_the_command_line(self):
        name, task, model = CASES[1]
        run_dir, valid = self.train_case(task, model)
        before, _ = eval_logits(run_dir, valid, self.work)
        script = os.path.join(HERE, "..", "..", "python", "attnlab_torch.py")
        pt = os.path.join(self.work, "model_pt.safetensors")
        back = os.path.join(self.work, "back")
        subprocess.run([sys.executable, script, "to-torch", run_dir, pt], check=True)
        tensors, meta = at.read_safetensors(pt)
        self.assertEqual(meta["format"], "pt")
        # PyTorch layout: Linear weights are (out, in)
        C = 24
        self.assertEqual(tuple(tensors["blocks.0.attn.q_proj.weight"].shape), (4 * 12, C))
        self.assertEqual(tuple(tensors["blocks.0.attn.out_proj.weight"].shape), (C, 4 * 6))
        subprocess.run([sys.executable, script, "from-torch", pt, back, "--run-config",
                        os.path.join(run_dir, "config.json")], check=True)
        after, _ = eval_logits(back, valid, self.work)
        self.assertTrue(torch.equal(before, after), "the round trip changed the logits")
        try:
            from safetensors.torch import load_file
        except ImportError:
            print("note: the safetensors package is absent; its reading of the file is not checked")
        else:
            theirs = load_file(pt)
            self.assertEqual(theirs.keys(), tensors.keys())
            for k in tensors:
                self.assertTrue(torch.equal(theirs[k], tensors[k]), k)

    def test_mismatched_checkpoint_is_refused(self):
        name, task, model = CASES[0]
        run_dir, _ = self.train_case(task, model, steps=1)
        tensors, meta = at.read_safetensors(os.path.join(run_dir, "model.safetensors"))
        config = json.loads(meta["model_config"])
        config["model"]["layers"] = 3
        meta["model_config"] = json.dumps(config)
        bad = os.path.join(self.work, "bad.safetensors")
        at.write_safetensors(bad, tensors, meta)
        with self.assertRaisesRegex(ValueError, r"missing \['blocks\.2\."):
            at.load_run(bad)
        r = subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "python", "attnlab_torch.py"),
                            "to-torch", bad, os.path.join(self.work, "x.safetensors")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("do not match the config", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.work, "x.safetensors")))

    def test_tied_and_untied_checkpoints_are_not_interchangeable(self):
        name, task, model = CASES[-1]
        run_dir, _ = self.train_case(task, model, steps=1)
        tensors, meta = at.read_safetensors(os.path.join(run_dir, "model.safetensors"))
        self.assertNotIn("head.w", tensors)
        module, _ = at.load_run(run_dir)
        self.assertIs(module.head.weight, module.embed.fields[0].weight)
        config = json.loads(meta["model_config"])
        config["model"]["tie_embeddings"] = False
        untied_meta = dict(meta, model_config=json.dumps(config))
        bad = os.path.join(self.work, "untied.safetensors")
        at.write_safetensors(bad, tensors, untied_meta)
        with self.assertRaisesRegex(ValueError, r"missing \['head\.weight'\]"):
            at.load_run(bad)
        tensors["head.w"] = tensors["embed.fields.0.table"].t().contiguous()
        bad = os.path.join(self.work, "extra.safetensors")
        at.write_safetensors(bad, tensors, meta)
        with self.assertRaisesRegex(ValueError, r"unexpected \['head\.w'\]"):
            at.load_run(bad)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_attnlab_torch.py ATTNLAB_CLI")
    CLI = os.path.abspath(sys.argv.pop(1))
    print(f"torch {torch.__version__} from {torch.__file__}")
    unittest.main(verbosity=2)
