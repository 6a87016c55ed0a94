"""bench/bench_peers.py (the parent and report; the peers in bench/peer_hf.py, bench/peer_reference.py)
on CPU: both peers end to end on the tiny contract (their own processes, the JSON/MD report), the
two peers computing the same model (greedy tokens of HF and of the reference equal on a tiny
bf16-exact model), the device-side payload decode equal to the
artifact codecs, the HF config matching a contract's shapes, and a failing peer not losing the
other. torch.compile runs with the `eager` backend here (Dynamo capture and guards, no codegen).
"""

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import bench_peers as bp  # noqa: E402
import peer_common  # noqa: E402
import peer_hf  # noqa: E402
import peer_reference  # noqa: E402

from ninfer_compile.contracts.dims import HybridDims  # noqa: E402
from ninfer_compile.reference import ArtifactWeights, DictWeights, ReferenceModel  # noqa: E402
from tests.reference.hf_tiny import PROMPT, make_hf_model, ninfer_dict, spec_for  # noqa: E402

CPU = torch.device("cpu")


def test_peers_cli_end_to_end(tmp_path):
    rc = bp.main(["--contract", "tiny-qwen3.5", "--device", "cpu", "--compile", "eager", "--context", "40",
                  "--decode-tokens", "4", "--concurrency", "1,2", "--out", str(tmp_path), "--label", "tiny",
                  "--timeout-hf", "120", "--timeout-reference", "120"])
    assert rc == 0
    res = json.loads((tmp_path / "peers_tiny.json").read_text())
    md = (tmp_path / "peers_tiny.md").read_text()
    assert res["label"] == "tiny" and res["provenance"]["torch"] == torch.__version__
    assert set(res["peers"]) == {"hf", "reference"}
    hf, ref = res["peers"]["hf"], res["peers"]["reference"]
    assert "error" not in hf and "error" not in ref, (hf.get("error"), ref.get("error"))
    assert set(hf["decode"]) == {"1", "2"} and set(ref["decode"]) == {"1"}
    for peer in (hf, ref):
        assert peer["provenance"]["device"] == "cpu" and peer["read_bandwidth_gbs"] is None
        for c, d in peer["decode"].items():
            assert d["tok_s"] > 0 and d["step_ms"] > 0 and d["steps"] == 4
            assert d["roofline_step_ms"] is None  # no bandwidth measured on a CPU
            pf = peer["prefill"][c]
            assert pf["tok_s"] > 0 and pf["tokens"] == int(c) * 40
    assert len(hf["greedy_tokens_c1"]) == 1 + 4 and len(ref["greedy_tokens_c1"]) == 1 + 2 + 4  # + 2 warm steps
    # weights read per step: every text weight but the embedding, bf16 (HF) vs fp32 (reference)
    spec = peer_common.load_spec("tiny-qwen3.5")
    numel = sum(_numel(o.shape) for o in spec.objects.values() if o.part == "text" and o.kind == "tensor"
                and o.name != "text/token_embedding")
    assert hf["weights_bytes_per_step"] == 2 * numel and ref["weights_bytes_per_step"] == 4 * numel
    assert hf["dtype"] == "bfloat16" and hf["attention"] == "eager" and hf["fla"]["importable"] in (True, False)
    assert hf["gdn_path"]  # the resolved GDN / conv implementations are recorded
    c = ref["compile"]
    assert c["compiled"] and c["compile_backend"] == "eager" and c["compile_error"] is None
    assert c["dynamo"]["unique_graphs"] == 2  # one attention graph (KV length dynamic), one GDN graph
    assert ref["decode"]["1"]["mode"] == "torch.compile"
    assert "| hf |" in md and "| reference |" in md


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


@pytest.fixture(scope="module")
def tiny_bf16_exact():
    model = make_hf_model(seed=0)
    return model, spec_for(model.config)


