"""Interventions on a SRAVEN model through its hook points, with TransformerLens's names: head
ablation, activation patching (``get_act_patch_*``), direct logit attribution and the causal
test of the latent code (transplant).

Each function is one call of the library function that ``hyperlens patch`` calls (the
``hyperlens_probe`` crate), so the numbers equal the CLI's files for the same problems and batch:

====================================  =============================  ==========================
function                              CLI                            library
====================================  =============================  ==========================
:func:`head_ablation`                 ``patch heads``                ``head_ablation``
:func:`activation_patching`,          ``patch acts``                 ``feature_swap_pairs`` +
``get_act_patch_*``                                                  ``activation_patching``
:func:`direct_logit_attribution`      ``patch dla``                  ``direct_logit_attribution``
:func:`latent_transplant`             ``patch transplant``           ``latent_transplant``
====================================  =============================  ==========================

Tables are pandas DataFrames when pandas is installed (else dicts of numpy columns), with the
columns of the CLI's CSV files; the arrays are float64 with the exact values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from . import _core
from ._arrays import as_int, as_seed, table
from ._errors import InputError
from .tasks import ProblemSet

__all__ = [
    "head_ablation",
    "HeadAblation",
    "activation_patching",
    "ActivationPatching",
    "get_act_patch_resid_pre",
    "get_act_patch_attn_out",
    "get_act_patch_mlp_out",
    "get_act_patch_attn_head_out_all_pos",
    "direct_logit_attribution",
    "LogitAttribution",
    "latent_transplant",
]


def _sraven(model: Any, problems: Any, what: str) -> tuple[Any, ProblemSet]:
    from ._model import Model

    if not isinstance(model, Model) or model.is_logic:
        raise InputError(f"{what} works on a SRAVEN model (hl.load of a SRAVEN checkpoint), got {model!r}")
    return model._ev, model._problems(problems)


@dataclass(frozen=True)
class HeadAblation:
    """The result of :func:`head_ablation`.

    Attributes:
        ablation: ``"zero"`` or ``"mean"``.
        base: the model's metrics without ablation (``accuracy``, ``per_feature_accuracy``,
            ``loss`` in nats, ``n``).
        accuracy: float64 ``[L, H]`` accuracy (all features right) with head ``(l, h)`` ablated.
        loss: float64 ``[L, H]`` cross-entropy (nats) with the head ablated.
        table: ``head_ablation.csv`` (``layer, head, label, accuracy, loss, delta_accuracy,
            delta_loss``), one row per head.
    """

    ablation: str
    base: dict
    accuracy: np.ndarray
    loss: np.ndarray
    table: Any = field(repr=False)

    @property
    def delta_accuracy(self) -> np.ndarray:
        """float64 ``[L, H]``: accuracy with the head ablated minus without."""
        return self.accuracy - self.base["accuracy"]


def head_ablation(model: Any, problems: Any, ablation: str = "mean", batch: int = 128) -> HeadAblation:
    """Ablates every attention head in turn at its output before ``W_O``
    (``blocks.{l}.attn.hook_z``), replaced by zero or by its mean over the problems at each
    position (TransformerLens's zero / mean ablation), and measures accuracy and loss: what
    ``hyperlens patch heads --problems FILE --ablation ABLATION --batch BATCH`` writes.

    ``problems``: a :class:`hyperlens.ProblemSet` (``x`` float32 ``[N, 36, 8]``), streamed in
    batches of ``batch`` (the mean is taken over all N). Errors: ``InputError`` for an unknown
    ablation or ``batch`` 0, ``ShapeError`` for problems that do not fit the model;
    ``KeyboardInterrupt`` between batches. Source: ``hyperlens_probe::head_ablation``.
    """
    ev, p = _sraven(model, problems, "head_ablation")
    d = _core.patching.head_ablation_report(ev, p.x, p.y, p.rules, p.perms, str(ablation), as_int(batch, "batch", 1))
    return HeadAblation(d["ablation"], dict(d["base"]), d["accuracy"], d["loss"], table(d["table"]))


@dataclass(frozen=True)
class ActivationPatching:
    """The result of :func:`activation_patching`: normalised scores
    ``(LD_patched - LD_corrupted) / (LD_clean - LD_corrupted)`` (1: the patch restores the clean
    behaviour, 0: it does nothing), LD the logit difference between the clean and the corrupted
    answer at the slot, means over the pairs.

    Attributes:
        n, slot: pairs patched and the answer slot.
        clean_logit_diff, corrupted_logit_diff: mean LD of the clean and corrupted problems (nats).
        resid_pre, attn_out: float64 ``[L, T]`` patching ``blocks.{l}.hook_resid_pre`` /
            ``blocks.{l}.hook_attn_out`` at one position.
        mlp_out: float64 ``[L, T]`` patching ``blocks.{l}.hook_mlp_out`` (None without MLPs).
        head_out: float64 ``[L, H]`` patching one head's ``blocks.{l}.attn.hook_z`` at every
            position.
        source: int64 ``[N, 2]`` (clean, donor) problem indices; clean_answer, corrupted_answer:
            int64 ``[N]``.
        table: ``activation_patching.csv``.
    """

    n: int
    slot: int
    clean_logit_diff: float
    corrupted_logit_diff: float
    resid_pre: np.ndarray
    attn_out: np.ndarray
    mlp_out: np.ndarray | None
    head_out: np.ndarray
    source: np.ndarray
    clean_answer: np.ndarray
    corrupted_answer: np.ndarray
    table: Any = field(repr=False)


def activation_patching(model: Any, problems: Any, slot: int = 3, batch: int = 128) -> ActivationPatching:
    """Activation patching on SRAVEN: each problem is paired with a corrupted twin (the answer
    slot's feature, its tokens in all eight context panels, swapped in from the next problem whose
    answer at ``slot`` differs), and each activation is patched alone from the clean into the
    corrupted pass: every position of ``hook_resid_pre``, ``hook_attn_out`` and ``hook_mlp_out``
    of every layer, and every head's ``hook_z`` at all positions (TransformerLens's
    ``patching.get_act_patch_*``). What ``hyperlens patch acts --problems FILE --slot SLOT
    --batch BATCH`` writes.

    ``problems`` must be unpermuted (``hl.tasks.sample(..., unpermuted=True)``). Every grid comes
    from one run; call this once rather than several ``get_act_patch_*``, which each run it.
    Errors: ``InputError`` for permuted problems, a slot outside the answer, no pair, a model that
    does not separate the answers; ``KeyboardInterrupt`` (Ctrl-C, checked after every forward
    pass) stops it. Source: ``hyperlens_probe::activation_patching``.
    """
    ev, p = _sraven(model, problems, "activation_patching")
    d = dict(_core.patching.activation_patching_report(ev, p.x, p.y, p.rules, p.perms, as_int(slot, "slot"), as_int(batch, "batch", 1)))
    d["table"] = table(d["table"])
    return ActivationPatching(**d)


def get_act_patch_resid_pre(model: Any, problems: Any, slot: int = 3, batch: int = 128) -> np.ndarray:
    """float64 ``[L, T]``: :func:`activation_patching`'s ``resid_pre`` (TransformerLens's
    ``get_act_patch_resid_pre``, the corruption and metric built in)."""
    return activation_patching(model, problems, slot, batch).resid_pre


def get_act_patch_attn_out(model: Any, problems: Any, slot: int = 3, batch: int = 128) -> np.ndarray:
    """float64 ``[L, T]``: :func:`activation_patching`'s ``attn_out``
    (``get_act_patch_attn_out``)."""
    return activation_patching(model, problems, slot, batch).attn_out


def get_act_patch_mlp_out(model: Any, problems: Any, slot: int = 3, batch: int = 128) -> np.ndarray:
    """float64 ``[L, T]``: :func:`activation_patching`'s ``mlp_out`` (``get_act_patch_mlp_out``);
    ``InputError`` for a model without MLPs."""
    r = activation_patching(model, problems, slot, batch)
    if r.mlp_out is None:
        raise InputError("the model has no MLPs: there is no hook_mlp_out to patch")
    return r.mlp_out


def get_act_patch_attn_head_out_all_pos(model: Any, problems: Any, slot: int = 3, batch: int = 128) -> np.ndarray:
    """float64 ``[L, H]``: :func:`activation_patching`'s ``head_out``
    (``get_act_patch_attn_head_out_all_pos``: one head's output patched at every position)."""
    return activation_patching(model, problems, slot, batch).head_out


@dataclass(frozen=True)
class LogitAttribution:
    """The result of :func:`direct_logit_attribution` (the fields of ``dla.json``), in nats, means
    over problems and slots; ``*_centred`` against the mean logit of all answers.

    Attributes:
        heads, heads_centred: float64 ``[L, H]`` each head's ``z W_O[h]``.
        mlp, mlp_centred, attn_bias, attn_bias_centred: float64 ``[L]``.
        embed, constant, logit (and ``*_centred``): floats; ``logit`` is the answer logit that
            the parts sum to, up to ``max_error``.
        n: (problem, slot) pairs; slots: the slots attributed.
        table: ``dla.csv``.
    """

    n: int
    slots: list
    logit: float
    logit_centred: float
    embed: float
    embed_centred: float
    constant: float
    constant_centred: float
    heads: np.ndarray
    heads_centred: np.ndarray
    mlp: np.ndarray
    mlp_centred: np.ndarray
    attn_bias: np.ndarray
    attn_bias_centred: np.ndarray
    max_error: float
    table: Any = field(repr=False)


def direct_logit_attribution(
    model: Any, problems: Any, slots: Sequence[int] | None = None, batch: int = 128
) -> LogitAttribution:
    """Direct logit attribution of the right answer's logit at ``slots`` (all by default): the
    final residual stream split into the embedding, each head's output, each attention bias and
    each MLP output, each centred and divided by the final LayerNorm's scale of the whole stream
    (frozen), projected on the answer's unembedding column (TransformerLens's
    ``cache.stack_head_results`` + ``apply_ln_to_stack`` + ``logit_attrs``). What ``hyperlens
    patch dla --problems FILE [--slot S] --batch BATCH`` writes. ``KeyboardInterrupt`` (Ctrl-C,
    checked after every batch) stops it. Source: ``hyperlens_probe::direct_logit_attribution``."""
    ev, p = _sraven(model, problems, "direct_logit_attribution")
    sl = None if slots is None else [as_int(s, f"slots[{i}]") for i, s in enumerate(slots)]
    d = dict(_core.patching.dla_report(ev, p.x, p.y, p.rules, p.perms, sl, as_int(batch, "batch", 1)))
    d["table"] = table(d["table"])
    return LogitAttribution(**d)


def latent_transplant(
    model: Any, id_problems: Any, ood_problems: Any, slot: int = 3, batch: int = 128, seed: int = 0
) -> Any:
    """The causal test of the latent code: the mean ID code of another rule is transplanted into
    OOD problems at ``slot``'s site (the paper's: query 35, keys 27 and 31), layer by layer, and
    the answers that become that rule's are counted, with the controls (identity, a donor
    problem's code, the donor at the first row's keys, a random code of the same norm, a zero
    code). Both sets must be unpermuted; ``seed`` draws the random codes. What ``hyperlens patch
    transplant --split S --n N --seed SEED --slot SLOT`` writes (it samples ``id_problems`` and
    ``ood_problems`` as ``hl.tasks.sample(split=S, set="id"/"ood", n=N, seed=SEED,
    unpermuted=True)``).

    Returns ``transplant.csv`` as a table (``layer, kind, n, to_donor, elsewhere, unchanged,
    excluded, frac_to_donor, frac_changed, max_logit_change``). ``KeyboardInterrupt`` (Ctrl-C,
    checked after every ID batch and every layer of an OOD batch) stops it. Source:
    ``hyperlens_probe::latent_transplant``."""
    ev, a = _sraven(model, id_problems, "latent_transplant")
    _, b = _sraven(model, ood_problems, "latent_transplant")
    for name, p in (("id_problems", a), ("ood_problems", b)):
        if p.perms is not None and not np.array_equal(p.perms, np.broadcast_to(np.arange(p.perms.shape[2]), p.perms.shape)):
            raise InputError(f"`{name}` must be unpermuted (hl.tasks.sample(..., unpermuted=True))")
    _rows, columns = _core.patching.transplant_rows(ev, a.x, a.y, a.rules, b.x, b.y, b.rules, as_int(slot, "slot"), as_int(batch, "batch", 1), as_seed(seed))
    return table(columns)
