"""SRAVEN and fuzzy-logic problem sets as numpy arrays: sample, build from arrays, load and save.

The arrays are those of the CLI's problem files (``hyperlens tasks sample``). SRAVEN
(:class:`ProblemSet`): ``x`` one-hot tokens (float32 in memory, uint8 on disk), ``y`` answers,
``rules`` the task's rule per slot, ``perms`` the feature permutation of each column. Fuzzy logic
(:class:`LogicProblemSet`, ``--task logic``): ``x`` inputs, ``y`` the last token's target,
``targets`` every token's, ``terms`` and ``term_ids`` the task.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import _core
from ._arrays import as_f32, as_i64, as_int, as_opt_int, as_seed, as_u8, rows
from ._errors import InputError

__all__ = ["ProblemSet", "LogicProblemSet", "sample", "splits", "logic_split", "RULES"]

#: SRAVEN's rules by index (``label``, ``rules`` and the tables use these indices).
RULES = (
    "constant",
    "progression +1",
    "progression +2",
    "progression -1",
    "progression -2",
    "addition",
    "subtraction",
    "distribute-three",
)


class ProblemSet:
    """A SRAVEN problem set.

    Attributes:
        x: float32 ``[N, T, M]`` one-hot tokens (T = 36, M = 8 by default); the F query tokens are
            all zero.
        y: int64 ``[N, F]`` answer values, in the answer panel's (permuted) slot order.
        rules: int64 ``[N, F]`` the task's rule (0..7, :data:`RULES`) per unpermuted slot.
        perms: int64 ``[N, 3, F]`` the feature shown by each slot of each column, or None.
        meta: how the set was made (split, set, seed, unpermuted), when known.

    Building one from arrays converts their dtypes safely (bool / uint8 / float64 one-hot ``x`` to
    float32, integer arrays to int64) and validates them (one-hot context, zero queries, values and
    rules in range, permutations); a bad array raises :class:`hyperlens.InputError` naming it.
    """

    def __init__(
        self,
        x: Any,
        y: Any,
        rules: Any,
        perms: Any = None,
        *,
        meta: dict | None = None,
        validate: bool = True,
    ) -> None:
        self.x = as_f32(x, "x", 3)
        self.y = as_i64(y, "y", 2)
        self.rules = as_i64(rules, "rules", 2)
        self.perms = None if perms is None else as_i64(perms, "perms", 3)
        self.meta = dict(meta or {})
        if validate:
            _core.tasks.validate_problems(self.x, self.y, self.rules, self.perms)

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitem__(self, idx: Any) -> "ProblemSet":
        """Problems ``idx`` (an int, a slice, an index array or a boolean mask, by numpy's rules: an
        index out of range raises ``IndexError``) as a new set; an int gives a set of one."""
        idx = rows(idx, len(self), "problems")
        return ProblemSet(
            self.x[idx],
            self.y[idx],
            self.rules[idx],
            None if self.perms is None else self.perms[idx],
            meta=_subset_meta(self.meta, idx),
            validate=False,
        )

    def __repr__(self) -> str:
        m = ", ".join(f"{k}={v!r}" for k, v in self.meta.items())
        return f"ProblemSet(n={len(self)}, x={self.x.shape}{', ' + m if m else ''})"

    def as_dict(self) -> dict[str, np.ndarray | None]:
        """The arrays by name, as in the CLI's file."""
        return {"x": self.x, "y": self.y, "rules": self.rules, "perms": self.perms}

    def save(self, path: str | os.PathLike) -> None:
        """Writes the CLI's problem file (``x`` uint8, the rest int64), atomically."""
        _core.tasks.save_sraven(os.fspath(path), self.x, self.y, self.rules, self.perms)

    @classmethod
    def load(cls, path: str | os.PathLike, *, features: int = 4, values: int = 8) -> "ProblemSet":
        """Reads a problem file written by ``hyperlens tasks sample`` (or numpy with its arrays)."""
        d = _core.tasks.load_sraven(os.fspath(path), as_int(features, "features", 1), as_int(values, "values", 1))
        return cls(d["x"], d["y"], d["rules"], d["perms"], meta={"path": os.fspath(path)}, validate=False)


