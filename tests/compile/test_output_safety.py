"""Issue 10 §1: `-o` / `--dump-ir` replace only what ninfer-compile wrote; refusals come before any
work and touch nothing; the plan swap is crash-safe and its leftovers are cleaned; `pack -o` never
clobbers a directory or a file that is not an artifact."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ninfer_compile.compile_cli as compile_cli
from ninfer_compile.cli import main
from ninfer_compile.errors import CompileError
from ninfer_compile.plan import output
from ninfer_compile.plan.output import DUMP_MARKER, plan_problem, recover_leftovers, swap_into_place
from ninfer_compile.plan.writer import write_plan


OWNER = {"format": "ninfer-plan-v1", "compiler": {"name": "ninfer-compile"}}


def _args(art, table, *extra):
    return [str(art), "--sm", "90", "--routes", str(table), "--max-context", "64", "--prefill-chunk", "16",
            "--quiet", *extra]


def _snapshot(root: Path) -> dict[str, str]:
    """Every path under root (links and dirs included) with a digest of its content."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir"
    return out


@pytest.fixture
def no_work(monkeypatch):
    """A refusal must come before any work: compiling at all fails the test."""
    def boom(*a, **k):
        raise AssertionError("compile_artifact ran before the output path was refused")

    monkeypatch.setattr(compile_cli, "compile_artifact", boom)


def _refused(capsys, argv, needle, root: Path):
    before = _snapshot(root)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and needle in err, err
    assert _snapshot(root) == before  # nothing touched


def _fake_plan(d: Path, body: dict | None = None) -> Path:
    (d / "kernels").mkdir(parents=True)
    (d / "plan.json").write_text(json.dumps({**OWNER, **(body or {})}))
    (d / "memory.txt").write_text("mem\n")
    return d


def test_existing_file_and_foreign_directories_refused(art, table, tmp_path, capsys, no_work):
    f = tmp_path / "notes.txt"
    f.write_text("precious")
    _refused(capsys, _args(art, table, "-o", str(f)), "-o", tmp_path)
    _refused(capsys, _args(art, table, "-o", str(f)), "exists and is not a directory", tmp_path)
    d = tmp_path / "mine"
    d.mkdir()
    (d / "data.bin").write_bytes(b"\1\2\3")
    _refused(capsys, _args(art, table, "-o", str(d)), "is not a plan written by ninfer-compile (has no plan.json)",
             tmp_path)
    (tmp_path / "empty").mkdir()
    _refused(capsys, _args(art, table, "-o", str(tmp_path / "empty")), "has no plan.json", tmp_path)
    # a plan.json that is not ours, and a plan someone put a file into
    other = tmp_path / "other"
    other.mkdir()
    (other / "plan.json").write_text('{"format": "something-else"}')
    _refused(capsys, _args(art, table, "-o", str(other)), "not a ninfer-compile manifest", tmp_path)
    plan = _fake_plan(tmp_path / "p.plan")
    (plan / "my-notes.md").write_text("keep me")
    _refused(capsys, _args(art, table, "-o", str(plan)), "holds 'my-notes.md'", tmp_path)
    link = tmp_path / "link.plan"
    os.symlink(_fake_plan(tmp_path / "real.plan"), link)
    _refused(capsys, _args(art, table, "-o", str(link)), "is a symbolic link", tmp_path)


def test_inputs_cwd_and_root_refused(art, table, tmp_path, capsys, no_work, monkeypatch):
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(art, models / "tiny.ninfer")
    _refused(capsys, _args(models / "tiny.ninfer", table, "-o", str(models)), "holds the input", tmp_path)
    # even a real plan directory is not replaced when an input lives in it
    plan = _fake_plan(tmp_path / "q.plan")
    shutil.copy(table, plan / "kernels" / "t.yaml")
    _refused(capsys, _args(art, plan / "kernels" / "t.yaml", "-o", str(plan)), "holds the input", tmp_path)
    work = _fake_plan(tmp_path / "cwd.plan")
    monkeypatch.chdir(work)
    _refused(capsys, _args(art, table, "-o", "."), "is the current directory", tmp_path)
    _refused(capsys, _args(art, table, "-o", str(work)), "is the current directory", tmp_path)
    _refused(capsys, _args(art, table, "-o", ".."), "is the current directory or holds it", tmp_path)
    _refused(capsys, _args(art, table, "--dump-ir", str(tmp_path), "-o", str(tmp_path / "x.plan")),
             "--dump-ir", tmp_path)
    before = _snapshot(tmp_path)
    assert main(_args(art, table, "-o", "/")) == 2
    assert "is the root directory" in capsys.readouterr().err
    assert _snapshot(tmp_path) == before


