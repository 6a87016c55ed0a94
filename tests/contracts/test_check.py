"""check_artifact: every problem at once, first line self-contained; the `check` CLI."""

from __future__ import annotations

import argparse
import dataclasses
import sys

import pytest

from ninfer_compile import cli
from ninfer_compile.contracts import FORMAT_LAYOUTS, artifact_problems, check_artifact, load_contract
from ninfer_compile.contracts import cli as check_cli
from ninfer_compile.errors import ContractError, NinferError

from .conftest import FakeResource, FakeTensor, fake_artifact


@pytest.fixture(scope="module")
def tiny_spec():
    return load_contract("tiny-qwen3.5").resolve()


def test_matching_artifact_passes(tiny_spec):
    check_artifact(fake_artifact(tiny_spec), tiny_spec)
    assert artifact_problems(fake_artifact(tiny_spec), tiny_spec) == []


def test_every_problem_kind_at_once(tiny_spec):
    art = fake_artifact(tiny_spec, path="bad.ninfer", model_id="tiny-qwen3.5-other")
    objs = {o.name: o for o in art.objects}
    del objs["text/layers/0/mlp/down"]                                   # missing
    del objs["text/final_norm"]                                          # missing
    objs["text/layers/1/gdn/norm"] = dataclasses.replace(objs["text/layers/1/gdn/norm"], shape=(25,))
    objs["text/layers/3/attention/output"] = dataclasses.replace(
        objs["text/layers/3/attention/output"], format="Q4G64_F16S")     # misformatted
    objs["text/layers/2/gdn/a_log"] = dataclasses.replace(
        objs["text/layers/2/gdn/a_log"], layout="row-split-k128-v1")      # wrong layout
    objs["text/output_head"] = FakeResource("text/output_head")          # wrong kind
    objs["text/lm_head"] = FakeTensor("text/lm_head", (256, 96), "BF16", "contiguous-le-v1")  # extra
    objs["frontend/tokenizer.json"] = FakeResource("frontend/tokenizer.json")  # extra: frontend not resolved
    art.objects = list(objs.values())

    with pytest.raises(ContractError) as info:
        check_artifact(art, tiny_spec)
    lines = str(info.value).splitlines()
    summary, problems = lines[0], [l.strip() for l in lines[1:]]
    assert summary.startswith("artifact bad.ninfer (model_id 'tiny-qwen3.5-other') does not match")
    assert "9 problem(s)" in summary and "2 missing" in summary and "2 extra" in summary
    assert problems == [
        "model_id: artifact says 'tiny-qwen3.5-other', contract expects 'tiny-qwen3.5'",
        "missing tensor text/layers/0/mlp/down [96, 160] Q5G64_F16S (part text)",
        "misshapen text/layers/1/gdn/norm: expected [24], got [25]",
        "misformatted text/layers/2/gdn/a_log: expected layout contiguous-le-v1, got row-split-k128-v1",
        "misformatted text/layers/3/attention/output: expected Q5G64_F16S, got Q4G64_F16S",
        "missing tensor text/final_norm [96] BF16 (part text)",
        "wrong kind text/output_head: expected tensor, got resource",
        "extra tensor text/lm_head [256, 96] BF16 (not in the contract)",
        "extra resource frontend/tokenizer.json (not in the contract)",
    ]


def test_shape_and_format_both_wrong_are_two_lines(tiny_spec):
    art = fake_artifact(tiny_spec)
    art.objects[0] = dataclasses.replace(art.objects[0], shape=(1, 2), format="BF16", layout="contiguous-le-v1")
    problems = artifact_problems(art, tiny_spec)
    assert [p.split(" ", 1)[0] for p in problems] == ["misshapen", "misformatted"]


def test_order_is_checked_when_everything_else_matches(tiny_spec):
    art = fake_artifact(tiny_spec)
    art.objects[1], art.objects[2] = art.objects[2], art.objects[1]
    with pytest.raises(ContractError, match=r"1 problem\(s\): 1 order\n  order: object 1 is "):
        check_artifact(art, tiny_spec)


def test_resource_encoding(tiny_spec):
    contract = load_contract("tiny-qwen3.5")
    spec = contract.resolve(present=["frontend"])
    art = fake_artifact(spec)
    art.objects[2] = dataclasses.replace(art.objects[2], encoding="gzip-v1")
    assert artifact_problems(art, spec) == [
        "misformatted resource frontend/chat_template.jinja: expected encoding raw-bytes-v1, got gzip-v1"]


