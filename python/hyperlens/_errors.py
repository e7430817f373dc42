"""The exception hierarchy of hyperlens.

Every error that hyperlens raises is a :class:`HyperlensError`. Each subclass also derives from the
built-in exception that fits, so ``except ValueError`` or ``except MemoryError`` catch them too. The
message is the one line that the ``hyperlens`` command prints after ``error:``.
"""


class HyperlensError(Exception):
    """Base class of every hyperlens error."""


class InputError(HyperlensError, ValueError):
    """An argument has a bad value: dtype, NaN, an index out of range, an unknown name."""


class ShapeError(InputError):
    """An argument has the wrong shape; the message names it and the shape expected."""


class HookError(InputError):
    """A Python hook returned an array that cannot replace the activation (shape, dtype, NaN)."""


class CheckpointError(HyperlensError, ValueError):
    """A checkpoint is malformed, truncated or contradicts itself (config against weights)."""


class FileFormatError(HyperlensError, ValueError):
    """A ``.npz`` or JSON file is malformed or holds arrays of the wrong shape or dtype."""


class NotFoundError(HyperlensError, FileNotFoundError):
    """A file, checkpoint directory or shipped checkpoint name does not exist."""


class BudgetError(HyperlensError, MemoryError):
    """The request would exceed the memory budget; refused before anything was allocated.

    The budget is half of the machine's memory unless ``HYPERLENS_MEMORY_BUDGET`` says otherwise.
    """


class NumericalError(HyperlensError, ArithmeticError):
    """A numerical routine (eigendecomposition, optimiser) failed."""


__all__ = [
    "HyperlensError",
    "InputError",
    "ShapeError",
    "HookError",
    "CheckpointError",
    "FileFormatError",
    "NotFoundError",
    "BudgetError",
    "NumericalError",
]
