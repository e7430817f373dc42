"""Circuits read straight from the weights of a loaded token language model (Elhage et al. 2021,
"A Mathematical Framework for Transformer Circuits"; TransformerLens's ``FactoredMatrix``,
``all_composition_scores`` and ``head_detector``).

- :func:`analyze`: what ``hyperlens circuits`` computes, in memory: OV / full-OV eigenvalues and
  copying scores, Q/K/V composition scores of every head pair with a random-matrix baseline,
  previous-token / duplicate-token / induction head scores on repeated random tokens, and the
  heads it names.
- :func:`ov_circuit`, :func:`qk_circuit` (and ``full=True``): one head's circuit as a
  :class:`FactoredMatrix` with its eigenvalues and singular values.
- :func:`copying_scores`: the eigenvalue copying score of every head.

Every number comes from ``hyperlens_analysis::circuits`` (in float64), as the CLI's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _core
from ._arrays import as_int, as_opt_int, as_seed, table
from ._errors import InputError

__all__ = ["analyze", "CircuitReport", "FactoredMatrix", "ov_circuit", "qk_circuit", "copying_scores"]


def _lm(model: Any, what: str) -> Any:
    from ._model import LanguageModel

    if not isinstance(model, LanguageModel):
        raise InputError(f"{what} works on a token language model (hl.load of a GPT-2, Llama or token model), got {model!r}")
    return model._ev


@dataclass(frozen=True)
class CircuitReport:
    """The result of :func:`analyze`; the arrays of ``eigenvalues.npz`` and
    ``composition_{q,k,v}.npz`` and the tables of ``hyperlens circuits``.

    Attributes:
        ov, full_ov: complex128 ``[L, H, d_head]`` eigenvalues of each head's OV circuit
            ``W_V W_O`` and full OV circuit ``W_E W_V W_O W_U`` (descending modulus).
        ov_copying, full_ov_copying: float64 ``[L, H]`` copying scores ``Re(sum λ) / sum |λ|``.
        composition: ``{"q", "k", "v"}`` -> float64 ``[L, H, L, H]`` composition scores
            (TransformerLens's ``all_composition_scores``; zero where the first layer is not below
            the second).
        baseline: ``{"q", "k", "v"}`` -> float64 ``[samples]`` sorted scores of random matrices
            of the same shapes (the baseline a score is compared with).
        rep_induction, rep_previous, rep_duplicate: float64 ``[L, H]`` stripe scores on repeated
            random tokens (Olsson et al. 2022).
        copying, composition_top, heads: ``copying.csv``, ``composition_top.csv`` and
            ``heads.csv`` as tables (pandas DataFrames when pandas is installed).
        summary: the findings of ``summary.json`` (named induction and previous-token heads,
            induction circuits, the baseline's 99th percentiles).
        seq_len: length of the repeated random segment.
    """

    ov: np.ndarray
    full_ov: np.ndarray
    ov_copying: np.ndarray
    full_ov_copying: np.ndarray
    composition: dict
    baseline: dict
    rep_induction: np.ndarray
    rep_previous: np.ndarray
    rep_duplicate: np.ndarray
    copying: Any = field(repr=False)
    composition_top: Any = field(repr=False)
    heads: Any = field(repr=False)
    summary: dict = field(repr=False)
    seq_len: int = 0

    @property
    def induction_heads(self) -> list[str]:
        """The heads named induction heads (repeated-tokens induction score >= the threshold),
        strongest first, as ``L{l}H{h}``."""
        return [h["head"] for h in self.summary["induction_heads"]]

    @property
    def previous_token_heads(self) -> list[str]:
        """The heads named previous-token heads, strongest first."""
        return [h["head"] for h in self.summary["previous_token_heads"]]


def analyze(
    model: Any,
    *,
    seq_len: int | None = None,
    seed: int = 0,
    n_seqs: int = 8,
    bos: int | None = None,
    threshold: float = 0.4,
    baseline_samples: int = 1000,
    top: int = 20,
    fold_norm: bool = True,
    threads: int = 0,
) -> CircuitReport:
    """The circuits analysis of ``hyperlens circuits --checkpoint PATH [--seq-len N] --seed SEED
    --n-seqs N [--bos ID] --threshold T --baseline-samples S --top K [--no-fold-norm]`` on a
    loaded :class:`hyperlens.LanguageModel`, in memory (the same numbers as its files).

    Head scores come from ``n_seqs`` random sequences of ``seq_len`` tokens repeated once
    (default 50, or half the context), run one at a time (Ctrl-C is checked between them);
    ``seed`` draws them and the composition baseline. Errors: ``InputError`` for a bad option or a
    ``seq_len`` the context cannot hold; ``NumericalError`` if an eigen-solve fails. Source:
    ``hyperlens_analysis::circuits::analyze_circuits``."""
    ev = _lm(model, "circuits.analyze")
    d = dict(
        _core.circuits.analyze(
            ev, as_opt_int(seq_len, "seq_len"), as_seed(seed), as_int(n_seqs, "n_seqs", 1), as_opt_int(bos, "bos", 0, 2**32 - 1),
            float(threshold), as_int(baseline_samples, "baseline_samples"), as_int(top, "top"), bool(fold_norm), as_int(threads, "threads"),
        )
    )
    tables = dict(d["tables"])
    return CircuitReport(
        ov=d["ov_re"] + 1j * d["ov_im"],
        full_ov=d["full_ov_re"] + 1j * d["full_ov_im"],
        ov_copying=d["ov_copying"],
        full_ov_copying=d["full_ov_copying"],
        composition={k: d[f"composition_{k}"] for k in ("q", "k", "v")},
        baseline={k: d[f"baseline_{k}"] for k in ("q", "k", "v")},
        rep_induction=d["rep_induction"],
        rep_previous=d["rep_previous"],
        rep_duplicate=d["rep_duplicate"],
        copying=table(tables["copying.csv"]),
        composition_top=table(tables["composition_top.csv"]),
        heads=table(tables["heads.csv"]),
        summary=dict(d["summary"]),
        seq_len=int(d["seq_len"]),
    )


@dataclass(frozen=True)
class FactoredMatrix:
    """A low-rank matrix ``M = A @ B`` kept as its factors (TransformerLens's
    ``FactoredMatrix``): ``A`` float64 ``[rows, m]``, ``B`` float64 ``[m, cols]``, m = d_head.

    Attributes:
        eigenvalues: complex128 ``[m]`` the non-zero part of M's spectrum (that of ``B A``),
            descending modulus.
        singular_values: float64 ``[m]``.
        copying_score: ``Re(sum λ) / sum |λ|``, in [-1, 1].
    """

    A: np.ndarray
    B: np.ndarray
    eigenvalues: np.ndarray
    singular_values: np.ndarray
    copying_score: float

    @property
    def shape(self) -> tuple[int, int]:
        return (self.A.shape[0], self.B.shape[1])

    @property
    def AB(self) -> np.ndarray:
        """The full matrix ``A @ B`` (``[rows, cols]``; large for full circuits)."""
        return self.A @ self.B

    @property
    def BA(self) -> np.ndarray:
        """The small ``[m, m]`` product ``B @ A``, whose eigenvalues are M's non-zero ones."""
        return self.B @ self.A


def _circuit(model: Any, layer: int, head: int, kind: str, fold_norm: bool) -> FactoredMatrix:
    ev = _lm(model, f"circuits.{kind}_circuit")
    d = _core.circuits.circuit(ev, as_int(layer, "layer"), as_int(head, "head"), kind, bool(fold_norm))
    return FactoredMatrix(d["a"], d["b"], d["eig_re"] + 1j * d["eig_im"], d["singular_values"], float(d["copying_score"]))


def ov_circuit(model: Any, layer: int, head: int, *, full: bool = False, fold_norm: bool = True) -> FactoredMatrix:
    """Head ``(layer, head)``'s OV circuit ``W_V W_O`` (``[d_model, d_model]``, row vectors), or
    with ``full=True`` the full OV circuit ``W_E W_V W_O W_U`` (``[d_vocab, d_vocab]``), as a
    :class:`FactoredMatrix` (TransformerLens's ``model.OV[layer, head]``). Norm gains that precede
    attention are folded into the weights unless ``fold_norm=False``. Source:
    ``hyperlens_analysis::circuits::AttnWeights::ov_circuit``."""
    return _circuit(model, layer, head, "full_ov" if full else "ov", fold_norm)


def qk_circuit(model: Any, layer: int, head: int, *, full: bool = False, fold_norm: bool = True) -> FactoredMatrix:
    """Head ``(layer, head)``'s QK circuit ``W_Q W_K^T`` (``[d_model, d_model]``), or with
    ``full=True`` ``W_E W_Q W_K^T W_E^T`` (``[d_vocab, d_vocab]``), as a :class:`FactoredMatrix`
    (TransformerLens's ``model.QK[layer, head]``)."""
    return _circuit(model, layer, head, "full_qk" if full else "qk", fold_norm)


def copying_scores(model: Any, *, fold_norm: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The eigenvalue copying scores ``Re(sum λ) / sum |λ|`` of every head's OV circuit and full
    OV circuit: two float64 ``[L, H]`` arrays (``copying.csv``'s columns)."""
    ev = _lm(model, "circuits.copying_scores")
    return _core.circuits.copying_scores(ev, bool(fold_norm))
