"""Interactive figures in notebooks: the latent-space explorer, attention patterns and heatmaps.

>>> fig = hl.viz.scatter({"ID": id_codes, "OOD": ood_codes}, layer=3, color="rule",
...                      problems={"ID": id_set, "OOD": ood_set})
>>> fig                      # shown inline (``_repr_html_``): hover, click, legend, zoom
>>> fig.save("explorer.html")   # or .svg (standalone, interactive) or .png (static)
>>> hl.viz.scatter(ood_codes, layer=3, method="tsne")
>>> hl.viz.attention(model, ood, layer=3)
>>> hl.viz.heatmap(hl.circuits.analyze(lm))            # Q / K / V composition scores
>>> hl.viz.heatmap(hl.patching.head_ablation(model, ood))  # accuracy / loss change per head

The figures are drawn by hyperlens's Rust ``viz`` crate (the same SVG element as the report's
``figures/<name>_explorer.svg``, ``_attention.svg`` and ``_similarity.svg``); the projections
are the analysis crate's PCA (fit on the last set, every set projected on its axes) or t-SNE.
Everything is inside the figure: no CDN, no network, and it opens from ``file://``.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from . import _core
from ._arrays import as_f32, as_int, as_opt_int, as_seed
from ._codes import CodeSet, LogicCodeSet
from ._errors import InputError
from .tasks import ProblemSet

__all__ = ["Figure", "scatter", "attention", "heatmap", "token_labels"]


class Figure:
    """An interactive figure: ``svg`` (a standalone document), ``html`` (the fragment a notebook
    shows), ``png`` (bytes of the static figure of the same data)."""

    def __init__(self, kind: str, svg: str, html: str, png: bytes) -> None:
        self.kind = kind
        self.svg = svg
        self.html = html
        self.png = png

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return f"<hyperlens.viz.Figure {self.kind}: {len(self.svg)} characters of SVG>"

    def save(self, path: str | os.PathLike) -> None:
        """Writes the figure as ``.html`` (a page holding the fragment), ``.svg`` (the interactive
        standalone document) or ``.png`` (static), chosen by the suffix; atomically."""
        p = os.fspath(path)
        ext = os.path.splitext(p)[1].lower()
        if ext == ".svg":
            data = self.svg.encode()
        elif ext in (".html", ".htm"):
            data = (
                "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                "<title>hyperlens figure</title></head><body>\n" + self.html + "\n</body></html>\n"
            ).encode()
        elif ext == ".png":
            data = self.png
        else:
            raise InputError(f"{p}: the suffix must be .html, .svg or .png")
        _core.viz.write(p, data)


def token_labels(n_tokens: int, features: int) -> list[str]:
    """SRAVEN token labels: ``P{panel}s{slot}`` for context tokens, ``Q{slot}`` for the queries
    (the report's labels; ``hyperlens_tasks::sraven::token_labels``)."""
    return _core.viz.token_labels(as_int(n_tokens, "n_tokens"), as_int(features, "features"))


def _named(x: Any) -> list[tuple[str | None, Any]]:
    """A mapping of named sets as (name, set) pairs; one set alone as ``(None, set)`` (the
    library names it)."""
    if isinstance(x, Mapping):
        return [(str(k), v) for k, v in x.items()]
    return [(None, x)]


def scatter(
    codes: CodeSet | LogicCodeSet | Mapping[str, CodeSet | LogicCodeSet],
    layer: int | None = None,
    color: str = "rule",
    *,
    problems: ProblemSet | Mapping[str, ProblemSet] | None = None,
    projection: str = "pca",
    method: str | None = None,
    title: str | None = None,
    seed: int = 0,
) -> Figure:
    """The latent-space explorer of one or more code sets (e.g. ``{"ID": id_codes, "OOD": ood}``;
    the last is shown first and, for PCA, fixes the axes). A set given alone is named ``OOD``.

    Args:
        codes: a :class:`CodeSet` (SRAVEN) or :class:`LogicCodeSet`, or a mapping name -> set.
        layer: the layer shown first (an index along the codes' ``L`` axis); all are switchable.
        color: ``"rule"`` or ``"target"`` (the answer value) for SRAVEN codes; ``"term"`` for logic.
        problems: the problem set(s) the codes were read from (same names), drawn on click.
        projection: ``"pca"`` or ``"tsne"``.
        method: the same as ``projection``; given, it wins. t-SNE is the analysis crate's
            deterministic t-SNE, ``hl.analysis.tsne(codes.features(layer), perplexity=min(30, (N - 1) // 3),
            theta=0, seed=seed)``, run per set and layer on the float64 ``[N, H * Q * K]``
            features (the same embedding on every run: exact up to 2,000 codes, about N^2 work per
            iteration, FFT-interpolated above, about 23 s for 50,000 codes).
        title: the title (by default ``latent codes (query Q3, keys P6s3 and P7s3)`` for the
            codes' site, ``latent codes`` for logic codes).
        seed: the t-SNE seed.

    The figure is built by ``hyperlens_report::code_explorer`` (``sraven_explorer``,
    ``logic_explorer``), the builder of the report's ``figures/<name>_explorer.svg``: the site's
    query and keys, the token labels, the colourings, the hover fields, the problems and the
    projection are the library's. Logic codes are coloured by their first (and second) term,
    named in binary as in the report. Raises ``InputError`` (a bad colour, projection or layer,
    problems for unknown sets, a site of several queries) and ``ShapeError`` (sets whose code axes
    differ).
    """
    if method is not None:
        projection = method
    sets = _named(codes)
    if not sets:
        raise InputError("no code set given")
    first = sets[0][1]
    layer = as_opt_int(layer, "layer")
    layers = getattr(first, "layers", None) or None
    if isinstance(first, LogicCodeSet):
        d = _core.viz.logic_explorer(
            sets, layers=layers, color=color, projection=projection, title=title, layer=layer, seed=as_seed(seed)
        )
    else:
        d = _core.viz.sraven_explorer(
            sets, [] if problems is None else _named(problems), site=first.site, layers=layers, color=color,
            projection=projection, title=title, layer=layer, seed=as_seed(seed),
        )
    return Figure("explorer", d["svg"], d["html"], d["png"])


def attention(model: Any, problems: ProblemSet | Any, layer: int | None = None, index: int = 0, *, title: str | None = None) -> Figure:
    """The attention of every head of every layer on problem ``index`` of ``problems`` (a
    :class:`ProblemSet`, or one-hot tokens ``[N, T, M]``), with a layer and a head selector and
    the value under the pointer (as CircuitsVis's ``attention_patterns``). ``layer`` is the layer
    shown first (the last by default). Built by ``hyperlens_report::code_explorer::attention_explorer``,
    as the report's ``figures/<name>_attention.svg``."""
    x = problems.x if hasattr(problems, "x") else as_f32(problems, "problems", 3)
    index = as_int(index, "index")
    if x.ndim != 3 or not index < x.shape[0]:
        raise InputError(f"problem {index} of tokens of shape {x.shape}: need [N, T, M] with N > {index}")
    layer = as_opt_int(layer, "layer")
    _, cache = model.run_with_cache(x[index : index + 1], names_filter="blocks.*.attn.hook_pattern")
    pattern = np.stack([np.asarray(cache["pattern", l])[0] for l in range(model.cfg.n_layers)]).astype(np.float64)
    d = _core.viz.attention(
        pattern, model.cfg.n_outputs, index, mixer=getattr(model.cfg, "mixer", None), title=title, layer=layer
    )
    return Figure("attention", d["svg"], d["html"], d["png"])


def heatmap(
    values: Any,
    row_labels: Any = None,
    col_labels: Any = None,
    *,
    title: str | None = None,
    value_name: str = "value",
    row_name: str = "",
    col_name: str = "",
    x_label: str = "",
    y_label: str = "",
    cmap: str | None = None,
    range: tuple[float, float] | None = None,
    mask: Any = None,
    panel: str | None = None,
) -> Figure:
    """A heatmap with the row, column and value of the cell under the pointer (the viz crate's
    ``HeatmapExplorer``, the same element as the report's ``figures/<name>_similarity.svg``).

    Args:
        values: one of
            - a float ``[R, C]`` array (any real dtype, read as float64), or a mapping
              name -> ``[R, C]`` array: panels over the same rows and columns, with a switch;
            - a :class:`hyperlens.circuits.CircuitReport`: its Q, K and V composition scores
              (float64 ``[L, H, L, H]`` each), drawn as ``hyperlens circuits`` draws
              ``composition_{q,k,v}.png`` (``L{l}H{h}`` on both axes, earlier head on the rows,
              the pairs whose reading head is not in a later layer masked), titled with the
              random baseline's 99th percentile;
            - a :class:`hyperlens.patching.HeadAblation`: the change in accuracy and in loss
              (nats) with each head ablated, float64 ``[L, H]``, rows ``L{l}``, columns
              ``H{h}``, on a blue-white-red scale symmetric around 0 (as ``patch heads`` draws
              ``head_ablation.png``).
        row_labels, col_labels: R and C labels of a matrix (default: indices).
        title: the title (of every panel of a mapping).
        value_name: the value's name in the hover box and under the colour bar.
        row_name, col_name: names of the rows and columns in the hover box (default: the axis
            labels, else "row" and "column").
        x_label, y_label: axis titles of a matrix.
        cmap: ``"viridis"`` or ``"blue-white-red"``; by default diverging when a value is negative.
        range: the colour range ``(lo, hi)``; by default the data's (symmetric when diverging).
        mask: bool ``[R, C]``: cells drawn grey and left out of the range (they may hold NaN).
        panel: the panel shown first (its name, e.g. ``"k"`` for a circuits report).

    Values are stored as float32 (8 bits over the range above 20,000 cells in all, shown with
    ``≈``) and shown with 4 significant digits. Errors: ``InputError`` for non-finite unmasked
    values, a bad option or more than 512 rows or columns; ``ShapeError`` for labels that do not
    match the values.
    """
    from .circuits import CircuitReport
    from .patching import HeadAblation

    if isinstance(values, CircuitReport):
        d = _core.viz.composition_heatmap(
            {k: np.ascontiguousarray(v, np.float64) for k, v in values.composition.items()},
            values.summary.get("composition", {}).get("baseline_p99", {}), title=title, panel=panel,
        )
        return Figure("heatmap", d["svg"], d["html"], d["png"])
    if isinstance(values, HeadAblation):
        d = _core.viz.head_ablation_heatmap(
            str(values.ablation), np.ascontiguousarray(values.delta_accuracy, np.float64),
            np.ascontiguousarray(values.loss, np.float64), float(values.base["loss"]), title=title, panel=panel,
        )
        return Figure("heatmap", d["svg"], d["html"], d["png"])
    named = list(values.items()) if isinstance(values, Mapping) else [("", values)]
    d = _core.viz.matrix_heatmap(
        [(str(name), np.ascontiguousarray(v, dtype=np.float64)) for name, v in named],
        None if row_labels is None else [str(r) for r in row_labels],
        None if col_labels is None else [str(c) for c in col_labels],
        title=title or "", value_name=value_name, row_name=row_name, col_name=col_name,
        x_label=x_label, y_label=y_label, cmap=cmap,
        range=None if range is None else (float(range[0]), float(range[1])),
        mask=None if mask is None else np.ascontiguousarray(mask, dtype=bool), panel=panel,
    )
    return Figure("heatmap", d["svg"], d["html"], d["png"])


def lm_explorer(analysis: Any, factor: str | None = None, **analyze_kwargs: Any) -> Figure:
    """The latent-space explorer of a language model's code file: the same figure as the
    ``explorer.html`` that ``hyperlens analyze --lm-codes`` writes.

    >>> a = hl.analysis.analyze_lm("codes.npz", factor="operation")
    >>> hl.viz.lm_explorer(a)              # or hl.viz.lm_explorer("codes.npz", factor="operation")

    The points are the rows the analysis projected (the kept, labelled prompts of its
    ``unsupervised_on`` split, as ``seen`` / ``held out``) on its PCA per layer and on the layers
    together (``all``), coloured by each factor (the decoded one first) and by ``correct``. Hover
    shows the prompt index, each factor's value, the target and prediction as token text,
    ``correct`` and ``text``: the prompt's tokens in order, each key token as ``[[tok]]`` and
    each query token as ``<<tok>>`` (shortened around the sites past 72 characters, ``…`` where
    tokens are left out). A click draws the point's code (heads by keys) at the shown layer (at
    ``all``, the mean over the analysed layers). The text comes from the prompt file and the
    model's tokenizer named in ``codes.json``; when either is not there, the figure has no text
    and says which file was missing.

    Args:
        analysis: an :class:`hyperlens.analysis.LmAnalysis` (from ``analyze_lm``), or the path of
            a code file, which is then analysed with ``analyze_lm(path, factor, **analyze_kwargs)``.
        factor: with a path, the factor to decode (default: the file's label factor).

    Raises ``InputError`` (a prompt file whose tokens no longer fit the code file, naming the
    prompt; a model without a tokenizer) and ``analyze_lm``'s errors. Source:
    ``hyperlens_report::lm_explorer::lm_explorer_of``.
    """
    from .analysis import LmAnalysis, analyze_lm

    if not isinstance(analysis, LmAnalysis):
        if not isinstance(analysis, (str, os.PathLike)):
            raise TypeError(f"`analysis` must be an LmAnalysis or a path, got {type(analysis).__name__}")
        analysis = analyze_lm(analysis, factor, **analyze_kwargs)
    elif factor is not None or analyze_kwargs:
        raise InputError("factor and analyze_lm's arguments go with a path, not with an LmAnalysis")
    projections = [(str(name), np.ascontiguousarray(p, dtype=np.float64)) for name, p in analysis.projections.items()]
    d = _core.viz.lm_explorer(
        str(analysis.summary["codes"]),
        str(analysis.summary["factor"]),
        projections,
        np.ascontiguousarray(analysis.structure_prompt, dtype=np.int64),
    )
    return Figure("explorer", d["svg"], d["html"], d["png"])


__all__ += ["lm_explorer"]