def test_resolve_for_detects_optional_parts():
    contract = load_contract("tiny-qwen3.5-mtp")
    full = contract.resolve(present=["frontend", "draft_head"])
    # artifact with the frontend but no draft head
    art = fake_artifact(full)
    art.objects = [o for o in art.objects if not o.name.startswith("text/draft_head")]
    spec = contract.resolve_for(art)
    assert spec.parts["frontend"] and not spec.parts["draft_head"]
    check_artifact(art, spec)
    # a half-present optional part is reported object by object
    art.objects = [o for o in art.objects if o.name != "frontend/chat_template.jinja"]
    spec = contract.resolve_for(art)
    assert artifact_problems(art, spec) == ["missing resource frontend/chat_template.jinja (part frontend)"]


def run_check(argv: list[str]) -> int:
    """`ninfer-compile check ...` as cli.main runs it (parser from configure, errors -> exit 2)."""
    parser = argparse.ArgumentParser(prog="ninfer-compile check")
    check_cli.configure(parser)
    try:
        return check_cli.run(parser.parse_args(argv))
    except NinferError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def test_cli_ok_and_error(tmp_path, monkeypatch, capsys):
    spec = load_contract("tiny-qwen3.5-mtp").resolve()
    art = fake_artifact(spec, path=str(tmp_path / "m.ninfer"))
    monkeypatch.setattr(check_cli, "open_artifact", lambda path: art)
    assert run_check([str(tmp_path / "m.ninfer")]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"ok: tiny-qwen3.5-mtp: {spec.tensor_count} tensors, 0 resources match ")
    assert out.endswith("graphs/tiny-qwen3.5-mtp.yaml")

    art.objects.pop()
    assert run_check([str(tmp_path / "m.ninfer")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"error: artifact {tmp_path / 'm.ninfer'} (model_id 'tiny-qwen3.5-mtp') does not match")
    assert err[1].strip() == "missing tensor mtp/final_norm [160] BF16 (part mtp)"

    # --contract wins over graphs/: the 27B contract does not fit this artifact
    assert run_check([str(tmp_path / "m.ninfer"), "--contract", "graphs/qwen3.6-27b.yaml"]) == 2
    assert "model_id: artifact says 'tiny-qwen3.5-mtp', contract expects 'qwen3.6-27b'" in capsys.readouterr().err


def test_cli_registered():
    assert cli.SUBCOMMANDS["check"][0] == "ninfer_compile.contracts.cli"


@pytest.mark.parametrize("model_id, present", [("qwen3.6-27b", []), ("tiny-qwen3.5", ["frontend"]),
                                               ("tiny-qwen3.6-full", [])])
def test_real_sparse_artifact(tmp_path, capsys, model_id, present):
    """A header-only artifact from the project writer, read back by the project reader."""
    writer = pytest.importorskip("ninfer_compile.artifact.writer")
    spec = load_contract(model_id).resolve(present=present)
    specs = [writer.ResourceSpec(o.name, 100) if o.kind == "resource" else writer.TensorSpec(o.name, o.shape, o.format)
             for o in spec.objects.values()]
    path = tmp_path / f"{model_id}.ninfer"
    writer.ArtifactWriter(path, model_id, specs).write_sparse()
    assert run_check([str(path)]) == 0
    assert f"ok: {model_id}: {spec.tensor_count} tensors, {spec.resource_count} resources match" in capsys.readouterr().out

    # a different model's inventory under this id: every object reported
    other = tmp_path / "wrong.ninfer"
    writer.ArtifactWriter(other, model_id, specs[:-1] + [writer.TensorSpec("text/extra", (4,), "BF16")]).write_sparse()
    assert run_check([str(other)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "2 problem(s): 1 missing, 1 extra" in err[0]


def test_format_table_agrees_with_the_artifact_registry():
    formats = pytest.importorskip("ninfer_compile.artifact.formats")
    from ninfer_compile.contracts.schema import RESOURCE_ENCODING

    assert FORMAT_LAYOUTS == {name: spec.layout for name, spec in formats.FORMATS.items()}
    assert formats.RESOURCE_ENCODINGS == {RESOURCE_ENCODING}
