#!/usr/bin/env python3
"""The stages of `hyperlens analyze` one by one against scikit-learn, in one interleaved run.

Stages, on the same float64 arrays for both tools, in one process (hyperlens through its Python
package `hyperlens.analysis`, which calls the same library functions as `hyperlens analyze`):

- pca: `hl.analysis.pca(x, 2)` vs `PCA(svd_solver="full").fit(x)` + the projection on 2 components;
- decoding: `hl.analysis.decode(train, test, c=1, max_iter, tol=1e-4, shuffled_control=True)` vs
  `sk_analyze.decode` (StandardScaler + multinomial LogisticRegression(lbfgs), plus the
  shuffled-label control);
- kmeans: `hl.analysis.kmeans(x, k, n_init=10)` vs `KMeans(k, n_init=10, algorithm="lloyd")`,
  k = number of rules;
- silhouettes: the silhouette of the rules and of the k-means clusters on one seeded subsample of
  --silhouette-points codes (the same indices and labels for both tools);
- tsne: a 2-D t-SNE of --tsne-points codes, perplexity 30, --tsne-iter iterations:
  hyperlens's deterministic t-SNE (theta 0: exact up to 2,000 codes, FFT-interpolated above) vs
  scikit-learn's Barnes-Hut (its default method). t-SNE of many codes against openTSNE too:
  bench/compare/tsne.py.

Data sets (each with N ID codes for training the probe and N OOD codes for the rest):
- `wide`: random codes [N, 270] (SmolLM2's 30 layers x 9 heads) with 8 planted rules;
- `sraven`: the all-layer codes of two `hyperlens probe` files (--sraven-id, --sraven-ood; the
  files `compare.py --parts analyze` writes), flattened to [N, L*H*Q*K].

Every repeat runs every (data set, stage) with the tools in rotated order; the table gives the
medians and the ratio scikit-learn / hyperlens (> 1: hyperlens is faster), and the agreement
(inertia per point, ARI / NMI against the rules, silhouettes). Example:

    python bench/compare/stages.py --n 20000 --repeats 3 --out /tmp/stages.json
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import sklearn
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA
from sklearn.manifold import TSNE
from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score, silhouette_score

import hyperlens as hl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import sk_analyze  # noqa: E402  (the scikit-learn decoding pipeline of compare.py)

STAGES = ("pca", "decoding", "kmeans", "silhouettes", "tsne")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=20000, help="codes per set (ID and OOD) of the wide data")
    p.add_argument("--dims", type=int, default=270, help="features of the wide data")
    p.add_argument("--rules", type=int, default=8)
    p.add_argument("--sraven-id", help="ID codes .npz from hyperlens probe (optional)")
    p.add_argument("--sraven-ood", help="OOD codes .npz from hyperlens probe (optional)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-iter", type=int, default=1000, help="logistic regression iterations")
    p.add_argument("--kmeans-n-init", type=int, default=10)
    p.add_argument("--silhouette-points", type=int, default=10000)
    p.add_argument("--tsne-points", type=int, default=1000)
    p.add_argument("--tsne-iter", type=int, default=1000)
    p.add_argument("--stages", default=",".join(STAGES))
    p.add_argument("--analyze-memory", metavar="BIN",
                   help="also run `BIN analyze` on --memory-n planted wide codes ([N, 30, 9, 1, 1]) and report its "
                        "wall time and peak resident memory (the child's ru_maxrss)")
    p.add_argument("--memory-n", type=int, default=100000)
    p.add_argument("--out", help="results (.json)")
    return p.parse_args()


def wide_codes(n, d, rules, seed):
    """ID and OOD codes [n, d] around `rules` random centres, float64, the same centres for both."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=0.2, size=(rules, d))
    offset = rng.normal(size=d)

    def draw():
        y = rng.integers(0, rules, size=n)
        return centres[y] + rng.normal(size=(n, d)) + offset, y.astype(np.int64)

    return draw(), draw()


def sraven_codes(path_id, path_ood):
    out = []
    for path in (path_id, path_ood):
        codes, y = sk_analyze.load(path)
        out.append((sk_analyze.features(codes, None), y))
    return out


def subsample(n, m, seed):
    if n <= m:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=m, replace=False))


