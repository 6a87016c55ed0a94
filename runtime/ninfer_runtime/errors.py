"""Runtime error types. Every message is one line."""


class NinferRuntimeError(RuntimeError):
    """Base of every error the runtime reports as one clear line (the CLI exits 2)."""


class PlanMismatch(NinferRuntimeError):
    """The plan does not fit this artifact / GPU / Triton (directory hash, sm, versions, files)."""


class PlanError(NinferRuntimeError):
    """The plan directory is missing, malformed, or asks for something the runtime cannot do."""
