"""The project's error types.

Every user-facing failure is a `NinferError` whose `str()` is one line naming the file, object,
field or YAML line at fault. The CLI prints that line and exits non-zero; nothing else escapes.
"""


class NinferError(Exception):
    """Base of every error the CLI reports as one clear line."""


class ArtifactError(NinferError):
    """A `.ninfer` file is malformed, or a requested object/format is unavailable."""


class ContractError(NinferError):
    """A model contract is invalid, or an artifact does not satisfy its contract."""


class ConvertError(NinferError):
    """A source checkpoint cannot be converted."""


class RouteError(NinferError):
    """A route table is invalid, or selection failed under `miss: error`."""


class CompileError(NinferError):
    """A plan cannot be built (impossible extents, budget exceeded, bad options)."""
