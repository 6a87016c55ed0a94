"""The one-layer MTP draft head (model doc §7), float32.

    e = RMSNorm(embed(token), embedding_norm) * (1+w)
    h = RMSNorm(target_hidden, hidden_norm) * (1+w)
    x = input_projection(concat(e, h))                 # [e, h] order (NInfer reference, vLLM)
    x = full-attention decoder layer (own KV cache; q/k/gate/v are row views of one parent)
    logits = output_head(RMSNorm(x, mtp/final_norm) * (1+w))

Column i pairs the target hidden state at position p_i with the token that *follows* it
(token p_i + 1) and is rotated at position p_i. `target_hidden` is what NInfer's schedule feeds
the head: the target's final-norm output (`ModelState.hidden`), not the pre-norm residual.
The embedding and output head are the text ones (aliases, not separate objects).
"""

from __future__ import annotations

import torch

from ..errors import NinferError
from .model import _token_tensor, decoder_layer, linear, rms_norm
from .state import KVCache, MTPState
from .weights import MTPWeights, load_mtp_weights


class MTPHead:
    def __init__(self, model):
        if not model.dims.has_mtp:
            raise NinferError(f"model {getattr(model.spec, 'model_id', '?')} has no MTP part")
        self.model = model
        self.dims = model.dims
        self.weights: MTPWeights = load_mtp_weights(model.source, model.spec, model.dims)
        self.last_state: MTPState | None = None

    def new_state(self) -> MTPState:
        return MTPState(KVCache.empty(self.dims.kv_heads, self.dims.head_dim, device=self.model.device,
                                     roundtrip=self.model.kv_roundtrip))

    def hidden(self, token_ids, target_hidden: torch.Tensor, state: MTPState | None = None,
               positions: torch.Tensor | None = None) -> torch.Tensor:
        """Draft hidden states [T, H] (after mtp/final_norm); appends T columns to `state`.

        token_ids: [T]; target_hidden: [T, H]; positions: [T] (default state.position + arange(T)).
        """
        d = self.dims
        state = self.new_state() if state is None else state
        self.last_state = state
        ids = _token_tensor(token_ids, d.vocab_rows).to(self.model.device)
        T = ids.shape[0]
        target_hidden = torch.as_tensor(target_hidden, dtype=torch.float32,
                                        device=self.model.device).reshape(-1, d.hidden)
        if target_hidden.shape[0] != T:
            raise NinferError(f"mtp: {T} tokens but {target_hidden.shape[0]} target hidden rows")
        if positions is None:
            positions = torch.arange(state.position, state.position + T, device=self.model.device)
        w = self.weights
        e = rms_norm(self.model.embed(ids), w.embedding_norm, d.rms_eps)          # [T, H]
        h = rms_norm(target_hidden, w.hidden_norm, d.rms_eps)                      # [T, H]
        x = linear(torch.cat([e, h], dim=-1), w.input_projection)                  # [T, H]
        x = decoder_layer(x, w.layer, d, cache=state.kv, positions=positions)
        state.position += T
        return rms_norm(x, w.final_norm, d.rms_eps)

    def logits(self, token_ids, target_hidden: torch.Tensor, state: MTPState | None = None,
               positions: torch.Tensor | None = None) -> torch.Tensor:
        """Draft logits [T, vocab_rows] through the full text/output_head."""
        return linear(self.hidden(token_ids, target_hidden, state, positions), self.model.weights.output_head)


def mtp_logits(model, token_ids, target_hidden: torch.Tensor, mtp_state: MTPState | None = None) -> torch.Tensor:
    """Functional form: `model.mtp.logits(token_ids, target_hidden, mtp_state)`."""
    return model.mtp.logits(token_ids, target_hidden, mtp_state)
