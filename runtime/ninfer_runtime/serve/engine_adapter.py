"""The engine as the server sees it: the runtime's step API (steps.py `Stepper`: prefill chunks from
any start position, decode steps and speculative rounds whose padding never changes a busy slot,
snapshot / restore, `sample_from`, lanes) plus the text side (tokenizer, chat template, stream
decoder) and sampling parameters.

The scheduler (scheduler.py) never touches `Engine`, `generate` or `sampling` directly: it drives an
`EngineAdapter`; the step logic itself is the runtime's, shared with `generate.stream` and the
speculative rounds (one implementation: docs/SERVING.md "Shape").
"""

from __future__ import annotations

from ..frontend import StreamDecoder
from ..sampling import SamplingParams
from ..steps import StateSnapshot, Stepper, StepOut  # noqa: F401 (the types the scheduler sees)


def open_engine(plan: str, artifact: str, *, device: str | None = None, verify_weights: bool = False):
    """Load the engine (the one place the Engine constructor is called)."""
    from ..loader import load

    return load(plan, artifact, device=device, progress=False, verify_weights=verify_weights)


class EngineAdapter(Stepper):
    """`Stepper` (spec "mtp" | "ngram" | "none" | None = the plan's default) with the text side."""

    def __init__(self, engine, *, use_graphs: bool = True, spec=None):
        if callable(spec):
            raise ValueError("ninfer-serve takes spec mtp, ngram or none")
        super().__init__(engine, spec=spec, use_graphs=use_graphs)
        self.frontend = engine.frontend
        self.stop_ids = frozenset(int(s) for s in engine.frontend.stop_ids)
        self.model_id = str(engine.plan.get("model_id", "model"))

    @property
    def has_tokenizer(self) -> bool:
        return self.frontend.has_tokenizer

    @property
    def has_chat_template(self) -> bool:
        return self.frontend.chat_template is not None

    def encode(self, text: str) -> list[int]:
        return self.frontend.encode(text)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.frontend.encode_chat(messages)

    def decoder(self) -> StreamDecoder | None:
        return StreamDecoder(self.frontend) if self.frontend.has_tokenizer else None

    def sampler(self, *, temperature: float, top_p: float, top_k: int, seed: int) -> SamplingParams:
        return SamplingParams(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p), seed=int(seed))

    def close(self) -> None:
        self.engine.close()