def test_parent_missing_or_unwritable_refused_before_compiling(art, table, tmp_path, capsys, no_work, monkeypatch):
    _refused(capsys, _args(art, table, "-o", str(tmp_path / "missing" / "p.plan")),
             "parent directory", tmp_path)
    (tmp_path / "afile").write_text("x")
    _refused(capsys, _args(art, table, "-o", str(tmp_path / "afile" / "p.plan")), "not a directory", tmp_path)

    def no_space(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(output.tempfile, "mkdtemp", no_space)
    _refused(capsys, _args(art, table, "-o", str(tmp_path / "p.plan")), "cannot write in", tmp_path)
    _refused(capsys, _args(art, table, "-o", str(tmp_path / "p.plan"), "--dump-ir", str(tmp_path / "ir")),
             "cannot write in", tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_parent_refused(art, table, tmp_path, capsys, no_work):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        _refused(capsys, _args(art, table, "-o", str(ro / "p.plan")), "cannot write in", tmp_path)
    finally:
        ro.chmod(0o755)


def test_dump_dir_rules(art, table, tmp_path, capsys):
    out = tmp_path / "p.plan"
    ir = tmp_path / "ir"
    ir.mkdir()
    (ir / "keep.txt").write_text("mine")
    _refused(capsys, _args(art, table, "-o", str(out), "--dump-ir", str(ir)), f"has no {DUMP_MARKER} marker",
             tmp_path)
    _refused(capsys, _args(art, table, "-o", str(out), "--dump-ir", str(out / "ir")), "overlaps the plan",
             tmp_path)
    # a dump ninfer-compile wrote is replaced by the next one, marker and all
    fresh = tmp_path / "ir2"
    assert main(_args(art, table, "-o", str(out), "--dump-ir", str(fresh))) == 0
    assert (fresh / DUMP_MARKER).is_file() and (fresh / "decode_c1_k0" / "00-lower.txt").is_file()
    (fresh / "decode_c1_k0" / "stale.txt").write_text("from an older dump")
    assert main(_args(art, table, "-o", str(out), "--dump-ir", str(fresh))) == 0
    assert not (fresh / "decode_c1_k0" / "stale.txt").exists()
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith(".")) == []  # no temp dirs left


def test_plan_replaced_by_plan(art, table, tmp_path, capsys):
    out = tmp_path / "p.plan"
    assert main(_args(art, table, "-o", str(out))) == 0
    first = (out / "plan.json").read_bytes()
    (out / "memory.txt").write_text("edited")
    assert main(_args(art, table, "-o", str(out))) == 0
    assert (out / "plan.json").read_bytes() == first and (out / "memory.txt").read_text() != "edited"
    assert sorted(os.listdir(tmp_path)) == ["p.plan", "routes"]


# ----------------------------------------------------------------------------- the swap


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=60)
    return p.pid


def test_leftovers_of_dead_processes_cleaned_and_old_plan_restored(tmp_path):
    dead = _dead_pid()
    old = _fake_plan(tmp_path / f".x.plan.old-{dead}-abc", {"which": "old"})
    half = tmp_path / f".x.plan.tmp-{dead}-def"
    half.mkdir()
    (half / "plan.json").write_text("{")  # half-written
    live = tmp_path / f".x.plan.tmp-{os.getppid()}-ghi"  # a compile running now: left alone
    live.mkdir()
    other = tmp_path / f".y.plan.tmp-{dead}-jkl"  # another destination's: not ours to judge
    other.mkdir()
    done = recover_leftovers(tmp_path / "x.plan", plan_problem)
    assert json.loads((tmp_path / "x.plan" / "plan.json").read_text())["which"] == "old"
    assert not old.exists() and not half.exists() and live.exists() and other.exists()
    assert any("restored" in d for d in done)
    # with the plan present, a stale .old- is just removed (the plan at the path wins)
    stale = _fake_plan(tmp_path / f".x.plan.old-{dead}-mno", {"which": "stale"})
    recover_leftovers(tmp_path / "x.plan", plan_problem)
    assert not stale.exists() and json.loads((tmp_path / "x.plan" / "plan.json").read_text())["which"] == "old"


def test_compile_cleans_leftovers_of_an_interrupted_swap(art, table, tmp_path, capsys):
    dead = _dead_pid()
    _fake_plan(tmp_path / f".p.plan.old-{dead}-abc")
    (tmp_path / f".p.plan.tmp-{dead}-def").mkdir()
    assert main(_args(art, table, "-o", str(tmp_path / "p.plan"))) == 0
    assert f"note: restored {tmp_path / 'p.plan'} from .p.plan.old-{dead}-abc" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["p.plan", "routes"]
    assert json.loads((tmp_path / "p.plan" / "plan.json").read_text())["model_id"] == "tiny-qwen3.5-mtp"


