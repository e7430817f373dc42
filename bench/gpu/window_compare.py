"""Comparisons of bench/gpu/window.sh, with numpy alone (the lent machine has no other package).

  window_compare.py group GROUP_DIR SINGLE_0 SINGLE_1   batched runs against their single runs
  window_compare.py codes A.npz B.npz                   latent codes of two devices
"""
import glob
import json
import os
import struct
import sys

import numpy as np


def safetensors(path):
    """The float32 tensors of a .safetensors file, by name."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=np.float32).reshape(t["shape"])
    return out


def losses(run):
    """The train_loss column of a run's metrics.csv."""
    rows = np.genfromtxt(os.path.join(run, "metrics.csv"), delimiter=",", names=True)
    return np.atleast_1d(rows["train_loss"])


def rel(a, b):
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-6)))


def group(gdir, *singles):
    runs = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(gdir, "**", "train.json"), recursive=True))
    if len(runs) != len(singles):
        print(f"group: {len(runs)} runs in {gdir}, {len(singles)} single runs: not compared")
        return
    for run, single in zip(runs, singles):
        wl = rel(losses(run), losses(single))
        a, b = safetensors(os.path.join(run, "model.safetensors")), safetensors(os.path.join(single, "model.safetensors"))
        ww = max(float(np.max(np.abs(a[k] - b[k]))) / max(float(np.max(np.abs(b[k]))), 1e-12) for k in b)
        print(f"group vs single ({os.path.basename(run)}): losses max rel diff {wl:.2e}, weights max rel diff {ww:.2e}")


def codes(a, b):
    x, y = np.load(a), np.load(b)
    cx, cy = x["codes"], y["codes"]
    same = all(np.array_equal(x[k], y[k]) for k in x.files if k != "codes")
    d = float(np.max(np.abs(cx - cy)))
    print(f"codes {cx.shape}: max abs diff {d:.2e} (max |code| {float(np.max(np.abs(cy))):.2f}); other arrays identical: {same}")


if __name__ == "__main__":
    {"group": group, "codes": codes}[sys.argv[1]](*sys.argv[2:])
