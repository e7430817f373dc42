"""Training runs and the main job's report from Python: :func:`train` (``hyperlens train``) and
:func:`report` (``hyperlens report``)."""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from . import _core
from ._arrays import U64_MAX, as_int, as_seed
from ._errors import InputError

__all__ = ["train", "TrainResult", "report", "TRAIN_OPTIONS"]

#: The keyword arguments of :func:`train` and the field of the run's settings (``train_state.json``)
#: each sets; the names are those of ``hyperlens train``'s flags.
TRAIN_OPTIONS: dict[str, tuple[str, ...]] = {
    "mixer": ("mixer",),
    "split": ("split",),
    "steps": ("steps",),
    "batch": ("batch",),
    "seed": ("seed",),
    "lr": ("lr",),
    "weight_decay": ("weight_decay",),
    "warmup": ("warmup",),
    "dropout": ("dropout",),
    "layers": ("layers",),
    "width": ("width",),
    "attn_only": ("attn_only",),
    "eval_every": ("eval_every",),
    "eval_n": ("eval_n",),
    "eval_seed": ("eval_seed",),
    "checkpoint_every": ("checkpoint_every",),
    "log_every": ("log_every",),
    "features": ("sraven", "features"),
    "values": ("sraven", "values"),
    "holdout": ("sraven", "holdout_fraction"),
    "logic_samples": ("logic", "samples"),
    "logic_frac_test": ("logic", "frac_test"),
    "vocab": ("induction", "vocab"),
    "seq_len": ("induction", "seq_len"),
    "bigram_strength": ("induction", "bigram_strength"),
    "repeat_prob": ("induction", "repeat_prob"),
}
_SIZE = ("d_model", "heads", "d_head", "d_mlp")


@dataclass(frozen=True)
class TrainResult:
    """One run's outcome.

    Attributes:
        out: the run directory (a checkpoint: ``hl.load(out)``).
        step: updates done when the session ended.
        completed: whether the run reached its total (False when stopped; ``resume=True``
            continues it).
        record: ``train.json`` when completed (the settings, timings and final evaluation).
        last_eval: the last evaluation of the session, if any.
        error: the run's error message if it failed (a diverged run of a group), else None.
        summary: the closing lines ``hyperlens train`` prints.
    """

    out: Path
    step: int
    completed: bool
    record: dict | None
    last_eval: dict | None
    error: str | None
    summary: list

    def load(self) -> Any:
        """The trained model (:func:`hyperlens.load` of :attr:`out`)."""
        from ._model import load

        return load(self.out)


def _apply(settings: dict, options: dict[str, Any]) -> dict:
    for key, value in options.items():
        if key not in TRAIN_OPTIONS:
            known = ", ".join(sorted([*TRAIN_OPTIONS, *_SIZE]))
            raise InputError(f"train: unknown setting {key!r} (known: {known})")
        path = TRAIN_OPTIONS[key]
        d = settings
        for part in path[:-1]:
            d = d[part]
        d[path[-1]] = _typed(key, value, d.get(path[-1]))
    return settings


def _typed(key: str, value: Any, default: Any) -> Any:
    """``value`` of the keyword ``key`` checked against the type of its default setting: a bool, an
    integer in the core's range, a finite number or a string, else an ``InputError`` naming
    ``key`` (the settings travel as JSON, whose parser could not name it)."""
    if isinstance(default, bool):
        if not isinstance(value, (bool, np.bool_)):
            raise InputError(f"`{key}` must be True or False, got {value!r}")
        return bool(value)
    if isinstance(default, int):
        return as_int(value, key, 0, U64_MAX)
    if isinstance(default, float):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise InputError(f"`{key}` must be a number, got {value!r}")
        if not math.isfinite(float(value)):
            raise InputError(f"`{key}` must be a finite number, got {value!r}")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise InputError(f"`{key}` must be a string, got {value!r}")
    return value


