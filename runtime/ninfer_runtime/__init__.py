"""ninfer_runtime — executes ninfer-compile plans (Triton kernels and CUDA graphs on a GPU; the
plan's torch implementations on the CPU, or its Triton kernels under the interpreter on request).

Depends on torch, triton (not on the CPU's torch path), numpy, pyyaml, tokenizers, jinja2 (+tqdm) —
never on `ninfer_compile`: the plan directory (plan.json + the emitted kernels/) is its only
interface with the compiler.

    from ninfer_runtime import load
    engine = load("model.ninfer.sm90.plan", "model.ninfer")
    print(engine.generate("Hello", max_new_tokens=16).text)
    for ev in engine.stream([1, 2, 3], max_new_tokens=8, temperature=0.7, top_p=0.9, seed=1):
        print(ev.token)
"""

from .errors import NinferRuntimeError, PlanError, PlanMismatch
from .generate import GenerationResult, TokenEvent
from .loader import Engine, load
from .sampling import SamplingParams

__all__ = ["Engine", "GenerationResult", "NinferRuntimeError", "PlanError", "PlanMismatch", "SamplingParams",
           "TokenEvent", "load"]
__version__ = "0.1.0"
