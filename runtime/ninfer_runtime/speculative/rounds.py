"""Speculative rounds over a plan with a draft window K (docs/SPECULATIVE.md, binding).

Step-level API (generate.py's `stream(..., spec=...)` and the server build on it):

- `Lane(slot, params=None, drafter=None)`: one sequence. `drafter` None = MTP drafts (kept on the
  device, in `SpecBuffers`); else a host drafter with `.extend(tokens)` / `.propose(k)` (n-gram,
  test oracles). `lane.last` = the last emitted token (not yet consumed by the target),
  `lane.position` = the position it takes.
- `prefill_lane(engine, lane, prompt)`: `steps.prefill` of the prompt into `lane.slot` (reset
  first; with MTP, after each target chunk, the `mtp_prefill` chunk over the same columns: ids
  shifted by one, the last chunk's final id = the target's sampled first token, copied on the
  device: `mtp_prefill_chunk`). Returns (logits row [V], first token). The step API
  (steps.py `Stepper`) is how `generate.stream` and the server drive lanes and rounds.
- `spec_round(engine, lanes, use_graphs=True, busy=(), stats=None) -> list[list[int]]`: one round
  for all lanes together: each lane emits accepted + 1 tokens (uncut: the caller cuts at stop ids /
  max tokens / context). A lane with fewer than W = K + 1 positions left takes one plain
  `decode_c{C}_k0` step instead (one token). Padding rows (positions 0..K, greedy) never change a
  busy slot's state: steps.py `padding_slots` (free slots first, borrowed ones saved and put back).

A round (all verify lanes in the smallest verify extent with C >= their count):
1. MTP lanes: K - 1 chained `mtp_decode` steps (draft j+1 from draft j and the previous MTP hidden
   row, at the previous column's position + 1), on the device: drafts 2..K into `draft_ids`;
2. fill the verify inputs (t0 + host drafts per row; MTP drafts copied from `draft_ids`), run
   `verify_c{C}_k{K}` (its CUDA graph on a GPU);
3. read `accepted` and `tokens` (the round's one device->host read); row r emits
   tokens[rW .. rW + accepted[r]];
4. MTP lanes: `mtp_verify` over the round's W columns (ids = the verify's tokens, hidden = its
   hidden, same positions and slots); column accepted[r] gives draft 1 of the next round and the
   hidden row the chain starts from (step 1 of the next round).
The drafts of step 1 are made at the start of the next round (not after step 4) so a lane that
finishes in this round makes none. Copies between extents go through `SpecBuffers` (engine-owned
device buffers): every extent plans its own offsets in the one arena, so one extent's outputs may
lie under another's inputs. Sampling rows are per column: the lane's parameters, sample_pos =
position + 1 of the column; the MTP extents sample greedily.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import NinferRuntimeError
from ..graphs import replay_or_run
from ..sampling import SamplingParams, host_rows, upload_rows
from ..steps import decode_step, padding_slots, pick_runner, prefill


class Lane:
    """One sequence's speculative state: `slot`, sampling `params` (None: greedy), `drafter` (None:
    MTP drafts on the device), `last` (t0: the last emitted token, not yet consumed), `position`
    (t0's position), `keep_logits` (store each emitted token's float32 logits row [V] in
    `logits`), `last_row` (a device view of the row its last token came from; None for MTP
    lanes, whose extents overwrite it), and counters `rounds` / `proposed` / `accepted` /
    `plain_steps`."""

    def __init__(self, slot: int, params: SamplingParams | None = None, drafter: Any = None, *,
                 keep_logits: bool = False):
        self.slot = int(slot)
        self.params = params
        self.drafter = drafter
        self.last = -1
        self.position = 0
        self.keep_logits = keep_logits
        self.logits: list[torch.Tensor] = []
        self.last_row: torch.Tensor | None = None
        self.rounds = self.proposed = self.accepted = self.plain_steps = 0
        self.last_step = ""  # "verify" | "plain": what produced the lane's last emission

    def begin(self, first: int, position: int) -> None:
        """The lane enters decode with its first token `first` at `position` (= the prompt length)."""
        self.last, self.position = int(first), int(position)
        if self.drafter is not None:
            self.drafter.extend([self.last])

    @property
    def uses_mtp(self) -> bool:
        return self.drafter is None

    def __repr__(self) -> str:
        kind = "mtp" if self.uses_mtp else type(self.drafter).__name__
        return f"Lane(slot={self.slot}, {kind}, last={self.last}, position={self.position})"


class SpecBuffers:
    """Engine-owned device buffers of the rounds (not in the arena): `draft_ids` int32 [slots, K]
    (a lane's MTP drafts for its next round), `mtp_hidden` [slots, H] (the MTP hidden row its
    chain continues from), staging `ids` int32 [T_max] / `hidden` [T_max, H] for copies between
    extents, and the first token / logits row of the last prefill."""

    def __init__(self, engine):
        K = max(1, engine.draft_tokens)
        S = engine.slots
        z = engine.backend.zeros
        t_max = max([engine.prefill_runner.t] + [r.t for r in engine.verify_runners])
        self.draft_ids = z([S, K], torch.int32)
        lg = engine.prefill_runner.outputs["logits"]
        self.logits_row = z([int(lg.shape[-1])], lg.dtype)
        self.first_id = z([1], torch.int32)
        self.ids = z([t_max], torch.int32)
        self.mtp_hidden = self.hidden = None
        if engine.has_mtp_drafts:
            h = engine.mtp_decode_runners[0].inputs["hidden"]
            self.mtp_hidden = z([S, int(h.shape[-1])], h.dtype)
            self.hidden = z([t_max, int(h.shape[-1])], h.dtype)
        self._host: dict[str, torch.Tensor] = {}
        self._pinned = engine.device.type == "cuda"

    def upload(self, key: str, values: torch.Tensor) -> torch.Tensor:
        """`values` (host int32) in a reusable (pinned on a GPU) staging buffer named `key`; copy it to
        the device with non_blocking=`self.nb`. One key per use within a round (the round's read
        orders the next reuse after the copies)."""
        buf = self._host.get(key)
        if buf is None or buf.numel() != values.numel():
            buf = torch.empty(values.numel(), dtype=torch.int32, pin_memory=self._pinned)
            self._host[key] = buf
        buf.copy_(values.reshape(-1))
        return buf

    @property
    def nb(self) -> bool:
        return self._pinned


def spec_buffers(engine) -> SpecBuffers:
    b = engine.__dict__.get("_spec_buffers")
    if b is None:
        b = engine.__dict__["_spec_buffers"] = SpecBuffers(engine)
    return b


def _greedy_rows(runner, bufs: SpecBuffers, key: str) -> None:
    R = runner.inputs["temperature"].shape[0]
    upload_rows(runner, bufs.upload(key, host_rows([], R)), non_blocking=bufs.nb)


# ----------------------------------------------------------------------------- prefill


def mtp_prefill_chunk(engine, slot: int, chunk: list[int], start: int, row: int, next_token: int | None):
    """Run `mtp_prefill` over the target prefill chunk just run (`chunk` at positions start.. in
    `slot`; its outputs still in the arena; `row` = the row of its last column in the logits / ids
    outputs). MTP column i pairs the target hidden at position start+i with the token at start+i+1
    (chunk[i+1]; for the last column `next_token`, the next prompt token, or with `next_token`
    None (the prompt's last chunk) the target's sampled first token, copied on the device). On the
    last chunk: stores draft 1 and the MTP hidden row of the last column for the lane's chain, and
    returns (logits row [V], first id [1]) copied out of the arena (the MTP run overwrites the
    target's outputs). Returns None on the other chunks."""
    text, m = engine.prefill_runner, engine.mtp_prefill_runner
    if m is None:
        raise NinferRuntimeError("the plan has no MTP prefill extent")
    b = spec_buffers(engine)
    n, last = len(chunk), next_token is None
    b.hidden[:n].copy_(text.outputs["hidden"][:n])  # [n, H]
    if last:
        b.first_id.copy_(text.outputs["ids"][row:row + 1])
        b.logits_row.copy_(text.outputs["logits"][row])
    nxt = list(chunk[1:]) + [0 if last else int(next_token)]  # [n]: ids x_{s+1} .. (x_L: a placeholder)
    host = torch.tensor([nxt, list(range(start, start + n)), [slot] * n], dtype=torch.int32)
    # blocking copies: the staging buffers are reused by the next chunk before any device->host read
    words = b.upload("mtp_prefill", host)
    ins = m.inputs
    ins["ids"][:n].copy_(words[0:n])
    ins["positions"][:n].copy_(words[n:2 * n])
    ins["slots"][:n].copy_(words[2 * n:3 * n])
    if last:
        ins["ids"][n - 1:n].copy_(b.first_id)
    ins["hidden"][:n].copy_(b.hidden[:n])
    rows = ins.get("logit_rows")
    if rows is not None:
        rows.fill_(n - 1)
    if "temperature" in ins:
        R = ins["temperature"].shape[0]
        upload_rows(m, host_rows([], R))
    m.run(None if n == m.t else n)
    if not last:
        return None
    j = 0 if (rows is not None or m.outputs["ids"].shape[0] != m.t) else n - 1
    b.draft_ids[slot, 0:1].copy_(m.outputs["ids"][j:j + 1])
    b.mtp_hidden[slot].copy_(m.outputs["hidden"][n - 1])
    return b.logits_row, b.first_id


def prefill_lane(engine, lane: Lane, prompt: list[int]) -> tuple[torch.Tensor, int]:
    """Prefill `prompt` into `lane.slot` (reset first; + the MTP prefill chunks for an MTP lane) and
    begin the lane with the first token (sampled with `lane.params`) at position len(prompt); a
    host drafter is created by the caller. Returns (logits row [V] (device view), first token)."""
    if lane.uses_mtp and not engine.has_mtp_drafts:
        raise NinferRuntimeError("the plan has no MTP draft extents (compile the artifact's MTP part with "
                                 "--draft-tokens K)")
    row, tok = prefill(engine, prompt, lane.slot, lane.params, mtp=lane.uses_mtp)
    lane.begin(int(tok.tolist()[0]), len(prompt))
    return row, lane.last


# ----------------------------------------------------------------------------- rounds


def _mtp_chain(engine, lanes: list[Lane], pads: list[int], use_graphs: bool) -> None:
    """Drafts 2..K of each MTP lane: K-1 `mtp_decode` steps, one row per lane (ids = the previous
    draft, hidden = the previous MTP hidden row, position = lane.position + step - 1)."""
    K = engine.draft_tokens
    if K < 2 or not lanes:
        return
    b = spec_buffers(engine)
    m = pick_runner(engine.mtp_decode_runners, len(lanes), "MTP decode")
    C, a = m.t, len(lanes)
    dev = engine.device
    sidx = b.upload("chain_slots", torch.tensor([l.slot for l in lanes], dtype=torch.int32)).to(
        dev, non_blocking=b.nb).long()
    slots = [l.slot for l in lanes] + pads[:C - a]
    for step in range(1, K):
        pos = [l.position + step - 1 for l in lanes] + [0] * (C - a)
        words = b.upload(f"chain{step}", torch.tensor([pos, slots], dtype=torch.int32))
        m.inputs["positions"].copy_(words[0:C], non_blocking=b.nb)
        m.inputs["slots"].copy_(words[C:2 * C], non_blocking=b.nb)
        if "temperature" in m.inputs:
            _greedy_rows(m, b, f"chain_rows{step}")
        ids, hid = m.inputs["ids"], m.inputs["hidden"]
        if C > a:
            ids[a:].zero_()
            hid[a:].zero_()
        torch.index_select(b.draft_ids[:, step - 1], 0, sidx, out=ids[:a])  # [a]
        torch.index_select(b.mtp_hidden, 0, sidx, out=hid[:a])  # [a, H]
        replay_or_run(engine, m, use_graphs)
        b.draft_ids[:, step].index_copy_(0, sidx, m.outputs["ids"][:a])
        b.mtp_hidden.index_copy_(0, sidx, m.outputs["hidden"][:a])


def _mtp_verify(engine, v, lanes: list[Lane], rows: list[int], acc: list[int], words: torch.Tensor,
                use_graphs: bool) -> None:
    """`mtp_verify` over the verify round just run (`v`: its runner; `words`: its uploaded host
    words, ids [T] / positions [T] / slots [T] first): ids = the verify's tokens, hidden = its
    hidden rows; column accepted[r] of row r gives the lane's next draft 1 and chain hidden row."""
    b = spec_buffers(engine)
    m = next(r for r in engine.mtp_verify_runners if r.concurrency == v.concurrency)
    T, W = v.t, engine.draft_tokens + 1
    b.ids[:T].copy_(v.outputs["tokens"])
    b.ids[:T].clamp_(0, engine.vocab_rows - 1)  # entries past a row's accepted ones are unspecified
    b.hidden[:T].copy_(v.outputs["hidden"])
    m.inputs["ids"].copy_(b.ids[:T])
    m.inputs["hidden"].copy_(b.hidden[:T])
    m.inputs["positions"].copy_(words[T:2 * T], non_blocking=b.nb)
    m.inputs["slots"].copy_(words[2 * T:3 * T], non_blocking=b.nb)
    if "temperature" in m.inputs:
        _greedy_rows(m, b, "mtp_verify_rows")
    idx = torch.tensor([[r * W + acc[r] for r in rows], [l.slot for l in lanes]], dtype=torch.int32)
    dev_idx = b.upload("mtp_verify_idx", idx).to(engine.device, non_blocking=b.nb).long().view(2, -1)
    replay_or_run(engine, m, use_graphs)
    cols, sidx = dev_idx[0], dev_idx[1]
    b.draft_ids[:, 0].index_copy_(0, sidx, m.outputs["ids"].index_select(0, cols))
    b.mtp_hidden.index_copy_(0, sidx, m.outputs["hidden"].index_select(0, cols))


def _drafts(engine, lane: Lane, K: int) -> list[int]:
    """Up to K host drafts of a lane's drafter (cut at the first id outside the vocabulary)."""
    out = []
    for t in list(lane.drafter.propose(K))[:K]:
        t = int(t)
        if not 0 <= t < engine.vocab_rows:
            break
        out.append(t)
    return out


def _verify(engine, lanes: list[Lane], pads: list[int], use_graphs: bool, stats: dict | None) -> list[list[int]]:
    K = engine.draft_tokens
    W = K + 1
    b = spec_buffers(engine)
    mtp = [i for i, l in enumerate(lanes) if l.uses_mtp]
    if mtp:
        _mtp_chain(engine, [lanes[i] for i in mtp], pads, use_graphs)
    v = pick_runner(engine.verify_runners, len(lanes), "verify")
    C, T, a = v.concurrency, v.t, len(lanes)
    ids, pos, slots, nd, srows = [], [], [], [], []
    for l in lanes:
        d = [0] * K if l.uses_mtp else _drafts(engine, l, K)
        nd.append(K if l.uses_mtp else len(d))
        ids += [l.last] + d + [0] * (K - len(d))
        pos += [l.position + j for j in range(W)]
        slots += [l.slot] * W
        srows += [(l.params, l.position + j + 1) for j in range(W)]
    for s in pads[:C - a]:
        ids += [0] * W
        pos += list(range(W))
        slots += [s] * W
        nd.append(0)
    host = torch.cat([torch.tensor([ids, pos, slots], dtype=torch.int32).reshape(-1),
                      torch.tensor(nd, dtype=torch.int32), host_rows(srows, T)])
    words = b.upload(f"verify{C}", host)
    ins = v.inputs
    ins["ids"].copy_(words[0:T], non_blocking=b.nb)
    ins["positions"].copy_(words[T:2 * T], non_blocking=b.nb)
    ins["slots"].copy_(words[2 * T:3 * T], non_blocking=b.nb)
    ins["n_drafts"].copy_(words[3 * T:3 * T + C], non_blocking=b.nb)
    upload_rows(v, words[3 * T + C:], non_blocking=b.nb)
    if mtp:  # the MTP lanes' drafts: device copies from draft_ids [slots, K] into their rows' columns 1..K
        idx = b.upload("verify_mtp_idx", torch.tensor([mtp, [lanes[i].slot for i in mtp]], dtype=torch.int32))
        idx = idx.to(engine.device, non_blocking=b.nb).long().view(2, -1)
        ins["ids"].view(C, W)[:, 1:].index_copy_(0, idx[0], b.draft_ids.index_select(0, idx[1]))
    replay_or_run(engine, v, use_graphs)
    res = torch.cat([v.outputs["accepted"], v.outputs["tokens"]]).tolist()  # the round's one device->host read
    acc = [max(0, min(int(res[r]), nd[r])) for r in range(C)]
    toks = res[C:]
    keep = any(l.keep_logits for l in lanes)
    lg = v.outputs["logits"].float().cpu() if keep else None  # [T, V], before the MTP extents overwrite it
    out = []
    for r, l in enumerate(lanes):
        em = [int(t) for t in toks[r * W:r * W + acc[r] + 1]]
        if l.keep_logits:
            l.logits = [lg[r * W + j].clone() for j in range(len(em))]
        l.last_row = None if l.uses_mtp else v.outputs["logits"][r * W + len(em) - 1]
        l.rounds += 1
        l.proposed += nd[r]
        l.accepted += acc[r]
        l.last_step = "verify"
        out.append(em)
    if mtp:
        _mtp_verify(engine, v, [lanes[i] for i in mtp], mtp, acc, words, use_graphs)
    for l, em in zip(lanes, out):
        l.position += len(em)
        l.last = em[-1]
        if l.drafter is not None:
            l.drafter.extend(em)
    if stats is not None:
        stats["rounds"] = stats.get("rounds", 0) + 1
        stats["lane_rounds"] = stats.get("lane_rounds", 0) + a
        stats["proposed"] = stats.get("proposed", 0) + sum(nd[:a])
        stats["accepted"] = stats.get("accepted", 0) + sum(acc[:a])
    return out


def _plain(engine, lanes: list[Lane], busy, use_graphs: bool, stats: dict | None) -> list[list[int]]:
    logits, ids = decode_step(engine, [(l.last, l.position, l.slot) for l in lanes], [l.params for l in lanes],
                              use_graphs=use_graphs, busy=set(busy))
    toks = ids.tolist()  # the step's one device->host read
    out = []
    for i, (l, t) in enumerate(zip(lanes, toks)):
        if l.keep_logits:
            l.logits = [logits[i].float().cpu().clone()]
        l.last_row = logits[i]
        l.position += 1
        l.last = int(t)
        l.plain_steps += 1
        l.last_step = "plain"
        if l.drafter is not None:
            l.drafter.extend([int(t)])
        out.append([int(t)])
    if stats is not None:
        stats["plain_steps"] = stats.get("plain_steps", 0) + 1
    return out


def spec_round(engine, lanes: list[Lane], use_graphs: bool = True, *, busy=(), stats: dict | None = None
               ) -> list[list[int]]:
    """One round for `lanes` (distinct slots; each after `prefill_lane` / its previous round):
    returns each lane's emitted tokens, uncut (1 .. K+1: the accepted drafts then the target's own
    token; 1 for a lane that took a plain step because fewer than K+1 positions are left). `busy`:
    slots holding other sequences (padding rows never change their state). `stats` (optional dict) accumulates
    rounds (verify launches), lane_rounds, proposed, accepted, plain_steps (plain launches).
    Each lane's `last` / `position` / counters (and drafter) are advanced."""
    K = engine.draft_tokens
    if K < 1 or not engine.verify_runners:
        raise NinferRuntimeError("the plan has no verify extents (compile with --draft-tokens K)")
    if len({l.slot for l in lanes}) != len(lanes):
        raise NinferRuntimeError("two lanes share a slot")
    ver = [l for l in lanes if l.position + K < engine.max_context]
    plain = [l for l in lanes if l.position + K >= engine.max_context]
    n_mtp = sum(1 for l in ver if l.uses_mtp)
    need = max([0] + [pick_runner(rs, n, what).concurrency - n for rs, n, what in (
        (engine.verify_runners, len(ver), "verify"), (engine.mtp_decode_runners, n_mtp, "MTP decode"),
        (engine.decode_runners, len(plain), "decode")) if n])
    got: dict[int, list[int]] = {}
    with padding_slots(engine, {l.slot for l in lanes}, busy, need, K + 1) as pads:
        if ver:
            for l, em in zip(ver, _verify(engine, ver, pads, use_graphs, stats)):
                got[id(l)] = em
        if plain:
            for l in ver:  # the plain step's extent may overwrite the verify outputs
                l.last_row = l.last_row.clone() if l.last_row is not None else None
            others = set(range(engine.slots)) - set(pads)  # the plain step pads into `pads` only
            for l, em in zip(plain, _plain(engine, plain, others, use_graphs, stats)):
                got[id(l)] = em
    return [got[id(l)] for l in lanes]


SPEC_MODES = ("mtp", "ngram", "none")


def resolve_spec(engine, spec) -> tuple[str, Any]:
    """(mode, drafter factory) for `generate(..., spec=...)`: None -> the plan's default ("mtp" when
    it has MTP draft extents, else "none"); "mtp" -> (mtp, None); "ngram" -> NgramDrafter; a
    callable(prompt_tokens) -> drafter -> ("custom", it); "none" -> plain steps. Raises ValueError
    for a mode the plan cannot run (one line)."""
    from .ngram import NgramDrafter

    K = engine.draft_tokens
    if spec is None:
        return ("mtp", None) if engine.has_mtp_drafts else ("none", None)
    if callable(spec):
        if K == 0:
            raise ValueError("speculative decoding with a drafter needs a plan compiled with --draft-tokens K "
                             "(this plan has none)")
        return "custom", spec
    if not isinstance(spec, str) or spec not in SPEC_MODES:
        raise ValueError(f"spec must be one of {', '.join(SPEC_MODES)} or a drafter factory, got {spec!r}")
    if spec == "none":
        return "none", None
    if K == 0:
        raise ValueError(f"--spec {spec} needs a plan compiled with --draft-tokens K (this plan has no draft "
                         f"window; use --spec none)")
    if spec == "mtp":
        if not engine.has_mtp_drafts:
            raise ValueError("--spec mtp needs MTP draft extents: the plan has none (the artifact has no MTP part, "
                             "or it was compiled without it); use --spec ngram or none")
        return "mtp", None
    return "ngram", NgramDrafter


__all__ = ["Lane", "SPEC_MODES", "SpecBuffers", "mtp_prefill_chunk", "prefill_lane", "resolve_spec",
           "spec_buffers", "spec_round"]
