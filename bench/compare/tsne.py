#!/usr/bin/env python3
"""t-SNE of many codes: hyperlens against openTSNE and scikit-learn's Barnes-Hut, in one
interleaved run.

Tools, on the same float64 array in one process, all perplexity 30 and --iter iterations in all
(the first 250 with early exaggeration 12):

- hyperlens: `hl.analysis.tsne(x, 30, theta=0, max_iter=--iter, seed)`, the deterministic t-SNE
  (`embed::tsne`: above 2,000 points the FFT-interpolated form, `embed::tsne_interpolated`),
  on rayon's threads (all cores);
- openTSNE: `openTSNE.TSNE(perplexity=30, early_exaggeration_iter=250, n_iter=--iter - 250,
  n_jobs=--jobs)` with its other defaults (FFT gradients, Annoy neighbours, PCA initialisation);
- scikit-learn: `sklearn.manifold.TSNE(perplexity=30, max_iter=--iter, method="barnes_hut",
  init="random", n_jobs=--jobs)` (its default method, angle 0.5). It is the slow one: with
  --sklearn-once it runs in the first repeat only.

Data: `wide`, random codes [--n, 270] (SmolLM2's 30 layers x 9 heads) around 12 planted
centres with overlapping noise; or with --codes FILE.npy any float array [N, D]; or with
--codes FILE.npz the `codes` [N, L, H, Q, K] of a `hyperlens probe` file (SRAVEN codes, the files
`compare.py --parts analyze` writes), flattened to [N, L*H*Q*K]; of a file, the first --n rows.

Trustworthiness (k = 5; scikit-learn's `trustworthiness`, which holds an N x N distance matrix)
is measured on a fixed seeded subsample of --trust-points points of the data and of each
embedding, the same indices for every tool.

Every repeat runs the tools in rotated order; the table gives the median seconds, the ratios
tool / hyperlens (> 1: hyperlens is faster) and the trustworthiness. Example (the numbers in the
report were measured so):

    python bench/compare/tsne.py --n 50000 --iter 750 --repeats 1 --out /tmp/tsne.json
"""
import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np

TOOLS = ("hyperlens", "openTSNE", "sklearn")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=50_000, help="codes of the wide set")
    p.add_argument("--d", type=int, default=270, help="features of the wide set")
    p.add_argument("--codes", type=Path, help="a float array [N, D] (.npy) instead of the wide set")
    p.add_argument("--iter", type=int, default=750, help="iterations in all (250 exaggerated)")
    p.add_argument("--jobs", type=int, default=2, help="n_jobs of openTSNE and scikit-learn")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--tools", default=",".join(TOOLS))
    p.add_argument("--sklearn-once", action="store_true", help="scikit-learn in the first repeat only")
    p.add_argument("--trust-points", type=int, default=5_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    return p.parse_args()


def wide(n, d, seed):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=0.6, size=(12, d))
    rules = rng.integers(0, 12, size=n)
    return (centres[rules] + rng.normal(size=(n, d))).astype(np.float32).astype(np.float64)


def run(tool, x, args):
    if tool == "hyperlens":
        import hyperlens as hl

        return hl.analysis.tsne(x, 30.0, theta=0.0, max_iter=args.iter, seed=args.seed)
    if tool == "openTSNE":
        import openTSNE

        return np.asarray(openTSNE.TSNE(perplexity=30, early_exaggeration_iter=250, n_iter=args.iter - 250,
                                        n_jobs=args.jobs, random_state=args.seed).fit(x))
    from sklearn.manifold import TSNE

    return TSNE(perplexity=30.0, max_iter=args.iter, method="barnes_hut", init="random",
                n_jobs=args.jobs, random_state=args.seed).fit_transform(x)


def machine():
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = ""
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "commit": commit}


def main():
    args = parse_args()
    from sklearn.manifold import trustworthiness
    import openTSNE
    import sklearn

    if args.codes is None:
        x = wide(args.n, args.d, args.seed)
    elif args.codes.suffix == ".npz":
        codes = np.load(args.codes)["codes"]
        x = codes.reshape(codes.shape[0], -1)[:args.n].astype(np.float64)
    else:
        x = np.load(args.codes)[:args.n].astype(np.float64)
    x = np.ascontiguousarray(x)
    sub = np.sort(np.random.default_rng(args.seed + 1).choice(len(x), size=min(args.trust_points, len(x)),
                                                              replace=False))
    tools = [t for t in args.tools.split(",") if t]
    times = {t: [] for t in tools}
    trust = {}
    for r in range(args.repeats):
        order = tools[r % len(tools):] + tools[:r % len(tools)]
        for tool in order:
            if tool == "sklearn" and args.sklearn_once and times[tool]:
                continue
            t0 = time.perf_counter()
            emb = run(tool, x, args)
            dt = time.perf_counter() - t0
            times[tool].append(dt)
            trust.setdefault(tool, float(trustworthiness(x[sub], emb[sub], n_neighbors=5)))
            print(f"repeat {r} {tool:9s} {dt:8.2f} s  trustworthiness {trust[tool]:.4f}", flush=True)

    med = {t: float(np.median(v)) for t, v in times.items() if v}
    name = args.codes.name if args.codes else "wide"
    print(f"\nt-SNE of {x.shape[0]} x {x.shape[1]} codes ({name}), perplexity 30, {args.iter} iterations "
          f"(openTSNE {openTSNE.__version__}, scikit-learn {sklearn.__version__}, n_jobs {args.jobs})")
    print(f"{'tool':10s} {'seconds':>9s} {'tool/hyperlens':>15s} {'trust(k=5)':>11s}")
    for t in tools:
        if t in med:
            ratio = med[t] / med["hyperlens"] if "hyperlens" in med else float("nan")
            print(f"{t:10s} {med[t]:9.2f} {ratio:15.2f} {trust[t]:11.4f}")
    if args.out:
        args.out.write_text(json.dumps({"codes": name, "n": int(x.shape[0]), "d": int(x.shape[1]), "iter": args.iter,
                                        "jobs": args.jobs, "seconds": times, "median": med,
                                        "trustworthiness_k5": trust, "trust_points": int(len(sub)),
                                        "machine": machine()}, indent=2))


if __name__ == "__main__":
    main()
