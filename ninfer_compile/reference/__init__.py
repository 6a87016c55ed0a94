"""Float32 PyTorch reference model (and a float64 JAX oracle) for NInfer hybrid artifacts.

Public API:
    ReferenceModel(spec, weights)  .prefill(tokens, state=None) -> [T, V]; .decode(token, state) -> [V];
                                   .new_state(); .mtp_logits(token_ids, target_hidden, mtp_state)
    ModelState, KVCache, GDNState, MTPState            explicit state (state.py)
    WeightSource, ArtifactWeights, DictWeights          weight sources (weights.py)
    mtp_logits(model, token_ids, target_hidden, mtp_state)
The oracle lives in `ninfer_compile.reference.oracle_jax` (imports JAX; not loaded here).
"""

from .model import ReferenceModel
from .mtp import MTPHead, mtp_logits
from .state import GDNState, KVCache, ModelState, MTPState
from .weights import ArtifactWeights, DictWeights, HybridDims, WeightSource

__all__ = [
    "ReferenceModel", "MTPHead", "mtp_logits", "ModelState", "KVCache", "GDNState", "MTPState",
    "WeightSource", "ArtifactWeights", "DictWeights", "HybridDims",
]
