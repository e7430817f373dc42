"""Loaded models: :func:`load` and :class:`Model`, with TransformerLens's hook names."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, Union

import numpy as np

from . import _core
from ._arrays import as_f32, as_i64, as_int, as_layers
from ._codes import CodeSet, LogicCodeSet
from ._errors import HookError, HyperlensError, InputError, NotFoundError, ShapeError
from .tasks import LogicProblemSet, ProblemSet, PromptSet, load_prompts
from .utils import get_act_name

__all__ = ["load", "import_jax", "Model", "Config", "LanguageModel", "LMConfig", "ActivationCache", "find_checkpoint"]

CHECKPOINTS_ENV = "HYPERLENS_CHECKPOINTS"
#: Where a source checkout ships checkpoints, under ``data/``: the SRAVEN and fuzzy-logic models, and the
#: token model (``attn-only-2l``).
SHIPPED = ("checkpoints", "induction")

NamesFilter = Union[None, str, Sequence[str], Callable[[str], bool]]


def find_checkpoint(path_or_name: str | os.PathLike) -> Path:
    """The checkpoint directory of a path, or of a shipped checkpoint's name.

    A name (no path separator) that is not a path is looked up in ``$HYPERLENS_CHECKPOINTS`` (if
    set), then in ``data/checkpoints/`` and ``data/induction/`` (the token model) of the current
    directory and each of its parents, so that ``load("sraven-hyla")`` and
    ``load("attn-only-2l")`` work anywhere inside a source checkout (a notebook's kernel starts in
    ``notebooks/``). The wheel holds no checkpoints.
    """
    p = Path(os.fspath(path_or_name)).expanduser()
    if p.exists():
        return p
    name = os.fspath(path_or_name)
    tried: list[str] = []
    if os.sep not in name and "/" not in name:
        roots: list[Path] = []
        env = os.environ.get(CHECKPOINTS_ENV)
        if env:
            roots.append(Path(env).expanduser())
        cwd = Path.cwd()
        roots.extend(d / "data" / sub for d in (cwd, *cwd.parents) for sub in SHIPPED)
        for root in roots:
            cand = root / name
            if cand.exists():
                return cand
        tried = [str(r) for r in roots[:4]]
    where = f" (looked in {', '.join(tried)}, ...)" if tried else ""
    raise NotFoundError(
        f"{name}: no such checkpoint: not a path, nor a shipped checkpoint's name in "
        f"${CHECKPOINTS_ENV} or data/checkpoints/ or data/induction/ of the current directory or a "
        f"parent{where}"
    )


@dataclass(frozen=True)
class Config:
    """A model's configuration (``config.json``; the task and split that the run files record,
    read by the model crate's ``RunRecord``).

    ``n_ctx`` (= ``n_tokens``) and ``d_vocab`` (= ``d_in``) are TransformerLens's names.
    """

    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    d_mlp: int
    n_tokens: int
    d_in: int
    n_outputs: int
    d_out: int
    n_buckets: int
    causal: bool
    mixer: str
    normalisation: str
    n_params: int
    task: str
    split: str | None
    path: str
    engine: str = field(default="host", compare=False)

    @property
    def n_ctx(self) -> int:
        return self.n_tokens

    @property
    def d_vocab(self) -> int:
        return self.d_in


class ActivationCache(Mapping[str, np.ndarray]):
    """Activations by hook name (TransformerLens's ``ActivationCache``): ``cache[name]``, and the
    shorthand ``cache["pattern", 3]`` = ``cache["blocks.3.attn.hook_pattern"]``
    (:func:`hyperlens.utils.get_act_name`). Every value is a float32 numpy array whose first axis is
    the batch."""

    def __init__(self, items: Iterable[tuple[str, np.ndarray]]) -> None:
        self._d: dict[str, np.ndarray] = dict(items)

    def _key(self, key: Any) -> str:
        if isinstance(key, tuple):
            return get_act_name(*key)
        return key

    def __getitem__(self, key: Any) -> np.ndarray:
        k = self._key(key)
        try:
            return self._d[k]
        except KeyError:
            raise KeyError(f"{k!r} is not in the cache (cached: {', '.join(list(self._d)[:8])} ...)") from None

    def __contains__(self, key: object) -> bool:
        return self._key(key) in self._d

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} hooks: {', '.join(list(self._d)[:4])}{' ...' if len(self) > 4 else ''})"


class _Hooked:
    """The hook API shared by :class:`Model` and :class:`LanguageModel`."""

    _ev: Any

    def _x(self, x: Any) -> np.ndarray:  # pragma: no cover - overridden
        raise NotImplementedError

    def hook_names(self) -> list[str]:
        """Every hook point's TransformerLens name, in the order of the forward pass."""
        return list(self._ev.hook_names())

    def _select(self, names_filter: NamesFilter) -> list[str]:
        if names_filter is None:
            return self.hook_names()
        if callable(names_filter):
            return [n for n in self.hook_names() if names_filter(n)]
        if isinstance(names_filter, str):
            names_filter = [names_filter]
        return list(self._ev.select_hooks([str(n) for n in names_filter]))

    def run_with_cache(self, x: Any, names_filter: NamesFilter = None) -> tuple[np.ndarray, ActivationCache]:
        """Runs the hooked forward pass and keeps activations: ``logits, cache``.

        ``names_filter``: None (every hook point), a name or a glob as the CLI's ``--hooks``
        (``"blocks.*.hook_resid_post"``: ``*`` matches one name part, ``**`` anything), a list of
        them, or a callable on the name. Returns the logits float32 ``[N, F, d_out]`` and an
        :class:`ActivationCache` of float32 arrays in the shapes of the hook table
        (``blocks.{l}.attn.hook_pattern`` ``[N, H, T, T]``, ``blocks.{l}.hook_resid_pre``
        ``[N, T, d_model]``, ...)."""
        names = self._select(names_filter)
        logits, items = self._ev.run_with_cache(self._x(x), names)
        return logits, ActivationCache(items)

    def run_with_hooks(
        self,
        x: Any,
        fwd_hooks: Sequence[tuple[str | Callable[[str], bool], Callable[[np.ndarray, str], Any]]] = (),
    ) -> np.ndarray:
        """Runs the hooked forward pass with Python hooks and returns the logits float32
        ``[N, F, d_out]``.

        ``fwd_hooks`` is a list of ``(name_or_filter, fn)``: a hook name, a glob or a callable on
        the name, and ``fn(activation, name)``, which gets the activation (a float32 numpy array)
        and may return an array of the same shape to replace it (float64 is converted; another
        shape raises :class:`hyperlens.HookError` naming the hook). Hooks at one point run in the
        order given, each seeing the previous one's replacement."""
        hooks: list[tuple[str, Callable]] = []
        for entry in fwd_hooks:
            try:
                sel, fn = entry
            except (TypeError, ValueError):
                raise InputError("each entry of `fwd_hooks` must be a (name_or_filter, fn) pair") from None
            if not callable(fn):
                raise InputError(f"the hook for {sel!r} is not callable")
            for name in self._select(sel):
                hooks.append((name, _wrap_hook(fn)))
        order = {n: i for i, n in enumerate(self.hook_names())}
        hooks.sort(key=lambda h: order[h[0]])
        return self._ev.run_with_hooks(self._x(x), hooks)



class Model(_Hooked):
    """A loaded SRAVEN or fuzzy-logic model (:func:`load`), evaluated by hyperlens's engine.

    Inputs ``x`` are problems as one-hot tokens, float32 ``[N, T, d_in]`` (SRAVEN: ``[N, 36, 8]``),
    or a :class:`hyperlens.tasks.ProblemSet`. bool, integer and float64 one-hot arrays are
    converted; a float32 C-ordered array is read in place.
    """

    def __init__(self, ev: Any, path: Path) -> None:
        self._ev = ev
        self.path = path
        c = dict(ev.config())
        record = _core.run_record(os.fspath(path))
        self.cfg = Config(
            n_layers=c["n_layers"],
            n_heads=c["n_heads"],
            d_model=c["d_model"],
            d_head=c["d_head"],
            d_mlp=c["d_mlp"],
            n_tokens=c["n_tokens"],
            d_in=c["d_in"],
            n_outputs=c["n_outputs"],
            d_out=c["d_out"],
            n_buckets=c["n_buckets"],
            causal=c["causal"],
            mixer=c["mixer"],
            normalisation=c["normalisation"],
            n_params=c["n_params"],
            task=record["task"],
            split=record["split"],
            path=str(path),
            engine=c["engine"],
        )

    def __repr__(self) -> str:
        c = self.cfg
        return (
            f"Model({c.path!r}: {c.task}, {c.mixer}, {c.n_layers} layers, {c.n_heads} heads, "
            f"d_model {c.d_model}, {c.n_params:,} parameters)"
        )

    # inputs -------------------------------------------------------------------------------
    def _x(self, x: Any) -> np.ndarray:
        if isinstance(x, (ProblemSet, LogicProblemSet)):
            x = x.x
        return as_f32(x, "x", 3)

    @property
    def is_logic(self) -> bool:
        """Whether the model is a fuzzy-logic one (its run files record ``task: logic``)."""
        return self.cfg.task == "logic"

    def _logic_problems(self, problems: Any) -> LogicProblemSet:
        if isinstance(problems, LogicProblemSet):
            return problems
        if isinstance(problems, Mapping):
            return LogicProblemSet(problems["x"], problems["y"], problems["targets"], problems["terms"], problems["term_ids"])
        raise TypeError(
            f"{self.cfg.path} is a fuzzy-logic model: `problems` must be a LogicProblemSet "
            f"(hl.tasks.sample(\"logic\", ...)), got {type(problems).__name__}"
        )

    def _problems(self, problems: Any) -> ProblemSet:
        if isinstance(problems, LogicProblemSet):
            raise TypeError(f"{self.cfg.path} is a {self.cfg.task} model; a LogicProblemSet needs a fuzzy-logic model")
        if isinstance(problems, ProblemSet):
            return problems
        if isinstance(problems, Mapping):
            return ProblemSet(problems["x"], problems["y"], problems["rules"], problems.get("perms"))
        raise TypeError(f"`problems` must be a ProblemSet (or a dict of its arrays), got {type(problems).__name__}")

    # forward ------------------------------------------------------------------------------
    def __call__(self, x: Any, batch: int = 256) -> np.ndarray:
        """The logits, float32 ``[N, F, d_out]`` (as :meth:`logits`)."""
        return self.logits(x, batch)

    def logits(self, x: Any, batch: int = 256) -> np.ndarray:
        """The logits of problems ``x`` ``[N, T, d_in]``: float32 ``[N, F, d_out]`` (SRAVEN:
        ``[N, 4, 8]``, one row of class scores per answer feature), in batches of ``batch``."""
        return self._ev.logits(self._x(x), as_int(batch, "batch", 1))

    def patterns(self, x: Any, batch: int = 64) -> tuple[np.ndarray, np.ndarray]:
        """The logits float32 ``[N, F, d_out]`` and every head's attention pattern float32
        ``[N, L, H, T, T]`` (query, key): the latent codes of every query-key pair."""
        return self._ev.patterns(self._x(x), as_int(batch, "batch", 1))

    def evaluate(self, problems: Any, batch: int = 256) -> dict[str, Any]:
        """The dict that ``hyperlens eval --json`` prints for ``problems``.

        SRAVEN: accuracy (all features right), per-feature accuracy, loss (nats) and n
        (``hyperlens_model::eval::evaluate_stream``). Fuzzy logic (a :class:`LogicProblemSet`):
        ``task``, ``r2`` (mean R² of the last token's prediction over the ``n_r2`` sequences whose
        targets vary), ``mse`` and ``n`` (``hyperlens_train::logic::evaluate_chunks``), and ``set``
        when the problem set knows it."""
        if self.is_logic:
            lp = self._logic_problems(problems)
            d = dict(self._ev.logic_evaluate(*lp._arrays(), as_int(batch, "batch", 1)))
            where = lp.meta.get("set", lp.meta.get("path"))
            if where is not None:
                d["set"] = where
            return d
        p = self._problems(problems)
        return dict(self._ev.evaluate(p.x, p.y, as_int(batch, "batch", 1)))

    def latent_codes(
        self,
        problems: Any,
        site: str = "paper",
        layers: Sequence[int] | None = None,
        batch: int = 256,
    ) -> "CodeSet | LogicCodeSet":
        """The latent codes at ``site`` (``"paper"``, ``"slot:F"``, ``"all-slots"`` or
        ``"query:I;keys:J,K"``, as the CLI's ``--site``) of ``layers`` (all by default) with their
        labels: a :class:`hyperlens.CodeSet` with the arrays of ``hyperlens probe``'s
        ``codes.npz`` (``codes`` float32 ``[N, L, H, 1, K]``, ``label``, ``rules``, ``inputs``,
        ``target``, ``prediction``, ``correct``, ``slot``, ``problem``), computed batch by batch in
        memory (``hyperlens_probe::extract::code_rows``).

        On a fuzzy-logic model ``problems`` is a :class:`LogicProblemSet` and the result a
        :class:`hyperlens.LogicCodeSet` with the arrays of ``hyperlens probe``'s logic codes file
        (``codes`` float32 ``[N, L, H, 1, K]``, ``terms``, ``term_ids``, ``target``,
        ``prediction``, ``problem``); ``site`` is ``"paper"`` (the last token's attention to
        itself) or ``"query:I;keys:J,..."`` (``hyperlens_probe::logic_code_rows``).

        Errors: :class:`hyperlens.InputError` for a bad site or layer list, a ``ShapeError`` for
        arrays that do not fit the model, a ``BudgetError`` (``MemoryError``) for codes over the
        memory budget (before allocating); ``KeyboardInterrupt`` between batches."""
        lay = as_layers(layers)
        batch = as_int(batch, "batch", 1)
        if self.is_logic:
            lp = self._logic_problems(problems)
            d = dict(self._ev.logic_latent_codes(*lp._arrays(), str(site), lay, batch))
            site_s, layers_l = d.pop("site"), d.pop("layers")
            return LogicCodeSet(**d, site=site_s, layers=layers_l)
        p = self._problems(problems)
        d = dict(
            self._ev.latent_codes(
                p.x, p.y, p.rules, p.perms, str(site), lay, batch
            )
        )
        site_s, layers_l = d.pop("site"), d.pop("layers")
        codes, label = d.pop("codes"), d.pop("label")
        return CodeSet(codes, label, site=site_s, layers=layers_l, **d)

def _wrap_hook(fn: Callable[[np.ndarray, str], Any]) -> Callable[[np.ndarray, str], Any]:
    """``fn`` with its result converted to float32 when that is safe."""

    def hook(act: np.ndarray, name: str) -> Any:
        r = fn(act, name)
        if r is None:
            return None
        a = np.asarray(r)
        if a.dtype == np.float32:
            return np.ascontiguousarray(a)
        if a.dtype in (np.float64, np.float16) or np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_:
            return np.ascontiguousarray(a, dtype=np.float32)
        raise HookError(f"the hook at `{name}` returned an array of dtype {a.dtype}, not a float array")

    return hook


def load(path_or_name: str | os.PathLike, device: str = "cpu") -> "Model | LanguageModel":
    """Loads a SRAVEN or fuzzy-logic checkpoint directory (``config.json`` +
    ``model.safetensors``) as a :class:`Model`, a token language model (a hyperlens token model,
    a Hugging Face GPT-2 or Llama directory, a ``.gguf`` file) as a :class:`LanguageModel`, or a
    shipped checkpoint by name (:func:`find_checkpoint`:
    ``load("sraven-hyla")`` inside a source checkout), on ``device`` (``"cpu"``, ``"cuda[:N]"``,
    ``"metal"``; GPU devices need a GPU build)."""
    path = find_checkpoint(path_or_name)
    if _is_language_model(path):
        return LanguageModel(_core.LanguageModel.load(os.fspath(path), str(device)), path)
    ev = _core.Evaluator.load(os.fspath(path), str(device))
    return Model(ev, path)


def import_jax(
    params_npz: str | os.PathLike,
    mixer: str,
    *,
    out: str | os.PathLike | None = None,
    n_outputs: int = 4,
    force: bool = False,
    device: str = "cpu",
) -> "Model":
    """Loads a ``.npz`` export of the paper's JAX/Flax code (flax paths joined with ``/``, as
    ``scripts/export_jax_checkpoint.py`` writes them) as a :class:`Model`, as
    ``hyperlens import jax --params PARAMS --mixer MIXER`` does.

    ``mixer`` is a CLI name (``"hyla"``, ``"softmax"``, ``"linear"``, ...) or the paper's method
    string (``"linear_hypatt"``, ``"transformer"``, ...): the export does not record it.
    ``n_outputs``: answer positions read at the end of the sequence (4 for SRAVEN). With ``out``,
    the checkpoint directory (``config.json`` + ``model.safetensors``) is written there first and
    loaded from it; ``force`` overwrites an existing one. Without it the model lives in memory.

    Source: Schug et al. 2025's code (``hyperlens import jax``; the float64 test of
    ``crates/model/tests/model.rs`` holds the imported models to the paper's logits).

    Raises:
        CheckpointError: a malformed export (naming the key); FileNotFoundError: no such file;
        InputError: an unknown mixer, or ``out`` exists without ``force``.
    """
    ev = _core.Evaluator.import_jax(
        os.fspath(params_npz),
        str(mixer),
        as_int(n_outputs, "n_outputs", 1),
        None if out is None else os.fspath(out),
        bool(force),
        str(device),
    )
    return Model(ev, Path(os.fspath(out if out is not None else params_npz)))


def _is_language_model(path: Path) -> bool:
    """Whether ``path`` is a token language model (a hyperlens token model, a Hugging Face GPT-2
    or Llama directory, a ``.gguf`` file), as the model crate's ``lm::detect`` tells it."""
    return _core.language_model_kind(os.fspath(path)) is not None


@dataclass(frozen=True)
class LMConfig:
    """A token language model's kind (``"token"``, ``"gpt2"``, ``"llama"``) and sizes, with
    TransformerLens's names."""

    kind: str
    n_layers: int
    n_heads: int
    d_vocab: int
    n_ctx: int
    path: str


def _is_text(x: Any) -> bool:
    """A ``str``, or a non-empty list or tuple of ``str``."""
    return isinstance(x, str) or (isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(t, str) for t in x))


