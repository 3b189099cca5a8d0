#!/usr/bin/env python3
"""Writes the committed seed corpora of the fuzz targets (tests/fuzz/corpus/*).

Valid files come from the Python `safetensors` package (an independent writer); a few hostile ones
are made by hand. Run from the repository root: python3 tests/fuzz/make_seeds.py
"""
import json
import os
import struct

import numpy as np
from safetensors.numpy import save

HERE = os.path.dirname(os.path.abspath(__file__))


def raw(header, data=b"", length=None):
    text = json.dumps(header, separators=(",", ":")).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def write(kind, name, blob):
    d = os.path.join(HERE, "corpus", kind)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(blob)


def checkpoint(params, optim=None, meta=None, dtype=np.float32):
    tensors = {k: np.asarray(v, dtype=dtype) for k, v in params.items()}
    for k, v in (optim or {}).items():
        tensors["optim." + k] = np.asarray(v, dtype=dtype)
    md = {"format_version": "attnlab-1", "dtype": "F32" if dtype == np.float32 else "F64",
          "model_config": '{"layers":1}', "step": "3", "rng_state": "1 2 0 0"}
    md.update(meta or {})
    return save(tensors, metadata=md)


def main():
    w = np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5
    b = np.array([1, -2, 3.5, -4], dtype=np.float32)
    # safetensors reader
    write("safetensors", "all_dtypes", save({
        "f32": w, "f64": b.astype(np.float64), "i64": np.array([7, -9], dtype=np.int64),
        "i32": np.array([[1, -2]], dtype=np.int32), "u8": np.array([0, 255], dtype=np.uint8),
        "bool": np.array([True, False]), "scalar": np.array(2.0, dtype=np.float64),
        "empty": np.zeros((0, 3), dtype=np.float32)}, metadata={"format": "pt", "note": "seed"}))
    write("safetensors", "metadata_only", raw({"__metadata__": {"a": "b"}}))
    write("safetensors", "one_tensor", raw({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
                                           struct.pack("<2f", 1.0, -2.0)))
    write("safetensors", "overlap", raw({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                                         "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}},
                                        bytes(6)))
    write("safetensors", "huge_shape", raw({"a": {"dtype": "F64", "shape": [4294967296, 4294967296],
                                                  "data_offsets": [0, 8]}}, bytes(8)))
    write("safetensors", "length_too_big", raw({"a": 1}, length=1 << 40))
    write("safetensors", "truncated", save({"w": w})[:-7])
    # checkpoint reader: the fuzz target's model has layer.w (3, 4) and layer.b (4,), float
    write("checkpoint", "valid", checkpoint({"layer.w": w, "layer.b": b}))
    write("checkpoint", "valid_optim", checkpoint({"layer.w": w, "layer.b": b},
                                                  optim={"layer.w.exp_avg": w * 0.1, "layer.w.exp_avg_sq": w * w}))
    write("checkpoint", "wrong_shape", checkpoint({"layer.w": w.T.copy(), "layer.b": b}))
    write("checkpoint", "double", checkpoint({"layer.w": w, "layer.b": b}, dtype=np.float64))
    write("checkpoint", "nan", checkpoint({"layer.w": w, "layer.b": np.array([0, np.nan, 0, 0])}))
    write("checkpoint", "bad_version", checkpoint({"layer.w": w, "layer.b": b},
                                                  meta={"format_version": "attnlab-0"}))
    write("checkpoint", "extra", checkpoint({"layer.w": w, "layer.b": b, "stray": [1.0]}))


if __name__ == "__main__":
    main()
