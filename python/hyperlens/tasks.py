"""SRAVEN problem sets as numpy arrays: sample, build from arrays, load and save.

The arrays are those of the CLI's problem files (``hyperlens tasks sample``): ``x`` one-hot tokens
(float32 in memory, uint8 on disk), ``y`` answers, ``rules`` the task's rule per slot, ``perms`` the
feature permutation of each column.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import _core
from ._arrays import as_f32, as_i64
from ._errors import InputError

__all__ = ["ProblemSet", "sample", "splits", "RULES"]

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
        """Problems ``idx`` (a slice, an index array or a boolean mask) as a new set."""
        if isinstance(idx, (int, np.integer)):
            idx = slice(int(idx), int(idx) + 1 if int(idx) != -1 else None)
        return ProblemSet(
            self.x[idx],
            self.y[idx],
            self.rules[idx],
            None if self.perms is None else self.perms[idx],
            meta=self.meta,
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
        d = _core.tasks.load_sraven(os.fspath(path), features, values)
        return cls(d["x"], d["y"], d["rules"], d["perms"], meta={"path": os.fspath(path)}, validate=False)


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
    split: str = "paper-seed0",
    set: str = "id",
    n: int = 1024,
    seed: int = 0,
    unpermuted: bool = False,
) -> ProblemSet:
    """Samples ``n`` problems of ``split``'s ``set`` (``"id"`` or ``"ood"``) with ``seed``: the
    same problems as ``hyperlens tasks sample --split SPLIT --set SET --n N --seed SEED
    [--unpermuted]``.

    Returns a :class:`ProblemSet` with ``x`` float32 ``[n, 36, 8]``, ``y`` and ``rules`` int64
    ``[n, 4]``, ``perms`` int64 ``[n, 3, 4]``. A size over the memory budget raises
    :class:`hyperlens.BudgetError` (a ``MemoryError``) before anything is allocated.
    """
    if task != "sraven":
        raise InputError(
            f"task {task!r}: this version of the Python API samples the SRAVEN task only "
            "(fuzzy-logic sets: `hyperlens tasks sample --task logic`)"
        )
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InputError(f"`n` must be a positive integer, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"`seed` must be a non-negative integer, got {seed!r}")
    d = _core.tasks.sample_sraven(split, set, int(n), int(seed), bool(unpermuted))
    meta = {"split": split, "set": set, "seed": int(seed), "unpermuted": bool(unpermuted)}
    return ProblemSet(d["x"], d["y"], d["rules"], d["perms"], meta=meta, validate=False)
