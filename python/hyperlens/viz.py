"""Interactive figures in notebooks: the latent-space explorer and attention patterns.

>>> fig = hl.viz.scatter({"ID": id_codes, "OOD": ood_codes}, layer=3, color="rule",
...                      problems={"ID": id_set, "OOD": ood_set})
>>> fig                      # shown inline (``_repr_html_``): hover, click, legend, zoom
>>> fig.save("explorer.html")   # or .svg (standalone, interactive) or .png (static)
>>> hl.viz.attention(model, ood, layer=3)

The figures are drawn by hyperlens's Rust ``viz`` crate (the same SVG element as the report's
``figures/<name>_explorer.svg`` and ``_attention.svg``); the projections are the analysis crate's
PCA (fit on the last set, every set projected on its axes) or t-SNE. Everything is inside the
figure: no CDN, no network, and it opens from ``file://``.
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

import numpy as np

from . import _core
from ._codes import CodeSet, LogicCodeSet
from ._errors import InputError
from .tasks import RULES, ProblemSet

__all__ = ["Figure", "scatter", "attention", "token_labels"]


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
    (the report's labels)."""
    n_ctx = n_tokens - features
    return [f"P{t // features}s{t % features}" if t < n_ctx else f"Q{t - n_ctx}" for t in range(n_tokens)]


def _site(site: str | None, n_tokens: int = 36, features: int = 4) -> tuple[int, list[int]]:
    """The query and keys of a code set's site: ``paper`` (the last token, keys of the same slot in
    panels 6 and 7) or ``query:I;keys:J,K``."""
    if site is None or site == "paper":
        q = n_tokens - 1
        return q, [q - 2 * features, q - features]
    m = re.fullmatch(r"query:(\d+);keys:([\d,]+)", site.replace(" ", ""))
    if not m:
        raise InputError(f"site {site!r}: the explorer draws sites `paper` or `query:I;keys:J,K`")
    return int(m.group(1)), [int(k) for k in m.group(2).split(",")]


def _as_sets(x: Any) -> dict[str, Any]:
    """A mapping of named sets; one set alone is named "OOD" (the report's main set)."""
    if isinstance(x, Mapping):
        return dict(x)
    return {"OOD": x}


def _reproduce(p: ProblemSet | None, n: int) -> str:
    m = getattr(p, "meta", None) or {}
    if {"split", "set", "seed"} <= set(m):
        unp = " --unpermuted" if m.get("unpermuted") else ""
        return f"hyperlens tasks sample --split {m['split']} --set {m['set']} --n {n} --seed {m['seed']}{unp} --out problems.npz"
    return ""


def _sraven_set(name: str, c: CodeSet, p: ProblemSet | None, query: int, keys: list[int]) -> dict:
    n = len(c)
    index = c.problem if c.problem is not None else np.arange(n, dtype=np.int64)
    target = c.target if c.target is not None else np.zeros(n, np.int64)
    fields: list[dict] = [{"name": "rule", "kind": "cat", "values": c.label, "names": list(RULES)}]
    if c.target is not None:
        fields.append({"name": "target", "kind": "int", "values": c.target})
    if c.prediction is not None:
        fields.append({"name": "prediction", "kind": "int", "values": c.prediction})
    if c.correct is not None:
        fields.append({"name": "correct", "kind": "bool", "values": c.correct})
    problems = None
    if p is not None:
        if c.prediction is None:
            raise InputError(f"{name}: drawing the problems needs the codes' `prediction`")
        f = p.y.shape[1]
        rows = p.x[index]  # [N, T, M] one-hot; the panels' values are the tokens' indices
        ctx = rows[:, : 8 * f, :].argmax(axis=2).reshape(n, 8, f)
        vals = np.concatenate([ctx, p.y[index][:, None, :]], axis=1).astype(np.int64)
        slot = c.slot if c.slot is not None else np.full(n, query % f, np.int64)
        problems = {"values": vals, "slot": slot, "prediction": c.prediction, "marked": keys, "query": query}
    return {
        "name": name,
        "reproduce": _reproduce(p, len(p) if p is not None else n),
        "codes": c.codes,
        "index": np.asarray(index, np.int64),
        "colors": [c.label, target],
        "fields": fields,
        "problems": problems,
    }


def _logic_set(name: str, c: LogicCodeSet) -> dict:
    first = c.term_ids[:, 0].astype(np.int64)
    terms = [", ".join(f"t{int(t)}" for t in row) for row in c.term_ids]
    return {
        "name": name,
        "reproduce": "",
        "codes": c.codes,
        "index": c.problem if c.problem is not None else np.arange(len(c.codes), dtype=np.int64),
        "colors": [first],
        "fields": [
            {"name": "terms", "kind": "text", "values": terms},
            {"name": "target", "kind": "float", "values": c.target.astype(np.float64)},
            {"name": "prediction", "kind": "float", "values": c.prediction.astype(np.float64)},
        ],
        "problems": None,
    }


