"""Latent codes with their labels: the arrays of the CLI's ``codes.npz``."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import _core
from ._arrays import as_f32, as_i64, as_int, as_layers
from ._errors import InputError

__all__ = ["CodeSet", "LogicCodeSet"]

_OPTIONAL = ("rules", "inputs", "target", "prediction", "correct", "slot", "problem")


class CodeSet:
    """Latent codes and their labels, one row per problem (per problem and slot for
    ``site="all-slots"``).

    Attributes (the arrays of ``hyperlens probe``'s ``codes.npz``):
        codes: float32 ``[N, L, H, Q, K]`` attention scores after normalisation (problem, layer,
            head, query, key); Q = 1, K = 2 at the paper's site.
        label: int64 ``[N]`` rule (0..7) of the feature shown in the row's answer slot.
        rules: int64 ``[N, F]`` the task's rule per unpermuted slot.
        inputs: int64 ``[N, K]`` the token values at the keys (-1 for a query token).
        target, prediction: int64 ``[N]`` the answer and the model's prediction in the row's slot.
        correct: bool ``[N]`` ``prediction == target``.
        slot, problem: int64 ``[N]`` the row's answer slot and its problem's index in the set.
        site, layers: the site (CLI form) and the layers along the ``L`` axis, when known.
    """

    def __init__(
        self,
        codes: Any,
        label: Any,
        *,
        site: str | None = None,
        layers: list[int] | None = None,
        **arrays: Any,
    ) -> None:
        unknown = set(arrays) - set(_OPTIONAL)
        if unknown:
            raise InputError(f"unknown code arrays: {sorted(unknown)} (known: {list(_OPTIONAL)})")
        self.codes = as_f32(codes, "codes", 5, rounding=True)
        self.label = as_i64(label, "label", 1)
        self.rules: np.ndarray | None = None
        self.inputs: np.ndarray | None = None
        self.target: np.ndarray | None = None
        self.prediction: np.ndarray | None = None
        self.correct: np.ndarray | None = None
        self.slot: np.ndarray | None = None
        self.problem: np.ndarray | None = None
        for name in _OPTIONAL:
            v = arrays.get(name)
            if v is not None:
                setattr(self, name, _as_bool(v, name) if name == "correct" else as_i64(v, name, _AXES[name]))
        self.site = site
        self.layers = as_layers(layers)

    def __len__(self) -> int:
        return int(self.codes.shape[0])

    def __repr__(self) -> str:
        return f"CodeSet(codes={self.codes.shape}, site={self.site!r}, layers={self.layers})"

    def as_dict(self) -> dict[str, np.ndarray]:
        """The arrays that are present, by their names in ``codes.npz``."""
        d = {"codes": self.codes, "label": self.label}
        for name in _OPTIONAL:
            v = getattr(self, name)
            if v is not None:
                d[name] = v
        return d

    def features(self, layer: int | None = None) -> np.ndarray:
        """The codes as a float64 feature matrix: ``[N, H*Q*K]`` of one layer (an index along the
        ``L`` axis), or ``[N, L*H*Q*K]`` of all layers (layer slowest), as ``hyperlens analyze``
        flattens them."""
        return _features(self.codes, layer)

    @property
    def accuracy(self) -> float | None:
        """The model's accuracy on the rows' answer slots (mean of ``correct``), if stored."""
        return None if self.correct is None else float(self.correct.mean())

    def save(self, path: str | os.PathLike) -> None:
        """Writes the CLI's ``codes.npz`` format (codes float32, integer arrays int64, ``correct``
        bool), atomically."""
        a = {name: getattr(self, name) for name in _OPTIONAL}
        _core.codes.save_codes(os.fspath(path), self.codes, self.label, **a)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CodeSet":
        """Reads a ``codes.npz`` written by ``hyperlens probe`` or :meth:`save`, validated (shapes,
        finite codes, rule indices, the memory budget); ``site`` and ``layers`` come from its
        ``codes.json`` when it has one (read as ``hyperlens_probe::ProbeMeta``: a sidecar that is
        not a code file's raises :class:`hyperlens.FileFormatError` naming it)."""
        d = dict(_core.codes.load_codes(os.fspath(path)))
        codes, label = d.pop("codes"), d.pop("label")
        meta = _sidecar(path)
        return cls(codes, label, site=meta.get("site"), layers=meta.get("layers"), **d)


class LogicCodeSet:
    """Latent codes of a fuzzy-logic model with the task's terms as labels, one row per sequence:
    the arrays of ``hyperlens probe``'s ``codes.npz`` on a logic checkpoint.

    Attributes:
        codes: float32 ``[N, L, H, 1, K]`` attention scores after normalisation (sequence, layer,
            head, query, key); at the paper's site the last token's attention to itself (K = 1).
        terms: int64 ``[N, Kt, Lv]`` the task's terms as bits.
        term_ids: int64 ``[N, Kt]`` the terms' indices.
        target: float32 ``[N]`` the last token's target; prediction: float32 ``[N]`` the model's.
        problem: int64 ``[N]`` the sequence's index in the set.
        site, layers: the site (``query:I;keys:J,...``) and the layers along the ``L`` axis.
    """

    def __init__(
        self,
        codes: Any,
        terms: Any,
        term_ids: Any,
        target: Any = None,
        prediction: Any = None,
        problem: Any = None,
        *,
        site: str | None = None,
        layers: list[int] | None = None,
    ) -> None:
        self.codes = as_f32(codes, "codes", 5, rounding=True)
        self.terms = as_i64(terms, "terms", 3)
        self.term_ids = as_i64(term_ids, "term_ids", 2)
        n = self.codes.shape[0]
        self.target = np.zeros(n, np.float32) if target is None else as_f32(target, "target", 1, rounding=True)
        self.prediction = np.zeros(n, np.float32) if prediction is None else as_f32(prediction, "prediction", 1, rounding=True)
        self.problem = np.arange(n, dtype=np.int64) if problem is None else as_i64(problem, "problem", 1)
        self.site = site
        self.layers = as_layers(layers)

    def __len__(self) -> int:
        return int(self.codes.shape[0])

    def __repr__(self) -> str:
        return f"LogicCodeSet(codes={self.codes.shape}, site={self.site!r}, layers={self.layers})"

    def as_dict(self) -> dict[str, np.ndarray]:
        """The arrays by their names in the CLI's logic ``codes.npz``, in its order."""
        return {
            "codes": self.codes,
            "terms": self.terms,
            "term_ids": self.term_ids,
            "target": self.target,
            "prediction": self.prediction,
            "problem": self.problem,
        }

    def features(self, layer: int | None = None) -> np.ndarray:
        """The codes as a float64 feature matrix ``[N, H*Q*K]`` of one layer, or all layers."""
        return _features(self.codes, layer)

    @property
    def mse(self) -> float:
        """Mean squared error of the model's prediction of the last token's target."""
        return float(np.mean((self.prediction.astype(np.float64) - self.target.astype(np.float64)) ** 2))

    def save(self, path: str | os.PathLike) -> None:
        """Writes the CLI's logic ``codes.npz`` format, atomically."""
        _core.codes.save_logic_codes(
            os.fspath(path), self.codes, self.terms, self.term_ids,
            self.target, self.prediction, self.problem,
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> "LogicCodeSet":
        """Reads a logic ``codes.npz`` written by ``hyperlens probe`` or :meth:`save`, validated by
        the analysis crate's reader (shapes, finite codes, term bits and indices); ``site`` and
        ``layers`` from its ``codes.json`` as :meth:`CodeSet.load` reads them."""
        d = dict(_core.codes.load_logic_codes(os.fspath(path)))
        meta = _sidecar(path)
        return cls(
            d["codes"], d["terms"], d["term_ids"], d.get("target"), d.get("prediction"), d.get("problem"),
            site=meta.get("site"), layers=meta.get("layers"),
        )


def _sidecar(path: str | os.PathLike) -> dict:
    """The sidecar beside a codes file (``codes.npz`` -> ``codes.json``) as the probe crate reads
    it (``hyperlens_probe::ProbeMeta``), or ``{}`` when there is none."""
    return _core.codes.read_codes_sidecar(os.fspath(path)) or {}


#: The number of axes of each optional array of a :class:`CodeSet`.
_AXES = {"rules": 2, "inputs": 2, "target": 1, "prediction": 1, "slot": 1, "problem": 1}


def _as_bool(v: Any, name: str) -> np.ndarray:
    """``v`` as a bool ``[N]`` array: bools, or integers that are all 0 or 1 (as the file reader
    takes them); anything else (2, 0.5) is refused rather than read as True."""
    a = np.asarray(v)
    if a.dtype == np.bool_:
        if a.ndim != 1:
            raise InputError(f"`{name}` must have 1 axis, got shape {a.shape}")
        return a
    i = as_i64(a, name, 1)
    if i.size and not np.isin(i, (0, 1)).all():
        raise InputError(f"`{name}` holds values other than 0 and 1 (True and False)")
    return i.astype(np.bool_)


def _features(codes: np.ndarray, layer: Any) -> np.ndarray:
    """The codes ``[N, L, H, Q, K]`` as a float64 feature matrix, of one layer or of all."""
    n = codes.shape[0]
    if layer is None:
        return codes.reshape(n, -1).astype(np.float64)
    layer = as_int(layer, "layer")
    if layer >= codes.shape[1]:
        raise InputError(f"`layer` {layer} is out of range: the codes have {codes.shape[1]} layers")
    return codes[:, layer].reshape(n, -1).astype(np.float64)
