#!/usr/bin/env python3
"""The silhouette of hyperlens and of scikit-learn on the SAME points.

`hyperlens analyze` scores the silhouette on a seeded subsample drawn with ChaCha8, and
scikit-learn's counterpart (sk_analyze.py) on one drawn by numpy, so compare.py's agreement table
compares two different samples. This script removes that difference: it draws M rows of a code
file with numpy, writes them as a code file of their own, runs `hyperlens analyze` on it with
`--silhouette-points M` (so hyperlens takes every row, no subsample), and computes scikit-learn's
`silhouette_score` of the labels on the same rows, per layer and for all layers.

    python bench/compare/silhouette_check.py --codes work/hyla_ood_codes.npz --points 10000 \
        --hyperlens target/release/hyperlens --out /tmp/silcheck

Prints one line per layer with both scores and their difference, and exits 1 if any differs by
more than --tol (default 1e-4, the issue's bound).
"""
import argparse
import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
from sklearn.metrics import silhouette_score


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--codes", required=True, help="a code file written by hyperlens probe")
    p.add_argument("--points", type=int, default=10000, help="rows drawn (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="numpy seed of the draw")
    p.add_argument("--hyperlens", default="target/release/hyperlens", help="the hyperlens binary")
    p.add_argument("--out", required=True, help="work directory")
    p.add_argument("--tol", type=float, default=1e-4)
    args = p.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with np.load(args.codes) as z:
        arrays = {k: np.asarray(z[k]) for k in z.files}
    n = arrays["codes"].shape[0]
    if args.points > n:
        sys.exit(f"error: --points {args.points} is more than the {n} rows of {args.codes}")
    rows = np.sort(np.random.default_rng(args.seed).choice(n, size=args.points, replace=False))
    subset = out / "subset_codes.npz"
    np.savez(subset, **{k: v[rows] if v.ndim and v.shape[0] == n else v for k, v in arrays.items()})

    tables = out / "hyperlens"
    subprocess.run([args.hyperlens, "analyze", "--train", str(subset), "--test", str(subset),
                    "--out", str(tables), "--silhouette-points", str(args.points),
                    "--no-shuffled-control", "--quiet"], check=True, stdout=subprocess.DEVNULL)
    with open(tables / "clusters.csv") as f:
        ours = {r["layer"]: (float(r["silhouette"]), int(r["silhouette_points"])) for r in csv.DictReader(f)}

    codes = arrays["codes"][rows]
    labels = arrays["label"][rows]
    worst = 0.0
    print(f"{'layer':>6} {'hyperlens':>12} {'scikit-learn':>13} {'|difference|':>13}  (same {args.points} points)")
    for layer in list(range(codes.shape[1])) + [None]:
        sel = codes if layer is None else codes[:, layer]
        x = np.ascontiguousarray(sel.reshape(len(rows), -1), dtype=np.float64)
        theirs = float(silhouette_score(x, labels, metric="euclidean"))
        key = "-1" if layer is None else str(layer)
        mine, used = ours[key]
        if used != args.points:
            sys.exit(f"error: hyperlens used {used} points, not {args.points}")
        diff = abs(mine - theirs)
        worst = max(worst, diff)
        print(f"{'all' if layer is None else layer:>6} {mine:12.8f} {theirs:13.8f} {diff:13.2e}")
    print(f"largest difference {worst:.2e} (tolerance {args.tol:g})")
    sys.exit(0 if worst <= args.tol else 1)


if __name__ == "__main__":
    main()