def test_reference_greedy_equals_hf(tiny_bf16_exact):
    """The two peers' decode loops compute the same model: on a tiny bf16-exact model (HF in fp32,
    the reference over the converted weights), greedy tokens after prefill are identical; the
    reference's compiled (Dynamo) decode gives the same tokens as its eager decode."""
    model, spec = tiny_bf16_exact
    n = 10
    hf = peer_hf.hf_generate(model, torch.tensor([PROMPT]), n, CPU)["tokens"][0].tolist()
    ref = ReferenceModel(spec, DictWeights(ninfer_dict(model)))
    eager = peer_reference.reference_generate(ref, PROMPT, n - 2, CPU, compile_backend="none", warm_steps=2)
    compiled = peer_reference.reference_generate(ref, PROMPT, n - 2, CPU, compile_backend="eager", warm_steps=2)
    assert len(hf) == 1 + n
    assert eager["tokens"] == hf
    assert compiled["compiled"] and compiled["compile_error"] is None
    assert compiled["tokens"] == hf


def test_reference_on_bf16_artifact_streams_to_device(tiny_bf16_exact, tmp_path):
    """The reference peer's loading path (DeviceArtifactWeights over a packed bf16 artifact)
    gives the same greedy tokens as HF."""
    from ninfer_compile.artifact.reader import Artifact
    from ninfer_compile.cli import main as cli
    from ninfer_compile.contracts import find_contract

    model, _ = tiny_bf16_exact
    model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    art_path = tmp_path / "tiny-bf16.ninfer"
    assert cli(["pack", str(tmp_path / "hf"), "-o", str(art_path), "--recipe", "bf16"]) == 0
    hf = peer_hf.hf_generate(model, torch.tensor([PROMPT]), 6, CPU)["tokens"][0].tolist()
    with Artifact.open(art_path) as art:
        spec = find_contract(art_path, art.model_id, None).resolve_for(art)
        w = peer_reference.DeviceArtifactWeights(art, CPU)
        ref = ReferenceModel(spec, w)
    assert ref.device == CPU and ref.new_state().kv[3].k.device == CPU
    assert peer_reference.reference_generate(ref, PROMPT, 4, CPU, compile_backend="none")["tokens"] == hf


@pytest.mark.parametrize("contract", ["tiny-qwen3.5", "tiny-qwen3.5-mtp"])
def test_device_decode_equals_codecs(contract, tmp_path):
    """decode_grouped_on (torch ops, blocks of rows) is bit-exact with artifact.codecs for every
    grouped object of a synthetic artifact (Q4/Q5/Q6 and, with MTP, W8)."""
    from ninfer_compile.artifact.formats import FORMATS
    from ninfer_compile.artifact.reader import Artifact

    path = tmp_path / f"{contract}.ninfer"
    peer_reference.pack_synthetic(contract, path)
    formats = set()
    with Artifact.open(path) as art:
        host = ArtifactWeights(art, cache=False)
        dev = peer_reference.DeviceArtifactWeights(art, CPU)
        for obj in art.tensors():
            if FORMATS[obj.format].kind != "grouped":
                continue
            formats.add(obj.format)
            want = host.get(obj.name)
            assert torch.equal(dev.get(obj.name), want), obj.name
            raw = torch.frombuffer(bytearray(art.span(obj.name)), dtype=torch.uint8)
            assert torch.equal(peer_reference.decode_grouped_on(CPU, obj.format, obj.shape, raw, max_elems=3000), want)
    assert {"Q4G64_F16S", "Q5G64_F16S", "Q6G64_F16S"} <= formats
    if contract.endswith("mtp"):
        assert "W8G32_F16S" in formats


