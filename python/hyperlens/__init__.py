"""hyperlens from Python: load a SRAVEN or fuzzy-logic transformer, sample problems, extract the
latent codes of its attention, analyse them, and read or replace any activation by its
TransformerLens name, with numpy arrays in and out.

>>> import hyperlens as hl
>>> model = hl.load("sraven-hyla")            # a shipped checkpoint, inside a source checkout
>>> ood = hl.tasks.sample(split=model.cfg.split, set="ood", n=512, seed=0, unpermuted=True)
>>> codes = model.latent_codes(ood)           # codes.codes: float32 [512, 4, 16, 1, 2]
>>> logits, cache = model.run_with_cache(ood.x[:8], names_filter="blocks.*.attn.hook_pattern")
>>> cache["pattern", 3].shape
(8, 16, 36, 36)

The work runs in hyperlens's Rust core (the ``hyperlens._core`` extension module); long calls
release the GIL and stop on Ctrl-C between batches. The thread count follows
``RAYON_NUM_THREADS``, as the ``hyperlens`` command's does.
"""

from . import _errors  # noqa: F401  (first: the core raises these classes)
from . import _core
from ._codes import CodeSet, LogicCodeSet
from ._errors import (
    BudgetError,
    CheckpointError,
    FileFormatError,
    HookError,
    HyperlensError,
    InputError,
    NotFoundError,
    NumericalError,
    ShapeError,
)
from ._model import ActivationCache, Config, LanguageModel, LMConfig, Model, find_checkpoint, import_jax, load
from . import analysis, circuits, patching, tasks, utils, viz
from .tasks import LogicProblemSet, ProblemSet
from ._train import TrainResult, report, train
from ._study import StudyResult, lm_study

__version__: str = _core.__version__

__all__ = [
    "load",
    "find_checkpoint",
    "import_jax",
    "Model",
    "Config",
    "LanguageModel",
    "LMConfig",
    "ActivationCache",
    "CodeSet",
    "LogicCodeSet",
    "ProblemSet",
    "LogicProblemSet",
    "tasks",
    "train",
    "TrainResult",
    "report",
    "lm_study",
    "StudyResult",
    "analysis",
    "patching",
    "circuits",
    "utils",
    "viz",
    "HyperlensError",
    "InputError",
    "ShapeError",
    "HookError",
    "CheckpointError",
    "FileFormatError",
    "NotFoundError",
    "BudgetError",
    "NumericalError",
    "__version__",
]
