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
            meta=_subset_meta(self.meta, idx, len(self)),
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


def _subset_meta(meta: dict, idx: Any, n: int) -> dict:
    """The ``meta`` of the rows ``idx`` (a numpy index from :func:`rows`) of a set of ``n``, as
    ``hyperlens_report::code_explorer::ProblemOrigin::keeps_origin`` decides: a prefix keeps how
    the set was made, any other subset is marked ``subset``."""
    return _core.tasks.rows_meta(meta, np.arange(n, dtype=np.int64)[idx])


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
            meta=_subset_meta(self.meta, idx, len(self)), validate=False,
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


# --- Prompt sets for language models (``hyperlens_tasks::prompts``) -----------------------------

import json as _json  # noqa: E402

__all__ += ["PromptSet", "prompts", "load_prompts", "icl", "relations"]


class PromptSet:
    """A validated set of text prompts for a language model, as in a JSONL prompt file
    (``hyperlens tasks prompts``; the format is documented in ``hyperlens_tasks::prompts``).

    Each prompt is a dict ``{"segments": [{"text": str, "role": str}, ...], "labels": {str: str},
    "answer": str, "split": "train" | "test"}`` (``labels``, ``answer`` and ``split`` optional).
    ``len(ps)`` is the number of prompts, ``ps[i]`` prompt ``i`` as such a dict (a copy).

    Attributes:
        factors: ``{name: [values sorted]}``, names sorted; a value's index is its position in its
            list (the ``factors`` of ``codes.json``).
        splits: every prompt's split, ``"train"``, ``"test"`` or None.
        sites: the recommended site spec (e.g. ``"query: last; keys: demo_output, query_input"``)
            of a generated set, None for a loaded or built one.
        texts: every prompt's text (its segments joined).
        origin: where the prompts came from (a path, or the generator call).
    """

    def __init__(self, core: Any) -> None:
        self._core = core

    def __len__(self) -> int:
        return len(self._core)

    def __getitem__(self, i: int) -> dict[str, Any]:
        n = len(self)
        k = as_int(i, "index", -n, n - 1) if n else as_int(i, "index")
        return _json.loads(self._core.prompt_json(k + n if k < 0 else k))

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        f = ", ".join(f"{k} ({len(v)})" for k, v in self.factors.items())
        return f"PromptSet({len(self)} prompts, factors: {f or 'none'}, from {self.origin})"

    @property
    def factors(self) -> dict[str, list[str]]:
        return {name: list(values) for name, values in self._core.factors}

    @property
    def splits(self) -> list[str | None]:
        return list(self._core.splits)

    @property
    def sites(self) -> str | None:
        return self._core.sites

    @property
    def texts(self) -> list[str]:
        return list(self._core.texts())

    @property
    def origin(self) -> str:
        return self._core.origin

    def factor_matrix(self) -> np.ndarray:
        """int64 ``[N, F]``: each prompt's value index for each factor of :attr:`factors` (in its
        order), -1 where the prompt lacks the label."""
        return self._core.factor_matrix()

    def unseen_in_training(self) -> list[str]:
        """The label values (``"vocab=b"``) and value pairs (``"domain=digits,operation=next"``)
        that test prompts have and no training prompt has."""
        return list(self._core.unseen_in_training())

    def check_sites(self, sites: str) -> tuple[int, int]:
        """Checks a site spec against the prompts' roles before tokenization (unknown role,
        ``#j`` out of range, unequal counts; token indices ``[i]`` need the tokens) and returns
        ``(Q, K)``, the numbers of query and key positions per prompt. Raises
        :class:`hyperlens.InputError` naming the prompt and the item."""
        return tuple(self._core.check_sites(str(sites)))  # type: ignore[return-value]

    def save(self, path: str | os.PathLike) -> None:
        """Writes the set as a JSONL prompt file, atomically; :func:`load_prompts` gives it back."""
        self._core.save(os.fspath(path))


def prompts(items: Any) -> PromptSet:
    """A :class:`PromptSet` from a list of prompt dicts, validated by the same code that reads a
    prompt file: unknown keys, a split other than ``"train"``/``"test"``, no segment, an empty
    role or an empty text raise :class:`hyperlens.InputError` naming the prompt by index.

    >>> ps = hl.tasks.prompts([{"segments": [{"text": "The cat", "role": "context"},
    ...                                       {"text": " sat", "role": "query"}],
    ...                         "labels": {"relation": "none"}}])
    """
    if isinstance(items, (dict, str, bytes)) or not hasattr(items, "__iter__"):
        raise InputError(f"`items` must be a list of prompt dicts, got {type(items).__name__}")
    texts = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InputError(f"prompt {i}: must be a dict, got {type(item).__name__}")
        try:
            texts.append(_json.dumps(item, ensure_ascii=False))
        except (TypeError, ValueError) as e:
            raise InputError(f"prompt {i}: not JSON-serialisable: {e}") from None
    return PromptSet(_core.prompts.from_json_items(texts))


def load_prompts(path: str | os.PathLike) -> PromptSet:
    """Reads a JSONL prompt file; a bad line raises an error naming the file and the line."""
    return PromptSet(_core.prompts.load(os.fspath(path)))


def icl(
    n: int | None = None,
    seed: int = 0,
    shots: int | None = None,
    *,
    hold_out: float | None = None,
) -> PromptSet:
    """The ``icl`` generator (``hyperlens tasks prompts --generator icl``): few-shot prompts
    ``Q: x\\nA: y\\n\\n ... Q: x\\nA:`` of an operation (``copy``, ``next``, ``previous``,
    ``skip_forward``, ``skip_back``) on a domain (``lower``, ``upper``, ``digits``,
    ``number_words``, ``weekdays``, ``months``), labels ``operation`` and ``domain``, the answer in
    ``answer``, a quarter of the combinations held out (``split``). Defaults (None): 300 prompts,
    5 shots, ``hold_out=0.25``. ``sites`` is ``"query: last; keys: demo_output, query_input"``."""
    return PromptSet(
        _core.prompts.icl_set(
            as_opt_int(n, "n", 1),
            as_seed(seed),
            as_opt_int(shots, "shots", 1),
            None if hold_out is None else float(hold_out),
        )
    )


def relations(
    n: int | None = None,
    seed: int = 0,
    words: Any = None,
    *,
    min_len: int | None = None,
    max_len: int | None = None,
    test_fraction: float | None = None,
) -> PromptSet:
    """The ``relations`` generator (``hyperlens tasks prompts --generator relations``): prompts of
    space-separated words whose ``key`` word stands in one relation to the last (``query``) word,
    label ``relation`` (``previous``, ``induction``, ``duplicate``, ``bracket``, ``none``); the
    vocabulary (``words``, e.g. a model's single-token words; None = the project's 64 common
    words) split in two disjoint halves, ``a`` for training and ``b`` for test prompts (label
    ``vocab``). Defaults (None): 500 prompts of 8 to 16 words, half of them test.
    ``sites`` is ``"query: query; keys: key"``."""
    if words is not None:
        if isinstance(words, (str, bytes)):
            raise InputError("`words` must be a list of words, got a string")
        words = list(words)
        for i, w in enumerate(words):
            if not isinstance(w, str):
                raise InputError(f"`words`: word {i} must be a string, got {type(w).__name__}")
    return PromptSet(
        _core.prompts.relations_set(
            as_opt_int(n, "n", 1),
            as_seed(seed),
            words,
            as_opt_int(min_len, "min_len", 1),
            as_opt_int(max_len, "max_len", 1),
            None if test_fraction is None else float(test_fraction),
        )
    )