@pytest.mark.parametrize("contract", ["tiny-qwen3.5", "qwen3.6-27b"])
def test_hf_config_has_the_contract_shapes(contract):
    """The HF peer's config maps back onto the contract's dims/layer kinds, and its parameters
    (built on the meta device: no memory) number exactly the contract's text objects."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    spec = peer_common.load_spec(contract)
    dims = HybridDims.from_spec(spec)
    cfg = peer_hf.hf_config(dims, spec.params)
    back = spec_for(cfg)
    for k, v in back.dims.items():
        assert v == spec.dims[k], k
    assert back.layer_kinds == list(dims.layer_kinds)
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM(cfg)
    text = sum(_numel(o.shape) for o in spec.objects.values() if o.part == "text" and o.kind == "tensor")
    assert sum(p.numel() for p in model.parameters()) == text


def test_build_hf_model_on_device():
    """Random weights are made in place (finite, the requested dtype), rotary buffers rebuilt."""
    spec = peer_common.load_spec("tiny-qwen3.5")
    dims = HybridDims.from_spec(spec)
    model = peer_hf.build_hf_model(peer_hf.hf_config(dims, spec.params, dtype=torch.bfloat16), CPU, torch.bfloat16)
    ps = dict(model.named_parameters())
    assert all(p.dtype == torch.bfloat16 and p.device == CPU and torch.isfinite(p).all() for p in ps.values())
    inv = model.model.rotary_emb.inv_freq
    assert inv.dtype == torch.float32 and torch.isfinite(inv).all() and inv[0] == 1.0
    out = peer_hf.hf_generate(model, torch.tensor([[t % dims.vocab_rows for t in PROMPT]]), 2, CPU)
    assert out["tokens"].shape == (1, 3)


def test_failing_peer_does_not_lose_the_other(tmp_path, monkeypatch):
    """Each peer runs in its own process: one that crashes (or times out) is recorded as an error
    and the other still reports; the parent exits 1."""
    def fake_argv(args, peer, result):
        if peer == "hf":
            return [sys.executable, "-c", "import sys; sys.stderr.write('boom\\n'); sys.exit(3)"]
        if peer == "reference":
            body = {"peer": "reference", "provenance": {"date": "d", "device": "cpu", "torch": "t"},
                    "weights_bytes_per_step": 8, "read_bandwidth_gbs": None, "dtype": "float32",
                    "load_s": 0.1, "prefill": {"1": {"tok_s": 10.0}},
                    "decode": {"1": {"tok_s": 2.0, "step_ms": 500.0, "steps": 1, "roofline_step_ms": None,
                                     "fraction_of_roofline": None}},
                    "compile": {"compiled": False, "compile_backend": "none", "compile_error": None,
                                "compile_s": None}}
            code = f"import json, pathlib; pathlib.Path({str(result)!r}).write_text(json.dumps({body!r}))"
            return [sys.executable, "-c", code]
    monkeypatch.setattr(bp, "child_argv", fake_argv)
    rc = bp.main(["--out", str(tmp_path), "--label", "f", "--device", "cpu", "--contract", "tiny-qwen3.5"])
    assert rc == 1
    res = json.loads((tmp_path / "peers_f.json").read_text())
    assert "boom" in res["peers"]["hf"]["error"] and "exit 3" in res["peers"]["hf"]["error"]
    assert res["peers"]["reference"]["decode"]["1"]["tok_s"] == 2.0
    assert "| hf | failed |" in (tmp_path / "peers_f.md").read_text()

    # a peer killed on its timeout keeps what it had written so far (here: its C=1 row)
    partial = {"peer": "hf", "dtype": "bfloat16", "build_s": 1.0, "weights_bytes_per_step": 8,
               "read_bandwidth_gbs": None, "prefill": {"1": {"tok_s": 5.0}},
               "decode": {"1": {"tok_s": 3.0, "step_ms": 333.0, "steps": 1}}}

    def sleeper(args, peer, result):
        code = (f"import json, pathlib, time; pathlib.Path({str(result)!r}).write_text(json.dumps({partial!r})); "
                "time.sleep(30)")
        return [sys.executable, "-c", code]
    monkeypatch.setattr(bp, "child_argv", sleeper)
    rc = bp.main(["--out", str(tmp_path), "--label", "t", "--device", "cpu", "--peers", "hf",
                  "--timeout-hf", "2"])
    res = json.loads((tmp_path / "peers_t.json").read_text())
    hf = res["peers"]["hf"]
    assert rc == 1 and hf["error"].startswith("timed out after 2 s") and hf["decode"]["1"]["tok_s"] == 3.0
    md = (tmp_path / "peers_t.md").read_text()
    assert "| hf | HF eager bfloat16" in md and "hf failed: timed out" in md
