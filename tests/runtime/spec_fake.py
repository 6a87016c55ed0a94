"""A fake speculative Engine for the round logic (speculative/rounds.py) without a compiled plan.

The fake has the extents of a plan with a draft window K (docs/SPECULATIVE.md: prefill, decode
k0, verify, and the three MTP kinds) with the plan's input / output names and shapes, all placed
from offset 0 of ONE shared byte arena (as the compiler's memory plans are: one extent's outputs
lie under another's inputs), and computes them with the float32 reference model
(ninfer_compile.reference) from a per-slot history of consumed columns: target column (token t,
position p, slot s) -> hist[s][p] = t, logits / hidden of the model over hist[s][0..p]; MTP column
(t, p, s, hidden h) -> mhist[s][p] = (t, h), the MTP head over mhist[s][0..p]. That is the KV
semantics of the real extents (a column reads rows 0..its position; rows past a row's accepted
columns are rewritten before anything reads them); the GDN rollback (state_select) is assumed.
Greedy only. After a run the fake scribbles over every output row the contract leaves
unspecified (tokens past accepted) and over its own inputs, so the rounds must not rely on them.

Protocol checks (`FakeEngine.violations`): every column a target run reads is present; when an MTP
chain starts at position P of slot s (its first step), every MTP row q < P - 1 pairs the target's token at
q + 1 with the target's hidden at q (docs/SPECULATIVE.md, "The MTP graphs").
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

GARBAGE = 1 << 20


class _Backend:
    def __init__(self):
        self.device = torch.device("cpu")

    def zeros(self, shape, dtype):
        return torch.zeros(shape, dtype=dtype)


class FakeRunner:
    def __init__(self, eng, name, graph, phase, t, c, inputs, outputs):
        self.engine, self.name, self.graph, self.phase, self.t, self.concurrency = eng, name, graph, phase, t, c
        self.capture = False
        off = 0
        self.inputs, self.outputs = {}, {}
        for group, spec in ((self.inputs, inputs), (self.outputs, outputs)):
            for n, (shape, dt) in spec.items():
                es = torch.empty((), dtype=dt).element_size()
                nb = es
                for d in shape:
                    nb *= d
                group[n] = eng.arena[off:off + nb].view(dt).view(shape)
                off = (off + nb + 15) // 16 * 16
        assert off <= eng.arena.numel(), (name, off)

    def run(self, n=None):
        self.engine.compute(self, self.t if n is None else n)
        self.engine.runs.append(self.name)


def _sampling(R):
    return {"temperature": ((R,), torch.float32), "top_k": ((R,), torch.int32), "top_p": ((R,), torch.float32),
            "seed": ((R, 2), torch.int32), "sample_pos": ((R,), torch.int32)}


class FakeEngine:
    def __init__(self, model, *, k: int, concurrency=(1, 2), chunk: int = 8, max_context: int = 48, mtp: bool = True):
        self.model = model
        d = model.dims
        V, H = d.vocab_rows, d.hidden
        self.draft_tokens, self.slots, self.max_context, self.vocab_rows = k, max(concurrency), max_context, V
        self.backend = _Backend()
        self.device = self.backend.device
        self.arena = torch.zeros(1 << 20, dtype=torch.uint8)
        self.graphs, self.last_stats, self.runs, self.violations = {}, {}, [], []
        self.frontend = SimpleNamespace(stop_ids=(), has_tokenizer=False)
        W = k + 1
        bf = torch.bfloat16
        i32 = torch.int32

        def io(T):
            return {"ids": ((T,), i32), "positions": ((T,), i32), "slots": ((T,), i32)}

        self.prefill_runner = FakeRunner(self, f"prefill_t{chunk}", "text", "prefill", chunk, 1,
                                         {**io(chunk), "logit_rows": ((1,), i32), **_sampling(1)},
                                         {"logits": ((1, V), bf), "ids": ((1,), i32), "hidden": ((chunk, H), bf)})
        self.decode_runners = [FakeRunner(self, f"decode_c{c}_k0", "text", "decode", c, c, {**io(c), **_sampling(c)},
                                          {"logits": ((c, V), bf), "ids": ((c,), i32)}) for c in concurrency]
        self.verify_runners = [FakeRunner(self, f"verify_c{c}_k{k}", "text", "verify", c * W, c,
                                          {**io(c * W), "n_drafts": ((c,), i32), **_sampling(c * W)},
                                          {"logits": ((c * W, V), bf), "tokens": ((c * W,), i32),
                                           "accepted": ((c,), i32), "hidden": ((c * W, H), bf)})
                               for c in concurrency]
        self.has_mtp_drafts = mtp
        self.mtp_prefill_runner, self.mtp_decode_runners, self.mtp_verify_runners = None, [], []
        if mtp:
            def mo(T, R):
                return {"logits": ((R, V), bf), "ids": ((R,), i32), "hidden": ((T, H), bf)}

            self.mtp_prefill_runner = FakeRunner(self, f"mtp_prefill_t{chunk}", "mtp", "prefill", chunk, 1,
                                                 {**io(chunk), "hidden": ((chunk, H), bf), "logit_rows": ((1,), i32),
                                                  **_sampling(1)}, mo(chunk, 1))
            self.mtp_decode_runners = [FakeRunner(self, f"mtp_decode_c{c}_k0", "mtp", "decode", c, c,
                                                  {**io(c), "hidden": ((c, H), bf), **_sampling(c)}, mo(c, c))
                                       for c in concurrency]
            self.mtp_verify_runners = [FakeRunner(self, f"mtp_verify_c{c}_k{k}", "mtp", "verify", c * W, c,
                                                  {**io(c * W), "hidden": ((c * W, H), bf), **_sampling(c * W)},
                                                  mo(c * W, c * W)) for c in concurrency]
        self.max_concurrency = self.slots
        self.hist = [dict() for _ in range(self.slots)]   # slot -> {position: token}
        self.thid = [dict() for _ in range(self.slots)]   # slot -> {position: bf16 hidden [H]}
        self.mhist = [dict() for _ in range(self.slots)]  # slot -> {position: (token, bf16 hidden [H])}
        self.drafts_seen: list[tuple[int, int, list[int]]] = []  # (slot, position of t0, drafts) per verify row

    # engine API used by the runtime
    def reset_slot(self, slot):
        self.hist[slot], self.thid[slot], self.mhist[slot] = {}, {}, {}

    def zero_state(self):
        for s in range(self.slots):
            self.reset_slot(s)

    # ------------------------------------------------------------------ model
    def _target(self, slot, upto):
        """(logits [upto+1, V], hidden [upto+1, H]) of the model over hist[slot][0..upto]."""
        h = self.hist[slot]
        miss = [q for q in range(upto + 1) if q not in h]
        if miss:
            self.violations.append(f"target slot {slot}: position {miss[0]} read before written")
            return None
        toks = tuple(h[q] for q in range(upto + 1))
        cache = self.model.__dict__.setdefault("_fake_prefix_cache", {})
        got = cache.get(toks)
        if got is None:
            with torch.no_grad():
                lg = self.model.prefill(list(toks))
            got = cache[toks] = (lg, self.model.last_state.hidden)
        return got

    def _mtp(self, slot, upto):
        mh = self.mhist[slot]
        miss = [q for q in range(upto + 1) if q not in mh]
        if miss:
            self.violations.append(f"mtp slot {slot}: position {miss[0]} read before written")
            return None
        ids = [mh[q][0] for q in range(upto + 1)]
        hid = torch.stack([mh[q][1].float() for q in range(upto + 1)])
        with torch.no_grad():
            x = self.model.mtp.hidden(ids, hid)
            lg = x @ self.model.weights.output_head.T
        return lg, x

    def _rows(self, runner, n):
        """Consecutive runs of columns of one slot: [(slot, first column, last column)]."""
        ins = runner.inputs
        sl, ps = ins["slots"][:n].tolist(), ins["positions"][:n].tolist()
        out, i = [], 0
        while i < n:
            j = i
            while j + 1 < n and sl[j + 1] == sl[i] and ps[j + 1] == ps[j] + 1 and not (
                    runner.phase != "prefill" and (j + 1) % (runner.t // runner.concurrency) == 0):
                j += 1
            out.append((sl[i], i, j))
            i = j + 1
        return out, sl, ps

    def compute(self, r, n):
        ins, outs = r.inputs, r.outputs
        if "temperature" in ins and bool((ins["temperature"][: (1 if r.phase == "prefill" else n)] > 0).any()):
            raise AssertionError(f"{r.name}: the fake is greedy only")
        ids = ins["ids"][:n].tolist()
        rows, sl, ps = self._rows(r, n)
        H = self.model.dims.hidden
        logits = torch.zeros(n, self.vocab_rows)
        hidden = torch.zeros(n, H)
        for s, a, b in rows:
            if r.graph == "text":
                for c in range(a, b + 1):
                    self.hist[s][ps[c]] = ids[c]
                got = self._target(s, ps[b])
                if got is None:
                    continue
                lg, hd = got
                for c in range(a, b + 1):
                    logits[c], hidden[c] = lg[ps[c]], hd[ps[c]]
                    self.thid[s][ps[c]] = hd[ps[c]].to(torch.bfloat16)
            else:
                if r.phase == "decode":
                    self._check_mtp_history(s, ps[a])
                for c in range(a, b + 1):
                    self.mhist[s][ps[c]] = (ids[c], ins["hidden"][c].clone(), r.phase)
                got = self._mtp(s, ps[b])
                if got is None:
                    continue
                lg, hd = got
                for c in range(a, b + 1):
                    logits[c], hidden[c] = lg[ps[c]], hd[ps[c]]
        greedy = logits.argmax(-1).to(torch.int32)
        if r.phase == "prefill":
            row = int(ins["logit_rows"][0])
            outs["logits"][0].copy_(logits[row])
            outs["ids"][0] = greedy[row]
        elif r.phase == "verify" and r.graph == "text":
            W = self.draft_tokens + 1
            C = r.concurrency
            nd = ins["n_drafts"].tolist()
            tokens = torch.full((r.t,), GARBAGE, dtype=torch.int32)
            acc = []
            for row in range(C):
                a = 0
                while a < nd[row] and ids[row * W + a + 1] == int(greedy[row * W + a]):
                    a += 1
                acc.append(a)
                tokens[row * W:row * W + a] = torch.tensor(ids[row * W + 1:row * W + a + 1], dtype=torch.int32)
                tokens[row * W + a] = greedy[row * W + a]
                if nd[row] or row * W < n:
                    self.drafts_seen.append((sl[row * W], ps[row * W], ids[row * W + 1:row * W + 1 + nd[row]]))
            outs["logits"].copy_(logits)
            outs["tokens"].copy_(tokens)
            outs["accepted"].copy_(torch.tensor(acc, dtype=torch.int32))
        else:
            outs["logits"][:n].copy_(logits)
            outs["ids"][:n].copy_(greedy)
        if "hidden" in outs:
            outs["hidden"][:n].copy_(hidden)
        for t in ins.values():  # the rounds must re-upload every input before each run
            if t.dtype in (torch.int32,):
                t.fill_(GARBAGE)
            else:
                t.fill_(float("nan"))

    def _check_mtp_history(self, slot, P):
        mh, th, tg = self.mhist[slot], self.thid[slot], self.hist[slot]
        if P < 1 or mh.get(P - 1, (0, 0, "decode"))[2] == "decode":
            return  # a later chain step: rows P-1.. are the chain's own
        for q in range(P - 1):
            tok, hid, _ = mh.get(q, (None, None, None))
            if tok != tg.get(q + 1):
                self.violations.append(f"mtp slot {slot}: row {q} holds token {tok}, the target's at {q + 1} is "
                                       f"{tg.get(q + 1)} (chain at {P})")
                return
            if hid is None or q not in th or not torch.equal(hid, th[q]):
                self.violations.append(f"mtp slot {slot}: row {q} does not hold the target's hidden at {q} (chain at {P})")
                return