def tools_for(stage, data, args, shared):
    """{tool: callable} for one stage; the callables return a result dict (agreement figures)."""
    (x_tr, y_tr), (x_te, y_te) = data
    k = len(np.unique(y_te))
    sil_idx = subsample(len(x_te), args.silhouette_points, args.seed)
    tsne_idx = subsample(len(x_te), args.tsne_points, args.seed)
    if stage == "pca":
        def hyperlens():
            r = hl.analysis.pca(x_te, 2)
            return {"ratio0": float(r.explained_variance_ratio[0])}

        def scikit():
            p = PCA(svd_solver="full").fit(x_te)
            p.transform(x_te)[:, :2]
            return {"ratio0": float(p.explained_variance_ratio_[0])}
    elif stage == "decoding":
        def hyperlens():
            r = hl.analysis.decode(x_tr, y_tr, x_te, y_te, 1.0, max_iter=args.max_iter, tol=1e-4,
                                   shuffled_control=True, seed=args.seed)
            return {"accuracy": float(r.accuracy)}

        ns = argparse.Namespace(c=1.0, tol=1e-4, max_iter=args.max_iter, seed=args.seed)

        def scikit():
            return {"accuracy": sk_analyze.decode(x_tr, y_tr, x_te, y_te, ns)["accuracy"]}
    elif stage == "kmeans":
        def hyperlens():
            r = hl.analysis.kmeans(x_te, k, n_init=args.kmeans_n_init, seed=args.seed, max_iter=300, tol=1e-4)
            shared["hyperlens_labels"] = np.asarray(r.labels, dtype=np.int64)
            return {"inertia": float(r.inertia), "ari": adjusted_rand_score(y_te, r.labels),
                    "nmi": normalized_mutual_info_score(y_te, r.labels)}

        def scikit():
            km = KMeans(n_clusters=k, n_init=args.kmeans_n_init, max_iter=300, tol=1e-4, algorithm="lloyd",
                        random_state=args.seed).fit(x_te)
            shared["sklearn_labels"] = km.labels_.astype(np.int64)
            return {"inertia": float(km.inertia_) / len(x_te), "ari": adjusted_rand_score(y_te, km.labels_),
                    "nmi": normalized_mutual_info_score(y_te, km.labels_)}
    elif stage == "silhouettes":
        # the rules and one k-means labelling (scikit-learn's when it ran, so both tools score the
        # same labels); the same subsample for both
        xs = np.ascontiguousarray(x_te[sil_idx])
        clusters = shared.get("sklearn_labels", shared.get("hyperlens_labels"))
        labelings = [y_te[sil_idx]] + ([clusters[sil_idx]] if clusters is not None else [])

        def hyperlens():
            return {"silhouettes": [hl.analysis.silhouette(xs, l) for l in labelings]}

        def scikit():
            return {"silhouettes": [float(silhouette_score(xs, l)) for l in labelings]}
    elif stage == "tsne":
        xs = np.ascontiguousarray(x_te[tsne_idx])

        def hyperlens():
            e = hl.analysis.tsne(xs, perplexity=30.0, theta=0.0, max_iter=args.tsne_iter, seed=args.seed)
            return {"trustworthiness": trust(xs, e)}

        def scikit():
            e = TSNE(perplexity=30.0, max_iter=args.tsne_iter, random_state=args.seed, init="random").fit_transform(xs)
            return {"trustworthiness": trust(xs, e)}
    else:
        raise ValueError(stage)
    return {"hyperlens": hyperlens, "scikit-learn": scikit}


def trust(x, e):
    from sklearn.manifold import trustworthiness
    return float(trustworthiness(x, e, n_neighbors=5))


def machine():
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((l.split(":", 1)[1].strip() for l in lscpu.splitlines() if l.startswith("Model name")), "?")
    except OSError:
        model = "?"
    try:
        commit = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "?"
    return {"cpu": model, "logical_cpus": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "sklearn": sklearn.__version__, "commit": commit,
            "load_before": os.getloadavg()}