def scatter(
    codes: CodeSet | LogicCodeSet | Mapping[str, CodeSet | LogicCodeSet],
    layer: int | None = None,
    color: str = "rule",
    *,
    problems: ProblemSet | Mapping[str, ProblemSet] | None = None,
    projection: str = "pca",
    title: str | None = None,
    seed: int = 0,
) -> Figure:
    """The latent-space explorer of one or more code sets (e.g. ``{"ID": id_codes, "OOD": ood}``;
    the last is shown first and, for PCA, fixes the axes).

    Args:
        codes: a :class:`CodeSet` (SRAVEN) or :class:`LogicCodeSet`, or a mapping name -> set.
        layer: the layer shown first (an index along the codes' ``L`` axis); all are switchable.
        color: ``"rule"`` or ``"target"`` (the answer value) for SRAVEN codes; ``"term"`` for logic.
        problems: the problem set(s) the codes were read from (same names), drawn on click.
        projection: ``"pca"`` or ``"tsne"``.
    """
    sets = _as_sets(codes)
    if not sets:
        raise InputError("no code set given")
    probs = {} if problems is None else _as_sets(problems)
    unknown = set(probs) - set(sets)
    if unknown:
        raise InputError(f"problems for unknown sets {sorted(unknown)} (code sets: {list(sets)})")
    first = next(iter(sets.values()))
    L = first.codes.shape[1]
    if layer is not None and not 0 <= layer < L:
        raise InputError(f"layer {layer} is not below the codes' {L} layers")
    layers = first.layers if getattr(first, "layers", None) and len(first.layers) == L else list(range(L))
    if isinstance(first, LogicCodeSet):
        if color not in ("term",):
            raise InputError(f"color {color!r}: logic codes are coloured by \"term\"")
        n_terms = int(max(int(s.term_ids.max()) for s in sets.values())) + 1
        colorings = [("first term", [f"t{k}" for k in range(n_terms)])]
        payload = [_logic_set(k, v) for k, v in sets.items()]
        q, keys = _site(first.site, 1, 1) if first.site not in (None, "paper") else (0, [0])
        key_names = [f"k{k}" for k in keys] if first.codes.shape[4] == len(keys) else [f"k{k}" for k in range(first.codes.shape[4])]
        title = title or "latent codes"
    else:
        if color not in ("rule", "target", "answer value"):
            raise InputError(f"color {color!r}: SRAVEN codes are coloured by \"rule\" or \"target\"")
        p0 = next(iter(probs.values()), None)
        n_tokens = p0.x.shape[1] if p0 is not None else 36
        values = p0.x.shape[2] if p0 is not None else 8
        features = p0.y.shape[1] if p0 is not None else 4
        q, keys = _site(first.site, n_tokens, features)
        tok = token_labels(n_tokens, features)
        key_names = [tok[k] for k in keys]
        payload = [_sraven_set(k, v, probs.get(k), q, keys) for k, v in sets.items()]
        colorings = [("rule", list(RULES)), ("answer value", [str(v) for v in range(values)])]
        if color != "rule":
            colorings.reverse()
            for s in payload:
                s["colors"].reverse()
        title = title or f"latent codes (query {tok[q]}, keys {' and '.join(key_names)})"
    d = _core.viz.explorer(
        title, payload, colorings, [str(l) for l in layers], key_names, projection=projection, layer=layer, seed=seed
    )
    return Figure("explorer", d["svg"], d["html"], d["png"])


def attention(model: Any, problems: ProblemSet | Any, layer: int | None = None, index: int = 0, *, title: str | None = None) -> Figure:
    """The attention of every head of every layer on problem ``index`` of ``problems`` (a
    :class:`ProblemSet`, or one-hot tokens ``[N, T, M]``), with a layer and a head selector and
    the value under the pointer (as CircuitsVis's ``attention_patterns``). ``layer`` is the layer
    shown first (the last by default)."""
    x = problems.x if hasattr(problems, "x") else np.asarray(problems, np.float32)
    if x.ndim != 3 or not 0 <= index < x.shape[0]:
        raise InputError(f"problem {index} of tokens of shape {x.shape}: need [N, T, M] with N > {index}")
    _, cache = model.run_with_cache(x[index : index + 1], names_filter="blocks.*.attn.hook_pattern")
    n_layers = model.cfg.n_layers
    if layer is not None and not 0 <= layer < n_layers:
        raise InputError(f"layer {layer} is not below the model's {n_layers} layers")
    pattern = np.stack([np.asarray(cache["pattern", l])[0] for l in range(n_layers)]).astype(np.float64)
    tok = token_labels(x.shape[1], model.cfg.n_outputs)
    mixer = getattr(model.cfg, "mixer", None)
    title = title or f"attention on problem {index}" + (f" ({mixer} mixer)" if mixer else "")
    d = _core.viz.patterns(title, pattern, tok, [f"layer {l}" for l in range(n_layers)], None, layer)
    return Figure("attention", d["svg"], d["html"], d["png"])
