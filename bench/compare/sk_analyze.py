#!/usr/bin/env python3
"""The scikit-learn counterpart of `hyperlens analyze` (SRAVEN code files), one timed run.

Run by compare.py in a subprocess whose BLAS/OpenMP thread variables are set before numpy is
imported. It does the work `hyperlens analyze` does (crates/analysis/src/codes/report.rs,
docs/outputs.md "hyperlens analyze") on the same two code files, for every layer and for all
layers concatenated:

- features: the codes [N, L, H, Q, K] flattened per layer to [N, H*Q*K] and for all layers to
  [N, L*H*Q*K], as float64 (hyperlens converts to float64 too); labels = the `label` array;
- pca: PCA with every component (svd_solver="full") of the unsupervised set, projected on the first
  --components;
- decoding: StandardScaler + LogisticRegression(C, lbfgs, tol, max_iter) trained on --train (ID)
  and tested on --test (OOD), plus the shuffled-label control (the same pipeline on permuted
  training labels), majority baseline, balanced accuracy, train accuracy;
- clustering: KMeans(k = number of distinct labels of the unsupervised set, n_init, max_iter, tol,
  random_state=seed); ARI and NMI of the clusters against the labels; silhouette of the labels and
  of the clusters on one seeded subsample of at most --silhouette-points points (the same indices
  for both scores, as hyperlens does);
- similarity: cosine similarity of the mean codes of every pair of labels (union of train and
  test labels; NaN for a label absent from the unsupervised set).

Each stage is timed separately (time.perf_counter) around the same work hyperlens times in its
stages. The results and timings go to --out as JSON.
"""
import argparse
import json
import time
import warnings

T_START = time.perf_counter()

import numpy as np  # noqa: E402  (after the clock starts: import time is part of the record)
import sklearn  # noqa: E402
from sklearn.cluster import KMeans  # noqa: E402
from sklearn.decomposition import PCA  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.metrics import (  # noqa: E402
    adjusted_rand_score,
    balanced_accuracy_score,
    normalized_mutual_info_score,
    silhouette_score,
)
from sklearn.preprocessing import StandardScaler  # noqa: E402

T_IMPORTED = time.perf_counter()


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", required=True, help="ID codes (.npz written by hyperlens probe)")
    p.add_argument("--test", required=True, help="OOD codes (.npz written by hyperlens probe)")
    p.add_argument("--out", required=True, help="results and timings (.json)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--c", type=float, default=1.0)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--max-iter", type=int, default=1000)
    p.add_argument("--kmeans-n-init", type=int, default=10)
    p.add_argument("--kmeans-max-iter", type=int, default=300)
    p.add_argument("--kmeans-tol", type=float, default=1e-4)
    p.add_argument("--silhouette-points", type=int, default=5000)
    p.add_argument("--components", type=int, default=2)
    p.add_argument("--unsupervised-on", choices=["train", "test"], default="test")
    return p.parse_args()


def load(path):
    with np.load(path) as z:
        return np.asarray(z["codes"]), np.asarray(z["label"]).astype(np.int64)


def features(codes, layer):
    """[N, L, H, Q, K] -> [N, H*Q*K] for one layer (row-major, head slowest) or [N, L*H*Q*K]."""
    n = codes.shape[0]
    sel = codes if layer is None else codes[:, layer]
    return np.ascontiguousarray(sel.reshape(n, -1), dtype=np.float64)


def fit_probe(x_train, y_train, args):
    """StandardScaler + multinomial LogisticRegression; returns (scaler, model, converged)."""
    scaler = StandardScaler().fit(x_train)
    model = LogisticRegression(C=args.c, solver="lbfgs", tol=args.tol, max_iter=args.max_iter)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        model.fit(scaler.transform(x_train), y_train)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    return scaler, model, converged


