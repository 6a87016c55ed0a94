"""Every call the server makes into the runtime's engine, in one module.

The scheduler (scheduler.py) never touches `Engine`, `generate` or `sampling` directly: it drives an
`EngineAdapter`, so a change of the engine API (the device-side sampler, the Engine constructor,
speculative decoding) is re-pointed here and nowhere else.

What the adapter adds on top of the engine:
- `prefill(slot, chunk, start)`: one prefill chunk at positions start.. into `slot` WITHOUT resetting
  it (generate.prefill always starts at position 0 on a reset slot); a request restored from the
  prefix cache continues at the cached length.
- `decode(columns, busy)`: one decode step whose padding columns never write into a slot that holds
  state (a sequence still in prefill owns its slot but is not in the decode batch; generate.decode_step
  would pad into it). Padding goes to free slots; when there are not enough, a busy slot is borrowed
  and its state rows (every GDN row, the KV row at the pad position) are saved and put back.
- `snapshot(slot, length)` / `restore(slot, snap)`: the per-slot state after `length` tokens, from the
  plan's `buffers.state` descriptions (kind "kv": rows [0, length) of the per-slot [max_context, ...]
  cache; any other kind, e.g. "gdn" conv + recurrent state: the whole per-slot row). Exact copies.
- sampling runs on the device, inside the extents (the plan's sampling launch over sampling.py's
  per-row inputs): `sampler(...)` makes a sequence's parameters; `prefill(..., sampler)` samples the
  column that ends the prompt and `decode(..., samplers)` every column, and the host reads only the
  new ids. `sample_from(row, sampler, position)` draws from a stored logits row (a prompt restored
  whole from the prefix cache) with the prefill extent's own sampling launch: the same draw as if the
  prompt had been prefilled (the noise depends on seed, position and token only).
- speculative decoding (a plan with a draft window K, `spec` "mtp" | "ngram" | None = the plan's
  default, as `generate(..., spec=)`): `spec_mode`, `draft_tokens`; `prefill(..., next_token=)` runs
  the MTP prefill chunk after the target chunk (speculative/rounds.py `mtp_prefill_chunk`; its last
  column pairs with `next_token`, in the prompt's last chunk with the sampled first token);
  `start_lane(slot, prompt, first, sampler)` / `release(slot)` a sequence's `Lane`;
  `decode_speculative(columns, busy, samplers)` one `spec_round` for every lane (each lane's emitted
  tokens, proposed / accepted drafts, and with the n-gram drafter the logits row its last token
  came from). Padding rows never write a busy slot: when too few slots are free, the busy slots the
  round pads into have their state rows (every GDN row, KV and MTP KV rows 0..K) saved and put back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..errors import NinferRuntimeError
from ..frontend import StreamDecoder
from ..graphs import replay_or_run
from ..sampling import SamplingParams, host_rows, require_device_sampling, upload_rows


@dataclass
class Sampler:
    params: SamplingParams


@dataclass
class StateSnapshot:
    """Per-slot state after `length` tokens (device or host tensors) and the logits row of token
    length-1 (to sample the next token without recomputing it)."""

    length: int
    tensors: dict[str, torch.Tensor]
    logits: torch.Tensor | None
    nbytes: int

    def to(self, device) -> "StateSnapshot":
        t = {k: v.to(device) for k, v in self.tensors.items()}
        lg = self.logits.to(device) if self.logits is not None else None
        return StateSnapshot(self.length, t, lg, self.nbytes)


def open_engine(plan: str, artifact: str, *, device: str | None = None, kernels: str | None = None,
                verify_weights: bool = False):
    """Load the engine (the one place the Engine constructor is called)."""
    from ..loader import load

    return load(plan, artifact, device=device, kernels=kernels, progress=False, verify_weights=verify_weights)


@dataclass
class RoundResult:
    """One sequence's share of a speculative round."""

    tokens: list[int]  # emitted, uncut: accepted drafts then the target's own token
    proposed: int
    accepted: int
    logits: torch.Tensor | None = None  # [V] device view: the row tokens[-1] was sampled from (n-gram only)