def _subset_meta(meta: dict, idx: Any) -> dict:
    """The ``meta`` of a set's rows ``idx``: a prefix (``[:k]``) is the set sampled with ``n = k``,
    so it keeps how it was made; any other subset is marked ``subset`` (no command reproduces it)."""
    if isinstance(idx, slice) and idx.start in (None, 0) and idx.step in (None, 1):
        return dict(meta)
    return {**meta, "subset": True}


def splits() -> list[dict[str, Any]]:
    """The paper's SRAVEN splits with their task counts (``hyperlens tasks splits``).

    Seeded splits ``seed{N}`` are valid names too (``sample(split="seed3", ...)``).
    """
    return [
        {"name": name, "id_tasks": n_id, "ood_tasks": n_ood}
        for name, n_id, n_ood in _core.tasks.splits()
    ]


def sample(
    task: str = "sraven",
    split: str | None = None,
    set: str = "id",
    n: int = 1024,
    seed: int = 0,
    unpermuted: bool = False,
    *,
    samples: int | None = None,
    frac_test: float | None = None,
    fixed_query: bool = False,
    fixed_context: bool = False,
) -> "ProblemSet | LogicProblemSet":
    """Samples ``n`` problems of ``split``'s ``set`` with ``seed``: the same problems as
    ``hyperlens tasks sample --task TASK --split SPLIT --set SET --n N --seed SEED ...``.

    ``task="sraven"`` (default; ``split`` default ``"paper-seed0"``, ``set`` ``"id"`` or ``"ood"``,
    ``unpermuted`` as ``--unpermuted``): a :class:`ProblemSet` with ``x`` float32 ``[n, 36, 8]``,
    ``y`` and ``rules`` int64 ``[n, 4]``, ``perms`` int64 ``[n, 3, 4]``.

    ``task="logic"`` (``split`` ``"seed{N}"``, default ``"seed0"``; ``set`` ``"id"``, ``"ood"``
    (held-out pairs of known terms) or ``"unknown"``; ``samples`` and ``frac_test`` as
    ``--logic-samples`` / ``--logic-frac-test``, by default the training defaults 32 and 0.7;
    ``fixed_query`` / ``fixed_context`` as ``--fixed-query`` / ``--fixed-context``): a
    :class:`LogicProblemSet` with ``x`` float32 ``[n, T, L + 1]``, ``y`` float32 ``[n]``,
    ``targets`` float32 ``[n, T]``, ``terms`` uint8 ``[n, K, L]``, ``term_ids`` int64 ``[n, K]``
    (T = 32, L = 4, K = 2 by default). Source: ``hyperlens_tasks::logic::sample_logic_set``.

    Errors: :class:`hyperlens.InputError` for an unknown task, split or set, a non-positive ``n``,
    a negative ``seed``, or options of the other task; :class:`hyperlens.BudgetError` (a
    ``MemoryError``) for a size over the memory budget, before anything is allocated.
    """
    n, seed = as_int(n, "n", 1), as_seed(seed)
    if task == "logic":
        if unpermuted:
            raise InputError("`unpermuted` applies to task \"sraven\"")
        split = "seed0" if split is None else split
        d = _core.tasks.sample_logic(
            split, set, n, seed,
            as_opt_int(samples, "samples", 1),
            None if frac_test is None else float(frac_test),
            bool(fixed_query), bool(fixed_context),
        )
        inputs = "fixed_query" if fixed_query else "fixed_context" if fixed_context else "uniform"
        meta = {"task": "logic", "split": split, "set": set, "seed": int(seed), "inputs": inputs}
        return LogicProblemSet(d["x"], d["y"], d["targets"], d["terms"], d["term_ids"], meta=meta, validate=False)
    if task != "sraven":
        raise InputError(f"task {task!r}: `sample` draws \"sraven\" and \"logic\" problem sets")
    if samples is not None or frac_test is not None or fixed_query or fixed_context:
        raise InputError("`samples`, `frac_test`, `fixed_query` and `fixed_context` apply to task \"logic\"")
    split = "paper-seed0" if split is None else split
    d = _core.tasks.sample_sraven(split, set, n, seed, bool(unpermuted))
    meta = {"split": split, "set": set, "seed": int(seed), "unpermuted": bool(unpermuted)}
    return ProblemSet(d["x"], d["y"], d["rules"], d["perms"], meta=meta, validate=False)