def decode(x_train, y_train, x_test, y_test, args):
    scaler, model, converged = fit_probe(x_train, y_train, args)
    pred = model.predict(scaler.transform(x_test))
    train_pred = model.predict(scaler.transform(x_train))
    # shuffled-label control: the same pipeline on permuted training labels
    rng = np.random.default_rng(args.seed)
    s_scaler, s_model, s_converged = fit_probe(x_train, rng.permutation(y_train), args)
    s_pred = s_model.predict(s_scaler.transform(x_test))
    # majority class of the training labels (ties: the smaller label, as hyperlens)
    values, counts = np.unique(y_train, return_counts=True)
    majority = int(values[np.argmax(counts)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "y_pred contains classes not in y_true"
        balanced = float(balanced_accuracy_score(y_test, pred))
    return {
        "accuracy": float(np.mean(pred == y_test)),
        "balanced_accuracy": balanced,
        "majority_class": majority,
        "majority_baseline": float(np.mean(y_test == majority)),
        "shuffled_control": float(np.mean(s_pred == y_test)),
        "train_accuracy": float(np.mean(train_pred == y_train)),
        "n_iter": int(np.max(model.n_iter_)),
        "converged": converged,
        "shuffled_n_iter": int(np.max(s_model.n_iter_)),
        "shuffled_converged": s_converged,
    }


def cluster(x, labels, args):
    k = len(np.unique(labels))
    km = KMeans(n_clusters=k, n_init=args.kmeans_n_init, max_iter=args.kmeans_max_iter,
                tol=args.kmeans_tol, random_state=args.seed).fit(x)
    assigned = km.labels_
    n = x.shape[0]
    if n > args.silhouette_points:
        rng = np.random.default_rng(args.seed)
        idx = np.sort(rng.choice(n, size=args.silhouette_points, replace=False))
    else:
        idx = np.arange(n)
    sil = float(silhouette_score(x[idx], labels[idx], metric="euclidean"))
    try:
        sil_km = float(silhouette_score(x[idx], assigned[idx], metric="euclidean"))
    except ValueError:  # fewer than 2 clusters in the subsample
        sil_km = float("nan")
    return {
        "k": int(k),
        "ari": float(adjusted_rand_score(labels, assigned)),
        "nmi": float(normalized_mutual_info_score(labels, assigned)),
        "silhouette": sil,
        "silhouette_kmeans": sil_km,
        "silhouette_points": int(len(idx)),
        "inertia_sum": float(km.inertia_),
        "inertia_mean": float(km.inertia_) / n,
        "n_iter": int(km.n_iter_),
    }


def similarity(x, labels, all_labels):
    means = []
    for lab in all_labels:
        rows = x[labels == lab]
        means.append(rows.mean(axis=0) if len(rows) else np.full(x.shape[1], np.nan))
    m = np.array(means)
    norms = np.linalg.norm(m, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = (m @ m.T) / np.outer(norms, norms)
    return {"labels": [int(v) for v in all_labels],
            "cosine": [[None if np.isnan(v) else float(v) for v in row] for row in cos]}


def main():
    args = parse_args()
    t0 = time.perf_counter()
    train_codes, train_y = load(args.train)
    test_codes, test_y = load(args.test)
    load_s = time.perf_counter() - t0
    if train_codes.shape[1:] != test_codes.shape[1:]:
        raise SystemExit(f"code axes differ: {train_codes.shape} vs {test_codes.shape}")
    all_labels = np.unique(np.concatenate([train_y, test_y]))
    unsup_y = test_y if args.unsupervised_on == "test" else train_y

    t_analysis = time.perf_counter()
    selections = list(range(train_codes.shape[1])) + [None]
    rows = []
    for layer in selections:
        x_train = features(train_codes, layer)
        x_test = features(test_codes, layer)
        x_unsup = x_test if args.unsupervised_on == "test" else x_train
        seconds = {}

        t = time.perf_counter()
        pca = PCA(svd_solver="full").fit(x_unsup)
        projection = pca.transform(x_unsup)[:, : args.components]
        seconds["pca"] = time.perf_counter() - t

        t = time.perf_counter()
        dec = decode(x_train, train_y, x_test, test_y, args)
        seconds["decoding"] = time.perf_counter() - t

        t = time.perf_counter()
        clu = cluster(x_unsup, unsup_y, args) if len(np.unique(unsup_y)) >= 2 else None
        seconds["clustering"] = time.perf_counter() - t

        t = time.perf_counter()
        sim = similarity(x_unsup, unsup_y, all_labels)
        seconds["similarity"] = time.perf_counter() - t

        rows.append({
            "layer": -1 if layer is None else layer,
            "all_layers": layer is None,
            "n_features": int(x_train.shape[1]),
            "decoding": dec,
            "clusters": clu,
            "pca": {"explained_variance_ratio": pca.explained_variance_ratio_.tolist(),
                    "explained_variance": pca.explained_variance_.tolist(),
                    "projection_shape": list(projection.shape)},
            "similarity": sim,
            "seconds": seconds,
        })
    analysis_s = time.perf_counter() - t_analysis

    try:
        from threadpoolctl import threadpool_info
        pools = [{k: p.get(k) for k in ("user_api", "internal_api", "num_threads", "version")}
                 for p in threadpool_info()]
    except Exception as e:  # threadpoolctl is a dependency of scikit-learn, but be safe
        pools = [{"error": str(e)}]
    record = {
        "tool": "scikit-learn",
        "sklearn": sklearn.__version__,
        "numpy": np.__version__,
        "threadpools": pools,
        "params": vars(args),
        "n_train": int(train_codes.shape[0]),
        "n_test": int(test_codes.shape[0]),
        "import_s": T_IMPORTED - T_START,
        "load_s": load_s,
        "analysis_s": analysis_s,
        "script_s": time.perf_counter() - T_START,
        "layers": rows,
    }
    with open(args.out, "w") as f:
        json.dump(record, f, indent=2)


if __name__ == "__main__":
    main()