def test_a_refusal_leaves_even_stale_leftovers_alone(art, table, tmp_path, capsys, no_work):
    stale = tmp_path / f".p.plan.tmp-{_dead_pid()}-abc"
    stale.mkdir()
    (tmp_path / "ir").mkdir()
    _refused(capsys, _args(art, table, "-o", str(tmp_path / "p.plan"), "--dump-ir", str(tmp_path / "ir")),
             "--dump-ir", tmp_path)
    assert stale.is_dir()


@pytest.mark.parametrize("exchange", [True, False], ids=["rename-exchange", "two-renames"])
def test_a_complete_plan_is_at_the_path_at_every_instant(tmp_path, monkeypatch, exchange):
    dest = tmp_path / "x.plan"
    write_plan(dest, {**OWNER, "gen": 1}, "one\n")
    monkeypatch.setattr(output, "USE_EXCHANGE", exchange)
    checks = []
    real_rename = os.rename

    def complete_somewhere() -> bool:
        cands = [dest] + [tmp_path / n for n in os.listdir(tmp_path) if ".old-" in n]
        return any(c.is_dir() and plan_problem(c) is None for c in cands)

    def watched(a, b):
        checks.append(complete_somewhere())
        real_rename(a, b)
        checks.append(complete_somewhere())

    monkeypatch.setattr(output.os, "rename", watched)
    write_plan(dest, {**OWNER, "gen": 2}, "two\n")
    assert json.loads((dest / "plan.json").read_text())["gen"] == 2
    assert all(checks) and (len(checks) == 4 or exchange)
    assert sorted(os.listdir(tmp_path)) == ["x.plan"]


def test_kill_between_the_two_renames_keeps_a_restorable_plan(tmp_path, monkeypatch):
    """The second rename never happens (the process dies there): the old plan waits under .old-
    and the next compile to the path puts it back before anything else."""
    dest = tmp_path / "x.plan"
    write_plan(dest, {**OWNER, "gen": 1}, "one\n")
    monkeypatch.setattr(output, "USE_EXCHANGE", False)
    real_rename = os.rename
    calls = []

    def dies_on_second(a, b):
        calls.append((a, b))
        if len(calls) == 2:
            raise SystemExit("killed")  # stands for SIGKILL: no cleanup of ours runs after it
        real_rename(a, b)

    monkeypatch.setattr(output.os, "rename", dies_on_second)
    monkeypatch.setattr(output.shutil, "rmtree", lambda *a, **k: None)
    import ninfer_compile.plan.writer as writer

    monkeypatch.setattr(writer.shutil, "rmtree", lambda *a, **k: None)
    with pytest.raises(SystemExit):
        write_plan(dest, {**OWNER, "gen": 2}, "two\n")
    monkeypatch.undo()
    assert not dest.exists() or json.loads((dest / "plan.json").read_text())["gen"] == 1
    # pretend the leftovers belong to a dead process, as they would after a real kill
    dead = _dead_pid()
    for n in os.listdir(tmp_path):
        if n.startswith(".x.plan."):
            kind = n.split(".")[3].split("-")[0]
            os.rename(tmp_path / n, tmp_path / f".x.plan.{kind}-{dead}-{n.rsplit('-', 1)[1]}")
    recover_leftovers(dest, plan_problem)
    assert json.loads((dest / "plan.json").read_text())["gen"] == 1
    assert sorted(os.listdir(tmp_path)) == ["x.plan"]


