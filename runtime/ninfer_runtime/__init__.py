"""ninfer_runtime — executes ninfer-compile plans (Triton kernels and CUDA graphs on a GPU; the
plan's torch implementations on the CPU, or its Triton kernels under the interpreter on request).

Depends on torch, triton (not on the CPU's torch path), numpy, pyyaml, tokenizers, jinja2 (+tqdm) —
never on `ninfer_compile`: the plan directory (plan.json + the emitted kernels/) is its only
interface with the compiler.

    from ninfer_runtime import load, prestart
    prestart("model.ninfer.sm90.plan", "model.ninfer")  # optional, first: the weights stream to the
                                                        # GPU while torch is still being imported
    engine = load("model.ninfer.sm90.plan", "model.ninfer")
    print(engine.generate("Hello", max_new_tokens=16).text)
    for ev in engine.stream([1, 2, 3], max_new_tokens=8, temperature=0.7, top_p=0.9, seed=1):
        print(ev.token)

Importing the package imports no torch; the names below that need it import it on first use.
"""

import importlib

from .errors import NinferRuntimeError, PlanError, PlanMismatch
from .weight_stream import prestart

_LAZY = {"Engine": "loader", "load": "loader", "GenerationResult": "generate", "TokenEvent": "generate",
         "SamplingParams": "sampling"}

__all__ = ["Engine", "GenerationResult", "NinferRuntimeError", "PlanError", "PlanMismatch", "SamplingParams",
           "TokenEvent", "load", "prestart"]
__version__ = "0.1.0"


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
