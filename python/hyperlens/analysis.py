"""Analyses of latent codes (and of any feature matrix), computed by hyperlens's Rust analysis
crate: PCA, logistic decoding, k-means, silhouette, t-SNE, and :func:`analyze`, the whole
``hyperlens analyze`` on an ID / OOD pair.

Feature matrices are float64 ``[N, D]`` (any real dtype is converted), labels int64 ``[N]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _core
from ._arrays import as_f32, as_f64, as_i64, as_int, as_seed, table
from ._codes import CodeSet
from ._errors import InputError

__all__ = ["pca", "decode", "kmeans", "silhouette", "tsne", "analyze", "term_decoding", "TermAnalysis", "PCAResult", "DecodeResult", "KMeansResult", "Analysis"]


@dataclass
class PCAResult:
    """A fitted PCA (scikit-learn's conventions: centred data, components with a deterministic
    sign).

    Attributes:
        components: float64 ``[n_components, D]``.
        explained_variance: float64 ``[D]`` variance along every principal axis.
        explained_variance_ratio: float64 ``[D]`` the same as fractions of the total.
        mean: float64 ``[D]`` the feature means.
        projection: float64 ``[N, n_components]`` the input projected on the components.
    """

    components: np.ndarray
    explained_variance: np.ndarray
    explained_variance_ratio: np.ndarray
    mean: np.ndarray
    projection: np.ndarray

    def transform(self, X: Any) -> np.ndarray:
        """``X`` float64 ``[M, D]`` projected on the components: ``[M, n_components]``."""
        X = as_f64(X, "X", 2)
        return (X - self.mean) @ self.components.T


def pca(X: Any, n_components: int = 2) -> PCAResult:
    """PCA of ``X`` ``[N, D]`` on ``n_components`` components."""
    d = _core.analysis.pca(as_f64(X, "X", 2), as_int(n_components, "n_components", 1))
    return PCAResult(**d)


@dataclass
class DecodeResult:
    """A logistic probe trained on one set and tested on another (``decoding.csv``'s numbers).

    Attributes:
        accuracy, balanced_accuracy: on the test set.
        majority_class, majority_baseline: the most frequent training label and the test accuracy
            of always predicting it.
        shuffled_control: test accuracy of the probe trained on permuted labels (None if not run).
        train_accuracy: accuracy on the training set.
        classes: int64 ``[C]`` the union of the labels, sorted.
        confusion: int64 ``[C, C]`` (true, predicted) counts on the test set.
        predictions: int64 ``[N_test]`` the probe's predictions.
        coef: float64 ``[D, C]`` and intercept float64 ``[C]`` of the probe (on standardised
            features).
        n_iter, converged: the L-BFGS fit.
    """

    accuracy: float
    balanced_accuracy: float
    majority_class: int
    majority_baseline: float
    shuffled_control: float | None
    train_accuracy: float
    classes: np.ndarray
    confusion: np.ndarray
    predictions: np.ndarray
    coef: np.ndarray
    intercept: np.ndarray
    n_iter: int
    converged: bool


def decode(
    X_train: Any,
    y_train: Any,
    X_test: Any,
    y_test: Any,
    C: float = 1.0,
    *,
    max_iter: int = 100,
    tol: float = 1e-4,
    shuffled_control: bool = True,
    seed: int = 0,
) -> DecodeResult:
    """Trains a multinomial logistic probe (standardised features, L2 with inverse strength
    ``C``: scikit-learn's ``LogisticRegression`` defaults) on ``X_train`` ``[N, D]`` /
    ``y_train`` ``[N]`` and tests it on ``X_test`` ``[M, D]`` / ``y_test`` ``[M]``."""
    d = _core.analysis.decode(
        as_f64(X_train, "X_train", 2),
        as_i64(y_train, "y_train", 1),
        as_f64(X_test, "X_test", 2),
        as_i64(y_test, "y_test", 1),
        float(C),
        as_int(max_iter, "max_iter", 1),
        float(tol),
        bool(shuffled_control),
        as_seed(seed),
    )
    return DecodeResult(**d)


@dataclass
class KMeansResult:
    """A k-means clustering.

    Attributes:
        labels: int64 ``[N]`` cluster of every sample.
        centroids: float64 ``[k, D]``.
        inertia: mean squared distance of the samples to their centre (scikit-learn's
            ``inertia_ / N``).
    """

    labels: np.ndarray
    centroids: np.ndarray
    inertia: float


def kmeans(X: Any, k: int, n_init: int = 3, *, seed: int = 0, max_iter: int = 300, tol: float = 1e-4) -> KMeansResult:
    """k-means of ``X`` ``[N, D]`` with ``n_init`` k-means++ restarts (the lowest inertia kept)."""
    d = _core.analysis.kmeans(as_f64(X, "X", 2), as_int(k, "k", 1), as_int(n_init, "n_init", 1), as_seed(seed), as_int(max_iter, "max_iter", 1), float(tol))
    return KMeansResult(**d)


def silhouette(X: Any, labels: Any) -> float:
    """The mean silhouette coefficient of ``labels`` ``[N]`` on ``X`` ``[N, D]`` (Euclidean)."""
    return float(_core.analysis.silhouette(as_f64(X, "X", 2), as_i64(labels, "labels", 1)))


def tsne(X: Any, perplexity: float = 30.0, *, theta: float = 0.5, max_iter: int = 1000, seed: int = 0) -> np.ndarray:
    """A 2-D t-SNE embedding of ``X`` ``[N, D]``: float64 ``[N, 2]`` (``theta=0`` for the exact,
    deterministic algorithm)."""
    return _core.analysis.tsne(as_f64(X, "X", 2), float(perplexity), float(theta), as_int(max_iter, "max_iter", 1), as_seed(seed))


@dataclass
class Analysis:
    """The result of :func:`analyze`: the tables that ``hyperlens analyze`` writes, as pandas
    DataFrames (dicts of numpy columns without pandas), one row per layer and one for all layers
    (``layer`` -1, ``all_layers`` True).

    Attributes:
        decoding, pca, clusters, similarity, confusion: ``decoding.csv`` ... ``confusion.csv``.
        summary: ``summary.json`` as a dict.
        projections: ``pca.npz``'s arrays (``layer{l}`` / ``all`` float64 ``[N, 2]``,
            ``components_*``, ``explained_variance_ratio_*``, ``label``, ...).
        csv: the tables' CSV text, byte for byte as the CLI writes them.
    """

    decoding: Any
    pca: Any
    clusters: Any
    similarity: Any
    confusion: Any
    summary: dict
    projections: dict[str, np.ndarray]
    csv: dict[str, str] = field(repr=False)


@dataclass(frozen=True)
class TermAnalysis:
    """The result of :func:`analyze` on fuzzy-logic codes: ``term_decoding.csv`` of ``hyperlens
    analyze`` (per layer and ``all``: ``ridge_r2``, ``f1_mean``, ``f1_base_rate``,
    ``f1_shuffled``, ``n_terms``)."""

    term_decoding: Any


def analyze(
    train: Any,
    test: Any,
    *,
    seed: int = 0,
    n_components: int = 2,
    shuffled_control: bool = True,
    kmeans_runs: int = 3,
    unsupervised_on: str = "test",
) -> "Analysis | TermAnalysis":
    """PCA, rule decoding train -> test with controls, k-means and mean-code similarity, per
    layer and on all layers: ``hyperlens analyze --train TRAIN --test TEST`` in memory.

    ``train`` and ``test`` are :class:`hyperlens.CodeSet` (e.g. ``model.latent_codes(id_set)``
    and ``model.latent_codes(ood_set)``) with the same (L, H, Q, K).

    On fuzzy-logic codes (two :class:`hyperlens.LogicCodeSet`) it returns what ``hyperlens
    analyze`` writes for them, a :class:`TermAnalysis` with the ``term_decoding`` table
    (:func:`term_decoding`; ``seed`` seeds its shuffled-label control).

    ``KeyboardInterrupt`` (Ctrl-C, checked before every step of every layer) stops it. Source:
    ``hyperlens_analysis::analyze_pair``.
    """
    from ._codes import LogicCodeSet

    if isinstance(train, LogicCodeSet) or isinstance(test, LogicCodeSet):
        return TermAnalysis(term_decoding(train, test, seed=seed))
    d = _core.analysis.analyze(
        _codes_dict(train, "train"),
        _codes_dict(test, "test"),
        as_seed(seed),
        as_int(n_components, "n_components", 1),
        bool(shuffled_control),
        as_int(kmeans_runs, "kmeans_runs", 1, 10_000),
        str(unsupervised_on),
    )
    names = ("decoding", "pca", "clusters", "similarity", "confusion")
    return Analysis(
        **{n: table(d[n]) for n in names},
        summary=dict(d["summary"]),
        projections=dict(d["pca_arrays"]),
        csv=dict(d["csv"]),
    )


def term_decoding(train: Any, test: Any, *, seed: int = 0, C: float = 1.0, max_iter: int = 100) -> Any:
    """Term decoding of fuzzy-logic codes (``hyperlens analyze --train TRAIN --test TEST`` on
    logic code files, its ``term_decoding.csv``): per layer and on all layers (``layer`` ``all``),
    the ridge R² of the task's terms on the test set's halves (scikit-learn's ``Ridge(alpha=1)``
    and ``r2_score``), and per-term logistic probes trained on ``train`` and scored by F1 on
    ``test``, with the base-rate and shuffled-label controls.

    ``train`` and ``test`` are :class:`hyperlens.LogicCodeSet` (``model.latent_codes`` of a logic
    model on ID and held-out sets). Returns the table. Source:
    ``hyperlens_analysis::terms::term_decoding``."""
    from ._codes import LogicCodeSet

    for name, c in (("train", train), ("test", test)):
        if not isinstance(c, LogicCodeSet):
            raise TypeError(f"`{name}` must be a LogicCodeSet, got {type(c).__name__}")
    columns = _core.analysis.term_decoding(
        as_f32(train.codes, "train.codes", rounding=True), as_i64(train.terms, "train.terms"), as_i64(train.term_ids, "train.term_ids"),
        as_f32(test.codes, "test.codes", rounding=True), as_i64(test.terms, "test.terms"), as_i64(test.term_ids, "test.term_ids"),
        as_seed(seed), float(C), as_int(max_iter, "max_iter", 1),
    )
    return table(columns)


def _codes_dict(c: Any, name: str) -> dict[str, Any]:
    """The arrays of a code set (a :class:`CodeSet` or a dict of its arrays), converted as
    :class:`CodeSet` converts them; the core validates them as the file reader does."""
    if isinstance(c, dict):
        try:
            c = CodeSet(**c)
        except InputError as e:
            raise type(e)(f"`{name}`: {e}") from None
        except TypeError as e:
            raise InputError(f"`{name}`: {e}") from None
    elif not isinstance(c, CodeSet):
        raise TypeError(f"`{name}` must be a CodeSet, got {type(c).__name__}")
    return c.as_dict()


@dataclass(frozen=True)
class LmAnalysis:
    """The result of :func:`analyze_lm`: the tables ``hyperlens analyze --lm-codes`` writes, as
    pandas DataFrames (dicts of numpy columns without pandas).

    Attributes:
        decoding: ``decoding.csv``, one row per layer (``layer`` the model layer) and one for the
            layers together (``layer`` -1, ``all_layers`` True): ``n_train``, ``n_test``,
            ``chance`` (the test frequency of the training majority class), ``chance_max``
            (the largest test class frequency), then per probe (``codes``, ``shuffled_labels``, ``distance``,
            ``shuffled_weights``, ``resid``) its held-out accuracy and 95% bootstrap interval
            (``<probe>_ci_low``, ``<probe>_ci_high``; NaN for a probe not run), float64.
        behaviour: ``behaviour.csv``, one row per factor combination: a text column per factor,
            ``n_prompts``, ``n_train``, ``n_test`` int64, ``n_correct``, ``accuracy`` float64
            (NaN without ``correct``), ``kept`` bool.
        structure: ``structure.csv``: per layer ``n_rows``, ``pc1``.. (explained-variance
            ratios), ``k``, ``ari``, ``nmi``, ``silhouette``.
        summary: ``summary.json`` as a dict (every probe, the behaviour note, the settings).
        projections: ``layer{l}`` / ``all`` float64 ``[N_u, n_components]``, the PCA projections
            of the rows ``structure`` ran on.
        structure_prompt: int64 ``[N_u]``, the prompt index of those rows.
        structure_label: int64 ``[N_u]``, their value index of the factor.
    """

    decoding: Any
    behaviour: Any
    structure: Any
    summary: dict
    projections: dict[str, np.ndarray]
    structure_prompt: np.ndarray
    structure_label: np.ndarray


def analyze_lm(
    codes: Any,
    factor: str | None = None,
    shuffled_codes: Any = None,
    min_accuracy: float | None = None,
    layers: Any = None,
    *,
    seed: int = 0,
    n_bootstrap: int = 1000,
    ci_level: float = 0.95,
    C: float = 1.0,
    max_iter: int = 100,
    n_components: int = 3,
    kmeans_runs: int = 3,
    unsupervised_on: str = "test",
) -> LmAnalysis:
    """The analyses of a language model's code file (``codes.npz`` with its ``codes.json``
    beside it, as ``hyperlens probe`` writes it from a prompt file): ``hyperlens analyze
    --lm-codes CODES``.

    Keeps the factor combinations the model answers with accuracy ``>= min_accuracy`` (all
    without a threshold or without a ``correct`` array), then decodes ``factor`` (default: the
    file's label factor) with a logistic probe (scikit-learn's ``StandardScaler`` +
    ``LogisticRegression(C=C)``) trained on the seen combinations (``split`` 0) and tested on the
    held-out ones (``split`` 1), per layer in ``layers`` (model layer numbers; default all) and
    on them together, with the controls: shuffled training labels, the query-key distances only,
    the codes of ``shuffled_codes`` (the same prompts from the model with its weights shuffled)
    and the residual stream at the query (when the file holds ``resid``). Intervals: percentile
    bootstrap over the test prompts (``n_bootstrap`` resamples, seeded). Test prompts of a value
    never seen in training count as errors (``summary["decoding"]["n_unseen_test"]``).

    Raises ``InputError`` for an unknown factor (listing the file's factors) or layer, no kept
    train or test rows, a shuffled file of other prompts, or a missing or foreign sidecar;
    ``ShapeError`` for arrays whose shapes disagree; ``NotFoundError`` for a missing file;
    ``FileFormatError`` for a missing array or a wrong dtype. Every message names the file and the array. Source:
    ``hyperlens_analysis::lm::analyze``.
    """
    import os

    def path(v: Any, name: str) -> str:
        if not isinstance(v, (str, os.PathLike)):
            raise TypeError(f"`{name}` must be a path, got {type(v).__name__}")
        return os.fspath(v)

    if factor is not None and not isinstance(factor, str):
        raise TypeError(f"`factor` must be a str, got {type(factor).__name__}")
    if layers is not None:
        layers = [as_int(layer, "layers") for layer in np.atleast_1d(np.asarray(layers)).tolist()]
    d = _core.lm_analysis.analyze_lm(
        path(codes, "codes"),
        factor,
        None if shuffled_codes is None else path(shuffled_codes, "shuffled_codes"),
        None if min_accuracy is None else float(min_accuracy),
        layers,
        as_seed(seed),
        as_int(n_bootstrap, "n_bootstrap", 1),
        float(ci_level),
        float(C),
        as_int(max_iter, "max_iter", 1),
        as_int(n_components, "n_components", 1),
        as_int(kmeans_runs, "kmeans_runs", 1, 10_000),
        str(unsupervised_on),
    )
    return LmAnalysis(
        decoding=table(d["decoding"]),
        behaviour=table(d["behaviour"]),
        structure=table(d["structure"]),
        summary=dict(d["summary"]),
        projections=dict(d["projections"]),
        structure_prompt=d["structure_prompt"],
        structure_label=d["structure_label"],
    )


__all__ += ["analyze_lm", "LmAnalysis"]