class EngineAdapter:
    """The engine as the scheduler sees it."""

    def __init__(self, engine, *, use_graphs: bool = True, spec=None):
        from ..speculative.rounds import resolve_spec

        self.engine = engine
        self.use_graphs = use_graphs
        mode, self._drafter_factory = resolve_spec(engine, spec)  # ValueError (one line) for a mode the plan lacks
        if mode == "custom":
            raise ValueError("ninfer-serve takes spec mtp, ngram or none")
        self.spec_mode = mode
        self.draft_tokens = int(getattr(engine, "draft_tokens", 0) or 0)
        self.lanes: dict[int, Any] = {}
        self.device = engine.device
        self.slots = int(engine.max_concurrency)
        self.total_slots = int(engine.slots)
        self.max_context = int(engine.max_context)
        self.chunk = int(engine.prefill_runner.t)
        self.vocab_size = int(engine.vocab_rows)
        self.frontend = engine.frontend
        self.stop_ids = frozenset(int(s) for s in engine.frontend.stop_ids)
        self.model_id = str(engine.plan.get("model_id", "model"))
        self._layout = []  # (name, kind, tensor)
        for name, b in sorted((engine.plan.get("buffers", {}).get("state") or {}).items()):
            self._layout.append((name, str(b.get("kind", "")), engine.state(name)))

    @property
    def speculative(self) -> bool:
        return self.spec_mode != "none"

    # ---------------------------------------------------------------- text
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

    # ---------------------------------------------------------------- sampling
    def sampler(self, *, temperature: float, top_p: float, top_k: int, seed: int) -> Sampler:
        p = SamplingParams(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p), seed=int(seed))
        return Sampler(p)

    def sample_from(self, row: torch.Tensor, sampler: Sampler, position: int) -> int:
        """The token a prefill ending at `position` would sample from logits `row` [V]: the row is
        written where the prefill extent keeps its last column's logits and only the launch that
        produces the extent's ids runs."""
        r = self.engine.prefill_runner
        require_device_sampling(r)
        ids, logits = r.outputs["ids"], r.outputs["logits"]
        launch = next((b for b in r.bound() if any(v is ids for v in b.kwargs.values())), None)
        if launch is None:
            raise NinferRuntimeError(f"extent {r.name}: no launch writes its ids")
        R = r.inputs["temperature"].shape[0]
        logits[0].copy_(row)
        sel = [(None, 0)] * R
        sel[0] = (sampler.params, position)
        upload_rows(r, host_rows(sel, R))
        launch()
        return int(ids[0].item())

    # ---------------------------------------------------------------- state
    def reset(self, slot: int) -> None:
        self.engine.reset_slot(slot)

    def snapshot(self, slot: int, length: int, logits: torch.Tensor | None) -> StateSnapshot:
        tensors, nbytes = {}, 0
        for name, kind, t in self._layout:
            row = t[slot][:length] if kind == "kv" else t[slot]
            c = row.clone()
            tensors[name] = c
            nbytes += c.numel() * c.element_size()
        lg = logits.detach().clone() if logits is not None else None
        if lg is not None:
            nbytes += lg.numel() * lg.element_size()
        return StateSnapshot(int(length), tensors, lg, nbytes)

    def restore(self, slot: int, snap: StateSnapshot) -> None:
        self.engine.reset_slot(slot)
        for name, kind, t in self._layout:
            src = snap.tensors[name]
            if kind == "kv":
                t[slot][: src.shape[0]].copy_(src)
            else:
                t[slot].copy_(src)

    # ---------------------------------------------------------------- steps
    def prefill(self, slot: int, chunk: list[int], start: int, sampler: Sampler | None = None, *,
                next_token: int | None = None) -> tuple[torch.Tensor, int | None]:
        """Run `chunk` (<= self.chunk tokens) at positions start.. into `slot`. Returns the logits row of
        the chunk's last column (a device view, valid until the next prefill) and, with `sampler` (the
        chunk ends the prompt), the token that column samples on the device (else None: no read).
        With MTP drafts the MTP prefill chunk runs right after over the same columns: ids shifted by
        one, the last one `next_token` (a chunk inside the prompt) or the sampled token (the last)."""
        r = self.engine.prefill_runner
        require_device_sampling(r)
        T = r.t
        n = len(chunk)
        if not 1 <= n <= T:
            raise NinferRuntimeError(f"prefill chunk of {n} tokens (the extent takes 1..{T})")
        if start + n > self.max_context:
            raise NinferRuntimeError(f"prefill to position {start + n} exceeds the max context {self.max_context}")
        host = torch.tensor([chunk, list(range(start, start + n)), [slot] * n], dtype=torch.int32)
        r.inputs["ids"][:n].copy_(host[0])
        r.inputs["positions"][:n].copy_(host[1])
        r.inputs["slots"][:n].copy_(host[2])
        rows = r.inputs.get("logit_rows")
        if rows is not None:
            rows.fill_(n - 1)
        logits = r.outputs["logits"]
        i = 0 if (rows is not None or logits.shape[0] != T) else n - 1  # the last column's row
        R = r.inputs["temperature"].shape[0]
        sel = [(None, 0)] * R
        if sampler is not None:
            sel[i] = (sampler.params, start + n)
        upload_rows(r, host_rows(sel, R))
        r.run(None if n == T else n)
        tok = int(r.outputs["ids"][i].item()) if sampler is not None else None
        if self.spec_mode != "mtp":
            return logits[i], tok
        from ..speculative.rounds import mtp_prefill_chunk

        if sampler is None and next_token is None:
            raise NinferRuntimeError("an MTP prefill chunk inside the prompt needs the next prompt token")
        # mtp_prefill_chunk reads the ids x_{start+1} .. x_{start+n} of its `prompt` argument, and treats
        # the chunk as the prompt's last when the list ends there (the sampled id then comes from the device)
        seq = [0] * start + list(chunk) + ([] if sampler is not None else [int(next_token)])
        got = mtp_prefill_chunk(self.engine, slot, seq, start, n, i)
        return (got[0] if got is not None else logits[i]), tok

    def decode(self, columns: list[tuple[int, int, int]], busy: set[int],
               samplers: list[Sampler]) -> tuple[torch.Tensor, list[int]]:
        """One decode step for columns (token, position, slot), column i sampling with samplers[i] on
        the device; `busy` = slots holding state that are not in the batch. Returns the logits
        [len(columns), V] (a device view) and the new ids (the step's one device->host read)."""
        e = self.engine
        a = len(columns)
        runner = next((r for r in e.decode_runners if r.concurrency >= a), None)
        if runner is None:
            raise NinferRuntimeError(f"{a} concurrent sequences exceed the plan's largest decode extent "
                                     f"(C={e.decode_runners[-1].concurrency})")
        C = runner.t
        used = {s for _, _, s in columns}
        free = [s for s in range(e.slots) if s not in used and s not in busy]
        borrowed = [s for s in sorted(busy) if s not in used]
        pads = (free + borrowed)[: C - a]
        if len(pads) < C - a:
            raise NinferRuntimeError(f"no slot left to pad a decode step of {a} columns to C={C}")
        saved = [(s, self._save_rows(s, 0)) for s in pads if s in busy]
        cols = list(columns) + [(0, 0, s) for s in pads]
        host = torch.tensor([[c[0] for c in cols], [c[1] for c in cols], [c[2] for c in cols]], dtype=torch.int32)
        runner.inputs["ids"].copy_(host[0])
        runner.inputs["positions"].copy_(host[1])
        runner.inputs["slots"].copy_(host[2])
        require_device_sampling(runner)
        upload_rows(runner, host_rows([(sp.params, c[1] + 1) for sp, c in zip(samplers, columns)], C))
        replay_or_run(e, runner, self.use_graphs)
        ids = runner.outputs["ids"][:a].tolist()
        for s, rows in saved:
            self._put_rows(s, 0, rows)
        return runner.outputs["logits"][:a], ids

    # ---------------------------------------------------------------- speculative rounds
    def start_lane(self, slot: int, prompt: list[int], first: int, sampler: Sampler) -> None:
        """`slot` enters decode with its first token `first` (sampled at position len(prompt)): its
        Lane (MTP: the drafts the last MTP prefill chunk left on the device; n-gram: a drafter over
        prompt + first)."""
        from ..speculative.rounds import Lane

        if slot in self.lanes:
            raise NinferRuntimeError(f"slot {slot} already has a speculative lane")
        drafter = None
        if self._drafter_factory is not None:
            drafter = self._drafter_factory(list(prompt))
            drafter.extend([int(first)])
        lane = Lane(slot, sampler.params, drafter)
        lane.last, lane.position = int(first), len(prompt)
        self.lanes[slot] = lane

    def release(self, slot: int) -> None:
        self.lanes.pop(slot, None)

    def decode_speculative(self, columns: list[tuple[int, int, int]], busy: set[int],
                           samplers: list[Sampler]) -> list[RoundResult]:
        """One speculative round for columns (t0, position, slot) of lanes started by `start_lane`
        (`busy`: slots holding state outside the batch). Returns per column its `RoundResult`."""
        from ..speculative.rounds import spec_round

        e = self.engine
        lanes = []
        for t0, pos, slot in columns:
            lane = self.lanes.get(slot)
            if lane is None or lane.last != t0 or lane.position != pos:
                raise NinferRuntimeError(f"slot {slot}: the speculative lane is not at token {t0}, position {pos}")
            lanes.append(lane)
        free = [s for s in range(e.slots) if s not in self.lanes and s not in busy]
        need = self._pads_needed(lanes)
        saved, pass_busy = [], set(busy)
        if len(free) < need:  # pad into busy slots: save the rows a padding row writes, put them back after
            others = [s for s in range(e.slots) if s not in self.lanes][:need]
            saved = [(s, self._save_rows(s, slice(0, self.draft_tokens + 1))) for s in others if s in busy]
            pass_busy = set()
        before = [(l.proposed, l.accepted) for l in lanes]
        out = spec_round(e, lanes, self.use_graphs, busy=pass_busy)
        for s, rows in saved:
            self._put_rows(s, slice(0, self.draft_tokens + 1), rows)
        res = []
        n_ver = sum(1 for l in lanes if l.last_step == "verify")
        i_ver = i_plain = 0
        W = self.draft_tokens + 1
        for lane, em, (p0, a0) in zip(lanes, out, before):
            row = None
            if self.spec_mode != "mtp":  # the row the last token came from (for the end-of-generation snapshot)
                if lane.last_step == "verify":
                    v = next(r for r in e.verify_runners if r.concurrency >= n_ver)
                    row = v.outputs["logits"][i_ver * W + len(em) - 1]
                    i_ver += 1
                else:
                    d = next(r for r in e.decode_runners if r.concurrency >= len(lanes) - n_ver)
                    row = d.outputs["logits"][i_plain]
                    i_plain += 1
            res.append(RoundResult([int(t) for t in em], lane.proposed - p0, lane.accepted - a0, row))
        return res

    def _pads_needed(self, lanes) -> int:
        """Padding rows the round's extents take: verify (and the MTP chain) for the lanes with room
        for a window, a plain step for the others."""
        e, W = self.engine, self.draft_tokens + 1
        ver = sum(1 for l in lanes if l.position + W - 1 < e.max_context)
        plain = len(lanes) - ver
        need = 0
        if ver:
            need = max(need, next(r.concurrency for r in e.verify_runners if r.concurrency >= ver) - ver)
        if plain:
            need = max(need, next(r.concurrency for r in e.decode_runners if r.concurrency >= plain) - plain)
        return need

    def _save_rows(self, slot: int, pos) -> list[torch.Tensor]:
        return [(t[slot][pos].clone() if kind == "kv" else t[slot].clone()) for _, kind, t in self._layout]

    def _put_rows(self, slot: int, pos: int, rows: list[torch.Tensor]) -> None:
        for (_, kind, t), r in zip(self._layout, rows):
            (t[slot][pos] if kind == "kv" else t[slot]).copy_(r)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        self.engine.close()