def _texts(x: Any) -> list[str]:
    if isinstance(x, str):
        return [x]
    if isinstance(x, (list, tuple)) and all(isinstance(t, str) for t in x):
        if not x:
            raise InputError("no text to tokenize (an empty list)")
        return list(x)
    raise InputError(f"expected a str or a list of str, got {type(x).__name__}")


class LanguageModel(_Hooked):
    """A token language model (:func:`load` of a hyperlens token model, a Hugging Face GPT-2 or
    Llama directory, or a ``.gguf`` file) on token ids: int64 ``[B, T]`` (any integer dtype;
    a 1-D sequence is one batch row), ids below ``cfg.d_vocab``, ``T <= cfg.n_ctx``.

    Every call that takes tokens also takes text, a ``str`` or a list of ``str``, tokenized by
    :meth:`to_tokens` with its default BOS (a batch of texts right-padded with the pad id). The
    tokenizer is the model's own: the ``tokenizer.json`` of a directory, or the ``tokenizer.ggml.*``
    metadata of a ``.gguf`` file; a model without one raises :class:`InputError` when given text.
    """

    def __init__(self, ev: Any, path: Path) -> None:
        self._ev = ev
        self.path = path
        c = dict(ev.config())
        self.cfg = LMConfig(kind=c["kind"], n_layers=c["n_layers"], n_heads=c["n_heads"], d_vocab=c["d_vocab"], n_ctx=c["n_ctx"], path=str(path))

    def __repr__(self) -> str:
        c = self.cfg
        return f"LanguageModel({c.path!r}: {c.kind}, {c.n_layers} layers, {c.n_heads} heads, vocabulary {c.d_vocab})"

    def _x(self, tokens: Any) -> np.ndarray:
        if _is_text(tokens):
            return self.to_tokens(tokens)
        t = np.asarray(tokens)
        if t.ndim == 1:
            t = t[None, :]
        return as_i64(t, "tokens", 2)

    def __call__(self, tokens: Any) -> np.ndarray:
        """The next-token logits, float32 ``[B, T, d_vocab]``, of token ids or text."""
        return self.logits(tokens)

    def logits(self, tokens: Any) -> np.ndarray:
        """The next-token logits, float32 ``[B, T, d_vocab]``, of token ids or text."""
        return self._ev.logits(self._x(tokens))

    def patterns(self, tokens: Any) -> tuple[np.ndarray, np.ndarray]:
        """The logits float32 ``[B, T, d_vocab]`` and every head's attention pattern float32
        ``[B, L, H, T, T]`` (query, key), of token ids or text."""
        return self._ev.patterns(self._x(tokens))

    # ------------------------------------------------------------------ text (TransformerLens names)

    def to_tokens(self, input: str | Sequence[str], prepend_bos: bool | None = None, return_lengths: bool = False) -> Any:
        """Tokenizes text with the model's tokenizer (TransformerLens ``to_tokens``).

        ``input``: a ``str`` or a list of ``str`` (N texts). ``prepend_bos``: ``None`` = the
        Hugging Face default (``add_special_tokens=True``: what the tokenizer adds, e.g. ``<s>`` for
        Llama, ``[CLS]``/``[SEP]`` for BERT, nothing for GPT-2 or SmolLM2; TransformerLens would
        prepend a BOS), ``True`` = a BOS first, ``False`` = no BOS.

        Returns the ids int64 ``[N, T]`` (T the longest, shorter rows right-padded with the pad id:
        the pad token, else EOS, else 0), and with ``return_lengths=True`` also the lengths int64
        ``[N]``. Raises :class:`InputError` if the model has no tokenizer, or ``prepend_bos=True``
        and it has no BOS.
        """
        texts = _texts(input)
        ids, lengths = self._ev.to_tokens(texts, None if prepend_bos is None else bool(prepend_bos))
        return (ids, lengths) if return_lengths else ids

    def to_str_tokens(self, input: Any, prepend_bos: bool | None = None) -> Any:
        """Each token as a string, decoded alone (TransformerLens ``to_str_tokens``): of a text
        (tokenized as :meth:`to_tokens`) or of token ids ``[T]`` or ``[1, T]``, a ``list[str]``; of a
        list of texts, a list of those. A token holding part of a UTF-8 character gives ``"\ufffd"``."""
        if isinstance(input, str):
            ids, n = self.to_tokens(input, prepend_bos, return_lengths=True)
            return self._ev.to_str_tokens(ids[0, : n[0]])
        if _is_text(input):
            return [self.to_str_tokens(t, prepend_bos) for t in input]
        t = as_i64(input, "tokens")
        if t.ndim == 2 and t.shape[0] == 1:
            t = t[0]
        if t.ndim != 1:
            raise ShapeError(f"`tokens` must have shape [T] or [1, T], got {list(t.shape)}")
        return self._ev.to_str_tokens(t)

    def to_string(self, tokens: Any) -> Any:
        """Token ids decoded to text (TransformerLens ``to_string``): ``[T]`` -> ``str``,
        ``[N, T]`` -> ``list[str]`` (padding included: cut each row to its length first)."""
        t = as_i64(tokens, "tokens")
        if t.ndim == 1:
            return self._ev.to_string(t)
        if t.ndim == 2:
            return [self._ev.to_string(row) for row in t]
        raise ShapeError(f"`tokens` must have shape [T] or [N, T], got {list(t.shape)}")

    @property
    def tokenizer_source(self) -> str | None:
        """Where the tokenizer comes from (a ``tokenizer.json`` path, or ``FILE.gguf
        (tokenizer.ggml.* metadata)``); ``None`` when the model has none."""
        return self._ev.tokenizer_source()

    @property
    def bos_token_id(self) -> int | None:
        """The tokenizer's beginning-of-sequence id, ``None`` if it has none."""
        return self._ev.special_ids()[0]

    @property
    def pad_token_id(self) -> int:
        """The id that pads a batch of texts: the pad token, else EOS, else 0."""
        return self._ev.special_ids()[1]

    def single_token_words(self, min_len: int = 1) -> list[str]:
        """The words of ASCII lowercase letters (at least ``min_len``) that are one token after a
        space, each with its leading space (``" house"``), sorted: a word list from the model's own
        vocabulary."""
        return self._ev.single_token_words(int(min_len))

    # ---- issue 47: the latent-code lens ----

    def latent_codes(
        self,
        tokens: Any,
        query: Any,
        keys: Any,
        form: str = "pattern",
        layers: Sequence[int] | int | None = None,
        lengths: Any = None,
        return_logits: bool = False,
        return_resid: bool = False,
    ) -> "np.ndarray | tuple[np.ndarray, ...]":
        """The latent codes of chosen (query, key) pairs of token positions: per row, layer, query
        head, query and key, the attention of the query to the key
        (``hyperlens_model::lm::LanguageModel::latent_codes``).

        ``tokens`` int ``[N, T]`` (a 1-D sequence is one row), or text (a str or a list of str,
        tokenized as :meth:`to_tokens` does, with their lengths), row ``i`` being ``lengths[i]``
        tokens long (int ``[N]``; all ``T`` without it, the rest of a row is ignored); ``query``
        int ``[N, Q]`` and ``keys`` int ``[N, K]`` token positions, every key at or before every
        query of its row (the models are causal). ``form``: ``"pattern"`` (the attention
        probabilities, ``blocks.{l}.attn.hook_pattern``), ``"scores"`` (pre-softmax,
        ``hook_attn_scores``) or ``"no-sink"`` (the probabilities renormalised without position
        0, keys >= 1). ``layers``: the layers to read, in the order of the result's layer axis
        (all by default).

        Returns the codes float32 ``[N, L, H, Q, K]`` (``H`` the query heads; the layout of
        ``codes.npz``), or, with ``return_logits`` and/or ``return_resid``, a tuple of the codes
        followed by those asked, in this order: the next-token logits after each row's last token
        float32 ``[N, d_vocab]``, the residual stream after each selected layer at each query
        (``hook_resid_post``) float32 ``[N, L, Q, d_model]``. Rows of unequal lengths are batched
        without changing the codes; only the needed positions and layers are computed.

        Errors: :class:`hyperlens.InputError` naming the row for an empty row, a position past its
        end, a key after its query, a key at 0 with ``"no-sink"``, a token id out of range, a bad
        layer or form; :class:`hyperlens.ShapeError` for arrays of the wrong shape;
        :class:`hyperlens.BudgetError` when one layer's attention of the batch exceeds the memory
        budget."""
        if _is_text(tokens):
            tokens, text_lengths = self.to_tokens(tokens, return_lengths=True)
            lengths = text_lengths if lengths is None else lengths
        t = np.asarray(tokens)
        q, k = np.asarray(query), np.asarray(keys)
        if t.ndim == 1:
            t, q, k = t[None, :], q.reshape(1, -1), k.reshape(1, -1)
        n = None if lengths is None else as_i64(np.atleast_1d(np.asarray(lengths)), "lengths", 1)
        codes, logits, resid = self._ev.latent_codes(
            as_i64(t, "tokens", 2),
            as_i64(q, "query", 2),
            as_i64(k, "keys", 2),
            str(form),
            as_layers(layers),
            n,
            bool(return_logits),
            bool(return_resid),
        )
        extra = [a for a, want in ((logits, return_logits), (resid, return_resid)) if want]
        return (codes, *extra) if extra else codes

    def probe(
        self,
        prompts: Any,
        out: str | os.PathLike,
        sites: str | None = None,
        *,
        layers: Sequence[int] | int | None = None,
        form: str = "pattern",
        batch: int = 32,
        prepend_bos: bool | None = None,
        label: str | None = None,
        resid: bool = False,
        shuffle_weights: int | None = None,
        on_progress: Callable[[int, int], Any] | None = None,
    ) -> dict[str, Any]:
        """Streams the latent codes of every prompt of a prompt set to a code file, as
        ``hyperlens probe --prompts`` does (``hyperlens_probe::extract_prompts``).

        ``prompts``: a :class:`hyperlens.tasks.PromptSet` (``hl.tasks.icl(...)``,
        ``hl.tasks.prompts([...])``) or the path of a JSONL prompt file. ``sites``: the sites by role,
        e.g. ``"query: last; keys: demo_output, query_input"`` (default: the set's recommended
        ``sites``). Each prompt is tokenized segment by segment; its codes are those of
        :meth:`latent_codes` at its sites, in the ``form`` asked, of the ``layers`` asked (all by
        default); its behaviour is the model's greedy next token against its answer's first token.
        With ``resid`` the residual stream after each layer at the queries is kept; with
        ``shuffle_weights=seed`` the codes are those of the model with its weights shuffled within
        each tensor (the control of the lens). ``on_progress(done, total)`` after each batch of
        ``batch`` prompts; Ctrl-C stops it and leaves no file.

        Writes ``out`` (``.npz``: ``codes`` float32 ``[N, L, H, Q, K]``, ``label``, ``factors``
        int64 ``[N, F]``, ``split``, ``prompt``, ``length``, ``query_pos`` ``[N, Q]``, ``key_pos``
        ``[N, K]``, ``target``, ``prediction``, ``correct``, and ``resid`` float32
        ``[N, L, Q, d_model]``) and its sidecar ``codes.json`` beside it; read them with
        :func:`hyperlens.analysis.analyze_lm` or ``numpy.load``. Returns ``{"path", "n_prompts",
        "n_answered", "accuracy"}``.

        Errors: :class:`hyperlens.InputError` for sites that do not resolve (naming the prompt), an
        unknown role or label factor, a model without a tokenizer; :class:`hyperlens.NotFoundError`
        for a missing prompt file."""
        if not isinstance(prompts, PromptSet):
            prompts = load_prompts(prompts)
        spec = sites if sites is not None else prompts.sites
        if spec is None:
            raise InputError("the prompts recommend no sites: pass sites=, e.g. \"query: last; keys: ROLE\"")
        path = Path(os.fspath(out))
        n, answered, acc = self._ev.probe(
            prompts._core,
            str(spec),
            path,
            as_layers(layers),
            str(form),
            as_int(batch, "batch", 1),
            None if prepend_bos is None else bool(prepend_bos),
            None if label is None else str(label),
            bool(resid),
            None if shuffle_weights is None else as_int(shuffle_weights, "shuffle_weights"),
            on_progress,
        )
        return {"path": path, "n_prompts": n, "n_answered": answered, "accuracy": acc}