class _Bar:
    """A text progress bar on stderr (tqdm's when tqdm is installed), with the CLI's lines."""

    def __init__(self) -> None:
        try:
            from tqdm.auto import tqdm  # type: ignore

            self._tqdm: Any = tqdm
        except ImportError:
            self._tqdm = None
        self._bar: Any = None
        self._last = -1
        self._open = False

    def __call__(self, e: dict) -> None:
        if e.get("line"):
            if self._bar is not None and self._tqdm is not None:
                self._bar.write(e["line"])
            else:
                if self._open:
                    print(file=sys.stderr)
                    self._open = False
                print(e["line"], file=sys.stderr, flush=True)
        if e["event"] == "start" and self._tqdm is not None:
            self._bar = self._tqdm(total=e["total"], initial=e["step"], unit="step")
        elif e["event"] == "step":
            done, total = e["step"] + 1, e["total"]
            if self._bar is not None:
                self._bar.update(done - self._bar.n)
            elif self._tqdm is None and (done == total or done * 20 // total != self._last):
                self._last = done * 20 // total
                bar = "#" * self._last + "." * (20 - self._last)
                print(f"\r[{bar}] {done}/{total}", end="" if done < total else "\n", file=sys.stderr, flush=True)
                self._open = done < total

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def train(
    out: str | os.PathLike,
    *,
    task: str | None = None,
    resume: bool = False,
    device: str = "cpu",
    progress: bool | Callable[[dict], Any] = True,
    seeds: Sequence[int] | None = None,
    splits: Sequence[str] | None = None,
    grid: bool = False,
    d_model: int | None = None,
    heads: int | None = None,
    d_head: int | None = None,
    d_mlp: int | None = None,
    **settings: Any,
) -> "TrainResult | list[TrainResult]":
    """Trains a model into the run directory ``out`` with the paper's recipe, as
    ``hyperlens train --out OUT [--task TASK] [--resume] ...`` does (``hyperlens_train::train``).

    ``task``: ``"sraven"`` (default), ``"logic"`` or ``"induction"``. The other settings are the
    train command's flags as keyword arguments (:data:`TRAIN_OPTIONS`: ``mixer``, ``split``,
    ``steps``, ``batch``, ``seed``, ``lr``, ``weight_decay``, ``warmup``, ``dropout``, ``layers``,
    ``width``, ``attn_only``, ``eval_every``, ``eval_n``, ``eval_seed``, ``checkpoint_every``,
    ``log_every``, ``features``, ``values``, ``holdout``, ``logic_samples``, ``logic_frac_test``,
    ``vocab``, ``seq_len``, ``bigram_strength``, ``repeat_prob``; and ``d_model``, ``heads``,
    ``d_head``, ``d_mlp`` together for an explicit size); unset ones take the task's defaults,
    or with ``resume=True`` the run's saved settings.

    A group trained together in one batched model: ``seeds=[...]``, ``splits=[...]``, or a list
    for ``lr`` / ``weight_decay`` (zipped, or every combination with ``grid=True``); ``out`` is
    then the group's directory and the result a list, one :class:`TrainResult` per run.
    ``resume=True`` on a group's directory continues its unfinished runs.

    ``progress``: True (a bar on stderr, tqdm's when installed, and the CLI's lines), False, or a
    callable that receives every event as a dict (``event``: ``start``, ``step``, ``row``,
    ``evaluated``, ``checkpoint``; ``run``, ``step``, ``total``, ``line``, ...) and may return
    True to stop. Stopping, an exception in the callback, or Ctrl-C ends the run at the end of the
    current update with a checkpoint (the exception is re-raised; ``KeyboardInterrupt`` for
    Ctrl-C); ``resume=True`` continues it exactly. Updates run with the GIL released.

    Errors: ``InputError`` for an unknown or invalid setting, a non-empty ``out`` without
    ``resume``; ``CheckpointError`` when ``resume`` finds no run; ``NumericalError`` for a
    diverged run (of one run; in a group the other runs finish and the diverged one reports its
    ``error``).
    """
    out = Path(os.fspath(out))
    lists = {"lr": settings.get("lr"), "weight_decay": settings.get("weight_decay")}
    lrs = [_typed(f"lr[{i}]", v, 0.0) for i, v in enumerate(lists["lr"])] if isinstance(lists["lr"], (list, tuple)) else []
    wds = [_typed(f"weight_decay[{i}]", v, 0.0) for i, v in enumerate(lists["weight_decay"])] if isinstance(lists["weight_decay"], (list, tuple)) else []
    for k, vals in (("lr", lrs), ("weight_decay", wds)):
        if vals:
            if len(vals) == 1:
                settings[k] = vals[0]
            else:
                settings.pop(k)
    lrs = lrs if len(lrs) > 1 else []
    wds = wds if len(wds) > 1 else []
    is_group = bool(seeds) or bool(splits) or bool(lrs) or bool(wds)
    size = [d_model, heads, d_head, d_mlp]
    if any(v is not None for v in size) and not all(v is not None for v in size):
        raise InputError("train: give d_model, heads, d_head and d_mlp together (an explicit size)")

    def edit(base: dict) -> str:
        if task is not None and base["task"] != task:
            raise InputError(f"train: task {task!r}: the run in {out} trains {base['task']}")
        s = _apply(base, settings)
        if d_model is not None:
            s["size"] = {
                "d_model": as_int(d_model, "d_model", 1),
                "n_heads": as_int(heads, "heads", 1),
                "d_head": as_int(d_head, "d_head", 1),
                "d_mlp": as_int(d_mlp, "d_mlp", 1),
            }
        return json.dumps(s, allow_nan=False)

    runs: list[tuple[Any, str]]
    group_runs = _core.train.group_runs(os.fspath(out)) if resume else None
    if group_runs is not None:
        if is_group:
            raise InputError(f"train: {out} is a group; resume it without seeds, splits or lists")
        runs = [(d, edit(s)) for d, s in group_runs]
        if not runs:
            return []
    elif is_group:
        if resume:
            raise InputError(f"train: resume with lists: {out} has no group.json")
        base = edit(_core.train.default_settings(task or "sraven"))
        runs = list(_core.train.plan_group(
            os.fspath(out), base, [as_seed(s, f"seeds[{i}]") for i, s in enumerate(seeds or [])], [str(s) for s in splits or []], lrs, wds, bool(grid)
        ))
    else:
        base = _core.train.run_settings(os.fspath(out)) if resume else _core.train.default_settings(task or "sraven")
        runs = [(os.fspath(out), edit(base))]
    for _, s in runs[:1]:
        warnings = _core.train.check_settings(s)
        if progress is True:
            for w in warnings:
                print(f"warning: {w}", file=sys.stderr)
    bar = _Bar() if progress is True else None
    callback = bar if bar is not None else (progress if callable(progress) else None)
    try:
        results = _core.train.train_runs(runs, str(device), bool(resume), callback)
    finally:
        if bar is not None:
            bar.close()
    out_list = []
    for (d, _), (outcome, error, summary) in zip(runs, results):
        o = outcome if outcome is not None else {}
        out_list.append(
            TrainResult(
                out=Path(d), step=int(o.get("step", 0)), completed=bool(o.get("completed", False)),
                record=o.get("record"), last_eval=o.get("last_eval"), error=error, summary=list(summary),
            )
        )
    if progress is True:
        for r in out_list:
            for line in r.summary:
                print(line, file=sys.stderr)
    if group_runs is None and not is_group:
        return out_list[0]
    return out_list


def report(
    out: str | os.PathLike,
    checkpoints: Sequence[str | os.PathLike] = (),
    *,
    n: int = 2048,
    split: str | None = None,
    seed: int = 0,
    device: str = "cpu",
    batch: int = 256,
    causal_n: int = 128,
    aggregate: bool = False,
    progress: bool | Callable[[dict], Any] = False,
) -> Path:
    """The main job, as ``hyperlens report --out OUT [--checkpoint DIR ...] --n N --split SPLIT
    --seed SEED --batch B --causal-n C`` (``hyperlens_report::run``): accuracy, latent codes and
    their analyses for every checkpoint (all under ``data/checkpoints/`` when none is given),
    figures, tables and a Markdown + HTML page in ``out``. Returns the path of ``index.html``.

    ``progress``: True prints the stages on stderr; a callable receives each stage as a dict
    (``stage``: ``checkpoint``, ``codes``, ``logic_codes``, ``analysis``, ``causal``,
    ``figures``, ``skipped``; ``done``, ``total``, ...). An exception of the callback, or Ctrl-C
    (checked at every batch of codes and every analysis or transplant step), stops the report
    there and is raised: nothing is left half-written, and a previous report at ``out`` stays
    whole (the report is built in a staging directory and swapped in when complete). Errors:
    ``InputError`` for ``n < 16`` or ``batch`` 0; ``NotFoundError`` when there is no checkpoint.
    """
    if progress is True:
        def progress(e: dict) -> None:  # type: ignore[misc]
            what = e.get("dir") or e.get("name") or ""
            print(f"report: {e['stage']} {what} {e.get('done', '')}/{e.get('total', '')}", file=sys.stderr)
    cb = progress if callable(progress) else None
    index, _n, _s = _core.report.report(
        [os.fspath(c) for c in checkpoints], os.fspath(out), as_int(n, "n"), None if split is None else str(split), as_seed(seed), str(device),
        as_int(batch, "batch"), as_int(causal_n, "causal_n"), bool(aggregate), cb,
    )
    return Path(index)