def test_interrupt_while_writing_leaves_the_old_plan_and_no_temp_dir(tmp_path, monkeypatch):
    dest = tmp_path / "x.plan"
    write_plan(dest, {**OWNER, "gen": 1}, "one\n")
    import ninfer_compile.plan.writer as writer

    real = writer.write_plan_files

    def interrupted(directory, files):
        real(directory, dict(list(files.items())[:1]))
        raise KeyboardInterrupt

    monkeypatch.setattr(writer, "write_plan_files", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_plan(dest, {**OWNER, "gen": 2}, "two\n")
    assert json.loads((dest / "plan.json").read_text())["gen"] == 1
    assert sorted(os.listdir(tmp_path)) == ["x.plan"]


def test_write_plan_refuses_a_foreign_directory(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "a.txt").write_text("x")
    with pytest.raises(CompileError, match="not a plan written by ninfer-compile"):
        write_plan(d, OWNER, "")
    assert (d / "a.txt").read_text() == "x"


def test_swap_into_empty_destination(tmp_path):
    tmp = tmp_path / ".n.tmp-1-a"
    tmp.mkdir()
    (tmp / "f").write_text("x")
    swap_into_place(tmp, tmp_path / "n")
    assert (tmp_path / "n" / "f").read_text() == "x" and not tmp.exists()


# ----------------------------------------------------------------------------- pack -o


def test_pack_output_rules(tmp_path, capsys):
    d = tmp_path / "out"
    d.mkdir()
    (d / "x").write_text("x")
    _refused(capsys, ["pack", "--synthetic", "tiny-qwen3.5", "-o", str(d), "--quiet"], "is a directory", tmp_path)
    txt = tmp_path / "README.md"
    txt.write_text("not an artifact")
    _refused(capsys, ["pack", "--synthetic", "tiny-qwen3.5", "-o", str(txt), "--quiet"],
             "is not a .ninfer artifact", tmp_path)
    _refused(capsys, ["pack", "--synthetic", "tiny-qwen3.5", "-o", str(tmp_path / "no" / "a.ninfer"), "--quiet"],
             "parent directory", tmp_path)
    out = tmp_path / "a.ninfer"
    assert main(["pack", "--synthetic", "tiny-qwen3.5", "-o", str(out), "--quiet"]) == 0
    first = out.read_bytes()
    # an existing artifact is overwritten as before (old flag name still accepted)
    assert main(["pack", "--synthetic", "tiny-qwen3.5", "-o", str(out), "--seed", "1", "--no-progress"]) == 0
    assert out.read_bytes() != first and out.read_bytes()[:8] == first[:8]


def test_pack_interrupted_leaves_no_temp_file(tmp_path, capsys, monkeypatch):
    from ninfer_compile.artifact import writer

    real = writer.ArtifactWriter._emit
    n = [0]

    def emit(self, obj, where, views):  # every object's payload goes through here
        n[0] += 1
        if n[0] == 3:
            raise KeyboardInterrupt
        return real(self, obj, where, views)

    monkeypatch.setattr(writer.ArtifactWriter, "_emit", emit)
    out = tmp_path / "a.ninfer"
    assert main(["pack", "--synthetic", "tiny-qwen3.5", "-o", str(out), "--quiet"]) == 130
    assert capsys.readouterr().err.strip() == "error: interrupted (SIGINT)"
    assert n[0] == 3 and os.listdir(tmp_path) == []


def test_a_signal_during_the_swap_waits_for_both_renames(tmp_path, monkeypatch):
    """SIGTERM between the two renames (filesystems without RENAME_EXCHANGE): it is raised only
    once the new plan is in place, and the previous plan is still removed."""
    import signal

    from ninfer_compile import cli, interrupts

    dest = tmp_path / "x.plan"
    write_plan(dest, {**OWNER, "gen": 1}, "one\n")
    monkeypatch.setattr(output, "USE_EXCHANGE", False)
    real_rename = os.rename
    calls = []

    def rename_then_signal(a, b):
        real_rename(a, b)
        calls.append(b)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # lands between the two renames

    monkeypatch.setattr(output.os, "rename", rename_then_signal)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    previous = cli._install_signal_handlers()
    try:
        with pytest.raises(interrupts.Interrupted) as exc:
            write_plan(dest, {**OWNER, "gen": 2}, "two\n")
    finally:
        cli._restore_signal_handlers(previous)
    assert exc.value.signum == signal.SIGTERM and len(calls) == 2
    assert json.loads((dest / "plan.json").read_text())["gen"] == 2
    assert sorted(os.listdir(tmp_path)) == ["x.plan"]
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask  # not left blocked


def test_a_handler_run_while_the_swap_section_ends_leaves_the_mask_as_it_was(monkeypatch):
    """Python runs a handler at any bytecode, and a signal another thread took runs it wherever the
    main thread is: here inside the section's own exit (where it takes blocked signals). It must only
    be recorded there and raised after the mask is restored; raised there, it skipped the restore
    and left SIGINT/SIGTERM blocked for the thread and every process it started afterwards."""
    import signal

    from ninfer_compile import interrupts

    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    real_take = interrupts._take_blocked

    def take_then_handler():  # the handler, run by Python at a bytecode of the section's exit
        real_take()
        interrupts.handler(signal.SIGTERM, None)

    monkeypatch.setattr(interrupts, "_take_blocked", take_then_handler)
    interrupts.reset()
    try:
        with pytest.raises(interrupts.Interrupted) as exc:
            with interrupts.deferred():
                pass
    finally:
        leaked = signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        interrupts.reset()
    assert exc.value.signum == signal.SIGTERM
    assert leaked == mask, f"left blocked: {sorted(leaked - mask)}"
