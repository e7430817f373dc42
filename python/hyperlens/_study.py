"""The latent-code study of a language model from Python: :func:`lm_study` (``hyperlens study``)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from . import _core
from ._arrays import as_int, as_seed

__all__ = ["lm_study", "StudyResult"]


@dataclass(frozen=True)
class StudyResult:
    """What :func:`lm_study` wrote and found.

    ``index``: the HTML page; ``verdict``: the verdict sentence (also on the page and in
    ``summary.json``); ``elapsed_s``: wall-clock seconds; ``peak_rss_bytes``: the process's peak
    resident memory in bytes (Linux; ``None`` elsewhere)."""

    index: Path
    verdict: str
    elapsed_s: float
    peak_rss_bytes: int | None


def lm_study(
    model: str | os.PathLike,
    out: str | os.PathLike,
    *,
    n_relations: int = 500,
    n_icl: int = 600,
    shots: int = 5,
    seed: int = 0,
    split_seeds: Sequence[int] = (0, 1, 2),
    batch: int = 16,
    n_bootstrap: int = 1000,
    transplant_n: int = 200,
    device: str = "cpu",
    progress: bool | Callable[[dict], Any] = False,
) -> StudyResult:
    """The latent-code study of a language model, as ``hyperlens study MODEL --out OUT``
    (``hyperlens_report::lm_study::run``; methods in ``docs/lm-study.md``): Experiment 1
    (structural relations decoded from the latent codes on held-out vocabulary, the positive
    control), Experiment 2 (the operation of in-context prompts decoded on held-out operation x
    domain combinations, on each hold-out seed of ``split_seeds``, with the lens's controls), the
    latent-code transplant at the best layer, and a verdict against thresholds fixed in the code,
    written as ``index.md``, ``index.html``, tables, figures and ``summary.json`` into ``out``.

    ``model``: a GGUF file or a Hugging Face or hyperlens token-model directory with a tokenizer.
    ``progress``: True prints each stage on stderr; a callable receives dicts with ``stage``,
    ``done``, ``total`` and ``unit``. An exception of the callback, or Ctrl-C, stops the study and
    is raised; a previous report at ``out`` stays whole (the report is built beside it and swapped
    in when complete). Errors: ``InputError`` for bad settings or an ``out`` that is not a
    previous report; ``CheckpointError`` for a model that is not a language model or has no
    tokenizer.
    """
    if progress is True:
        def progress(e: dict) -> None:  # type: ignore[misc]
            if e["done"] in (0, e["total"]):
                print(f"study: {e['stage']} {e['done']}/{e['total']} {e['unit']}", file=sys.stderr)
    cb = progress if callable(progress) else None
    index, verdict, elapsed, peak = _core.report.lm_study(
        os.fspath(model), os.fspath(out), as_int(n_relations, "n_relations"), as_int(n_icl, "n_icl"),
        as_int(shots, "shots"), as_seed(seed), [as_seed(s) for s in split_seeds], as_int(batch, "batch"),
        as_int(n_bootstrap, "n_bootstrap"), as_int(transplant_n, "transplant_n"), str(device), cb,
    )
    return StudyResult(index=Path(index), verdict=str(verdict), elapsed_s=float(elapsed), peak_rss_bytes=peak)