def logic_split(split: str = "seed0", *, samples: int | None = None, frac_test: float | None = None) -> dict[str, int]:
    """The task counts of the fuzzy-logic split ``seed{N}``: ``{"id": ..., "ood": ...,
    "unknown": ...}`` (pairs of terms; ``hyperlens_tasks::logic::LogicSplit``)."""
    n_id, n_ood, n_unknown = _core.tasks.logic_split(
        split, as_opt_int(samples, "samples", 1), None if frac_test is None else float(frac_test)
    )
    return {"id": n_id, "ood": n_ood, "unknown": n_unknown}


class LogicProblemSet:
    """A fuzzy-logic problem set (``hyperlens tasks sample --task logic``): sequences of T tokens
    whose target is ``f(x) = max over K terms of min over the L literals`` (Zadeh's fuzzy logic;
    ``docs/spec/sraven.md``, "The fuzzy-logic task").

    Attributes:
        x: float32 ``[N, T, L + 1]`` inputs: L values in [0, 1), then the previous token's target
            (0 in the last token, whose target the model predicts).
        y: float32 ``[N]`` the last token's target.
        targets: float32 ``[N, T]`` every token's target (the R² denominator is their variance).
        terms: uint8 ``[N, K, L]`` the task's terms as bits (1: the variable, 0: its negation).
        term_ids: int64 ``[N, K]`` the terms' indices (binary order of the bits).
        meta: how the set was made (split, set, seed, inputs), when known.

    Building one from arrays converts dtypes safely and validates them (shapes, values in [0, 1],
    each term's bits those of its index); a bad array raises :class:`hyperlens.InputError` or
    :class:`hyperlens.ShapeError` naming it.
    """

    def __init__(
        self,
        x: Any,
        y: Any,
        targets: Any,
        terms: Any,
        term_ids: Any,
        *,
        meta: dict | None = None,
        validate: bool = True,
    ) -> None:
        self.x = as_f32(x, "x", 3)
        self.y = as_f32(y, "y", 1)
        self.targets = as_f32(targets, "targets", 2)
        self.terms = as_u8(terms, "terms", 3)
        self.term_ids = as_i64(term_ids, "term_ids", 2)
        self.meta = dict(meta or {})
        if validate:
            _core.tasks.validate_logic(self.x, self.y, self.targets, self.terms, self.term_ids)

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitem__(self, idx: Any) -> "LogicProblemSet":
        """Sequences ``idx`` (an int, a slice, an index array or a boolean mask, by numpy's rules: an
        index out of range raises ``IndexError``) as a new set; an int gives a set of one."""
        idx = rows(idx, len(self), "sequences")
        return LogicProblemSet(
            self.x[idx], self.y[idx], self.targets[idx], self.terms[idx], self.term_ids[idx],
            meta=_subset_meta(self.meta, idx), validate=False,
        )

    def __repr__(self) -> str:
        m = ", ".join(f"{k}={v!r}" for k, v in self.meta.items())
        return f"LogicProblemSet(n={len(self)}, x={self.x.shape}{', ' + m if m else ''})"

    def as_dict(self) -> dict[str, np.ndarray]:
        """The arrays by name, as in the CLI's file."""
        return {"x": self.x, "y": self.y, "targets": self.targets, "terms": self.terms, "term_ids": self.term_ids}

    def _arrays(self) -> tuple[np.ndarray, ...]:
        return self.x, self.y, self.targets, self.terms, self.term_ids

    def save(self, path: str | os.PathLike) -> None:
        """Writes the CLI's logic problem file (``hyperlens_tasks::npz::save_logic``), atomically."""
        _core.tasks.save_logic_file(os.fspath(path), *self._arrays())

    @classmethod
    def load(
        cls, path: str | os.PathLike, *, variables: int = 4, terms: int = 2, samples: int = 32
    ) -> "LogicProblemSet":
        """Reads a logic problem file written by ``hyperlens tasks sample --task logic`` (or numpy
        with its arrays), checked against the task's sizes (L ``variables``, K ``terms``, T
        ``samples``; the training defaults) by ``hyperlens_tasks::npz::load_logic``."""
        d = _core.tasks.load_logic_file(os.fspath(path), as_int(variables, "variables", 1), as_int(terms, "terms", 1), as_int(samples, "samples", 1))
        return cls(d["x"], d["y"], d["targets"], d["terms"], d["term_ids"], meta={"task": "logic", "path": os.fspath(path)}, validate=False)