def analyze_memory(binary, n, rules, seed, work):
    """Peak resident memory and wall time of `hyperlens analyze` on planted codes [n, 30, 9, 1, 1]
    (270 features, SmolLM2's layers x heads), at scikit-learn's settings (10 restarts, silhouette
    on 10,000 codes)."""
    import resource
    import tempfile
    work = Path(tempfile.mkdtemp(prefix="stages-memory-", dir=work))
    (x_tr, y_tr), (x_te, y_te) = wide_codes(n, 270, rules, seed)
    for name, x, y in (("id", x_tr, y_tr), ("ood", x_te, y_te)):
        np.savez(work / f"{name}.npz", codes=x.astype(np.float32).reshape(n, 30, 9, 1, 1), label=y)
    del x_tr, x_te
    cmd = [binary, "analyze", "--train", str(work / "id.npz"), "--test", str(work / "ood.npz"), "--out",
           str(work / "out"), "--kmeans-runs", "10", "--silhouette-points", "10000"]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"command": " ".join(cmd), "n": n, "wall_s": wall, "peak_rss_mib": peak_kib / 1024,
            "note": "ru_maxrss of the largest child so far (lscpu, git and analyze): analyze's"}


def median(v):
    return float(np.median(v)) if v else float("nan")


def main():
    args = parse_args()
    stages = [s for s in args.stages.split(",") if s]
    for s in stages:
        if s not in STAGES:
            raise SystemExit(f"unknown stage {s!r} ({', '.join(STAGES)})")
    sets = {"wide": wide_codes(args.n, args.dims, args.rules, args.seed)}
    if args.sraven_id and args.sraven_ood:
        sets["sraven"] = sraven_codes(args.sraven_id, args.sraven_ood)
    info = machine()
    times = {}  # (set, stage, tool) -> [s]
    results = {}
    for r in range(args.repeats):
        for name, data in sets.items():
            shared = {}
            for stage in stages:
                tools = tools_for(stage, data, args, shared)
                order = list(tools)
                order = order[r % len(order):] + order[: r % len(order)]
                for tool in order:
                    t = time.perf_counter()
                    res = tools[tool]()
                    dt = time.perf_counter() - t
                    times.setdefault((name, stage, tool), []).append(dt)
                    results[(name, stage, tool)] = res
                    print(f"repeat {r} {name:7s} {stage:12s} {tool:13s} {dt:8.3f} s  {json.dumps(res)}", flush=True)
    info["load_after"] = os.getloadavg()
    rows = []
    for name, data in sets.items():
        total = {"hyperlens": 0.0, "scikit-learn": 0.0}
        for stage in stages:
            h = median(times[(name, stage, "hyperlens")])
            s = median(times[(name, stage, "scikit-learn")])
            total["hyperlens"] += h
            total["scikit-learn"] += s
            rows.append({"set": name, "shape": list(data[1][0].shape), "stage": stage, "hyperlens_s": h,
                         "sklearn_s": s, "ratio": s / h,
                         "hyperlens": results[(name, stage, "hyperlens")],
                         "sklearn": results[(name, stage, "scikit-learn")]})
        rows.append({"set": name, "shape": list(data[1][0].shape), "stage": "all stages",
                     "hyperlens_s": total["hyperlens"], "sklearn_s": total["scikit-learn"],
                     "ratio": total["scikit-learn"] / total["hyperlens"]})
    print()
    print(f"machine: {info['cpu']}, {info['logical_cpus']} logical CPUs; commit {info['commit']}; "
          f"scikit-learn {info['sklearn']}, numpy {info['numpy']}; load {info['load_before']} -> {info['load_after']}")
    print(f"command: {' '.join(sys.argv)}")
    print()
    print("| set | codes | stage | hyperlens s | scikit-learn s | ratio |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['set']} | {row['shape'][0]} x {row['shape'][1]} | {row['stage']} | {row['hyperlens_s']:.3f} | "
              f"{row['sklearn_s']:.3f} | **{row['ratio']:.2f}** |")
    print()
    for row in rows:
        if "hyperlens" in row:
            print(f"{row['set']} {row['stage']}: hyperlens {json.dumps(row['hyperlens'])}, "
                  f"scikit-learn {json.dumps(row['sklearn'])}")
    memory = None
    if args.analyze_memory:
        memory = analyze_memory(args.analyze_memory, args.memory_n, args.rules, args.seed,
                                Path(args.out).parent if args.out else None)
        print()
        print(f"analyze on {memory['n']} x 270 planted codes (ID and OOD): {memory['wall_s']:.1f} s, "
              f"peak resident memory {memory['peak_rss_mib']:.0f} MiB ({memory['note']})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": info, "args": vars(args), "rows": rows, "analyze_memory": memory}, f, indent=2)


if __name__ == "__main__":
    main()
