"""hyperlens.analysis against scikit-learn on the same arrays (the tolerances of
crates/analysis/tests/latent.rs), and analyze() against `hyperlens analyze`."""

import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, adjusted_rand_score, balanced_accuracy_score, silhouette_score
from sklearn.preprocessing import StandardScaler

import hyperlens as hl
from conftest import run_cli


def blobs(n=600, d=6, k=4, seed=0, spread=1.0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=5.0, size=(k, d))
    y = rng.integers(0, k, size=n)
    return centres[y] + rng.normal(scale=spread, size=(n, d)), y


def test_pca_matches_sklearn():
    X, _ = blobs(503, 7)
    X = X @ np.random.default_rng(1).normal(size=(7, 7))
    r = hl.analysis.pca(X, 3)
    sk = PCA(n_components=3, svd_solver="full").fit(X)
    np.testing.assert_allclose(r.explained_variance_ratio[:3], sk.explained_variance_ratio_, rtol=1e-9)
    np.testing.assert_allclose(r.explained_variance[:3], sk.explained_variance_, rtol=1e-9)
    np.testing.assert_allclose(r.mean, sk.mean_, rtol=1e-12, atol=1e-12)
    # components up to sign
    for c in range(3):
        s = np.sign(r.components[c] @ sk.components_[c])
        np.testing.assert_allclose(r.components[c], s * sk.components_[c], atol=1e-8)
        np.testing.assert_allclose(r.projection[:, c], s * sk.transform(X)[:, c], atol=1e-8)
    np.testing.assert_allclose(r.transform(X), r.projection, atol=1e-10)


def test_decode_matches_sklearn():
    X, y = blobs(1000, 8, 5, seed=2, spread=4.0)
    Xtr, ytr, Xte, yte = X[:600], y[:600], X[600:], y[600:]
    r = hl.analysis.decode(Xtr, ytr, Xte, yte, C=1.0)
    sc = StandardScaler().fit(Xtr)
    sk = LogisticRegression(C=1.0, max_iter=100, tol=1e-4).fit(sc.transform(Xtr), ytr)
    pred = sk.predict(sc.transform(Xte))
    assert abs(r.accuracy - accuracy_score(yte, pred)) <= 0.01
    assert abs(r.balanced_accuracy - balanced_accuracy_score(yte, pred)) <= 0.01
    assert r.predictions.shape == (400,) and r.predictions.dtype == np.int64
    assert (r.predictions == pred).mean() >= 0.97
    assert r.accuracy == pytest.approx((r.predictions == yte).mean())
    assert r.confusion.sum() == 400 and list(r.classes) == [0, 1, 2, 3, 4]
    assert r.shuffled_control is not None and r.shuffled_control < 0.45


def test_converged_decoder_weights_match_sklearn():
    X, y = blobs(400, 5, 3, seed=4, spread=3.0)
    r = hl.analysis.decode(X, y, X, y, C=0.5, max_iter=10_000, tol=1e-9, shuffled_control=False)
    sc = StandardScaler().fit(X)
    sk = LogisticRegression(C=0.5, max_iter=10_000, tol=1e-9).fit(sc.transform(X), y)
    assert np.abs(r.coef - sk.coef_.T).max() < 1e-4
    assert np.abs(r.intercept - sk.intercept_).max() < 1e-4


def test_kmeans_and_silhouette_match_sklearn():
    X, y = blobs(500, 4, 5, seed=5, spread=0.5)
    r = hl.analysis.kmeans(X, 5, n_init=3)
    sk = KMeans(5, n_init=3, random_state=0).fit(X)
    assert adjusted_rand_score(r.labels, sk.labels_) > 0.99
    assert r.inertia == pytest.approx(sk.inertia_ / len(X), rel=1e-3)
    assert r.centroids.shape == (5, 4)
    assert hl.analysis.silhouette(X, y) == pytest.approx(silhouette_score(X, y), rel=1e-10, abs=1e-12)


def test_tsne_embeds_separated_blobs():
    X, y = blobs(150, 6, 3, seed=6, spread=0.3)
    e = hl.analysis.tsne(X, perplexity=10.0, theta=0.0, max_iter=300)
    assert e.shape == (150, 2) and e.dtype == np.float64
    assert silhouette_score(e, y) > 0.5


def test_analyze_equals_cli_analyze(model, cli, tmp_path):
    id_set = hl.tasks.sample(split="paper-seed0", set="id", n=400, seed=1, unpermuted=True)
    ood_set = hl.tasks.sample(split="paper-seed0", set="ood", n=400, seed=1, unpermuted=True)
    a, b = model.latent_codes(id_set), model.latent_codes(ood_set)
    a.save(tmp_path / "id.npz")
    b.save(tmp_path / "ood.npz")
    run_cli(cli, "analyze", "--train", str(tmp_path / "id.npz"), "--test", str(tmp_path / "ood.npz"), "--out", str(tmp_path / "an"))
    rep = hl.analysis.analyze(a, b)
    for name, text in rep.csv.items():
        assert text == (tmp_path / "an" / name).read_text(), name
    z = np.load(tmp_path / "an" / "pca.npz")
    assert sorted(z.keys()) == sorted(rep.projections)
    for k in z.keys():
        np.testing.assert_array_equal(rep.projections[k], z[k], err_msg=k)
    d = rep.decoding
    assert list(d["layer"]) == [0, 1, 2, 3, -1]
    assert rep.summary["n_train"] == 400 if "n_train" in rep.summary else True
