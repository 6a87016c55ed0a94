"""ninfer-run as a user meets it (issue 10 §5, runtime side): --version, help on every option,
one-line errors naming the flag, --concurrency in compile's list form, the stop reason, invalid
UTF-8, SIGINT / SIGTERM (real subprocesses, bounded waits)."""

from __future__ import annotations

import argparse
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from ninfer_runtime import cli

from . import support as S

ENV = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(S.RUNTIME)}


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "ninfer_runtime.cli", *args], capture_output=True, env=ENV,
                          timeout=timeout)


def _one_line_error(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.strip() and "upload weights" not in x]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_version_and_help_on_every_option(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"ninfer-run {__import__('ninfer_runtime').__version__}"
    parser = cli._parser()
    missing = [a.option_strings or a.dest for a in parser._actions
               if not isinstance(a, argparse._HelpAction) and not a.help]
    assert not missing, f"options without help text: {missing}"
    text = parser.format_help()
    for flag in ("--max-new-tokens", "--temperature", "--top-p", "--top-k", "--seed", "--concurrency",
                 "--verify-weights", "--quiet"):
        assert flag in text


@pytest.mark.parametrize("argv, expect", [
    (["--tokens", "1", "--top-p", "0.9"], "error: --top-p 0.9 needs --temperature > 0"),
    (["--tokens", "1", "--top-k", "5"], "error: --top-k 5 needs --temperature > 0"),
    (["--tokens", "1", "--temperature", "0.7", "--top-p", "1.5"], "error: --top-p must be in (0, 1], got 1.5"),
    (["--tokens", "1", "--temperature", "0.7", "--top-k", "-1"], "error: --top-k must be >= 0, got -1"),
    (["--tokens", "1", "--temperature", "nan"], "error: --temperature must be a finite number >= 0"),
    (["--tokens", "1", "--temperature", "-1"], "error: --temperature must be a finite number >= 0"),
    (["--tokens", "1", "--max-new-tokens", "0"], "error: --max-new-tokens must be >= 1, got 0"),
    (["--tokens", "1", "--seed", str(2**70)], "error: argument --seed: must be an integer in [0, 2^63-1]"),
    (["--tokens", "1", "--seed", "-1"], "error: argument --seed: must be an integer in [0, 2^63-1]"),
    (["--tokens", "1", "--concurrency", "1,x"], "error: --concurrency must be an integer or a comma-separated"),
    (["--tokens", "1", "--concurrency", "0"], "error: --concurrency values must be in [1, 4096], got 0"),
    (["--tokens", "1", "--greedy", "--temperature", "1"], "error: --greedy and --temperature > 0 are exclusive"),
    (["--tokens", "1", "--bogus"], "error: unrecognized arguments: --bogus"),
    (["--tokens", "1,a"], "error: --tokens must be comma-separated integers"),
    (["--prompt", "ab\udcff"], "error: --prompt is not valid UTF-8 (byte 0xff at character 2)"),
])
def test_flag_errors_are_one_line_naming_the_flag(tmp_path, capsys, argv, expect):
    # flag checks run before the plan is opened: a missing plan would be the next error
    rc = cli.main([str(tmp_path / "no.plan"), "--artifact", str(tmp_path / "no.ninfer"), *argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith(expect), err
    assert "top_p" not in err and "top_k" not in err and "max_new_tokens" not in err


def test_concurrency_list_semantics():
    assert cli.concurrency_list("4") == [4]
    assert cli.concurrency_list("1,2,4") == [1, 2, 4]
    assert cli.concurrency_list("2, 2,1") == [2, 1]


def test_run_prints_stop_reason_and_takes_list_concurrency(tiny_plan):
    art, plan = tiny_plan
    p = _cli(str(plan), "--artifact", str(art), "--tokens", "5,77", "--max-new-tokens", "2", "--ignore-eos",
             "--concurrency", "1,1")
    assert p.returncode == 0, p.stderr.decode()
    err = p.stderr.decode()
    assert "stopped: max tokens after 2 tokens" in err
    assert p.stdout.decode().strip().splitlines()[-1].startswith("tokens: ")
    # a C the plan has no decode extent for: one line naming the flag
    p = _cli(str(plan), "--artifact", str(art), "--tokens", "5,77", "--concurrency", "1,2")
    assert p.returncode == 2
    assert _one_line_error(p.stderr.decode()).startswith("error: --concurrency 2 exceeds the plan's largest")


def test_prompt_ids_checked_against_the_plan(tiny_plan):
    art, plan = tiny_plan
    p = _cli(str(plan), "--artifact", str(art), "--tokens", "5,999999", "--quiet")
    assert p.returncode == 2
    assert _one_line_error(p.stderr.decode()).startswith("error: --tokens: id 999999 is outside the plan's vocabulary")
    p = _cli(str(plan), "--artifact", str(art), "--tokens", ",".join(["5"] * 65), "--quiet")
    assert p.returncode == 2
    assert _one_line_error(p.stderr.decode()) == "error: --tokens: 65 ids exceed the plan's max context 64"


def test_unexpected_errors_are_one_line(monkeypatch, capsys, tmp_path):
    def boom(args):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(cli, "_run", boom)
    monkeypatch.delenv("NINFER_TRACEBACK", raising=False)
    assert cli.main([str(tmp_path), "--artifact", "x", "--tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert err == "error: internal error (ZeroDivisionError: boom); NINFER_TRACEBACK=1 shows where\n"


def test_stop_line_words():
    from ninfer_runtime.generate import GenerationResult

    a = GenerationResult(0, [1], tokens=[5], finish_reason="stop")
    b = GenerationResult(1, [1], tokens=[5, 6], finish_reason="length")  # short of max tokens: the context
    assert cli._stop_line([a], 4) == "stopped: eos after 1 token"
    assert cli._stop_line([a, b], 4) == "stopped: seq 0 eos, seq 1 context full"
    assert cli._stop_line([b, b], 2) == "stopped: max tokens after 2 tokens (all 2 sequences)"


def test_invalid_utf8_prompt_from_argv_bytes(tiny_plan):
    art, plan = tiny_plan
    p = subprocess.run([sys.executable, "-m", "ninfer_runtime.cli", str(plan), "--artifact", str(art),
                        b"--prompt", b"caf\xe9 \xff"], capture_output=True, env=ENV, timeout=300)
    assert p.returncode == 2
    assert _one_line_error(p.stderr.decode()).startswith("error: --prompt is not valid UTF-8 (byte 0xe9")


def _reader(stream, q):
    for line in iter(stream.readline, b""):
        q.put(line.decode(errors="replace"))
    q.put(None)


def _block_signals() -> None:  # preexec_fn: started the way a harness that blocks them would
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


@pytest.mark.parametrize("sig, code, word, blocked", [(signal.SIGINT, 130, "interrupted (SIGINT)", False),
                                                      (signal.SIGTERM, 143, "terminated (SIGTERM)", True)],
                         ids=["sigint", "sigterm-inherited-mask"])
def test_signals_end_the_run_with_one_line(tiny_plan, sig, code, word, blocked):
    art, plan = tiny_plan
    proc = subprocess.Popen([sys.executable, "-m", "ninfer_runtime.cli", str(plan), "--artifact", str(art),
                             "--tokens", "5,77", "--max-new-tokens", "60", "--ignore-eos"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV,
                            preexec_fn=_block_signals if blocked else None)
    q: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stderr, q), daemon=True).start()
    lines = []
    try:
        deadline = time.monotonic() + 240  # bounded: the load of a tiny plan takes seconds
        while time.monotonic() < deadline:  # wait until generation has started ("loaded ..." line)
            try:
                line = q.get(timeout=5)
            except queue.Empty:
                continue
            if line is None:
                break
            lines.append(line)
            if line.startswith("load phases:"):  # the load's last line: generation starts
                break
        assert any("loaded " in x for x in lines), "".join(lines)
        proc.send_signal(sig)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    rest = []
    while True:
        try:
            line = q.get(timeout=10)
        except queue.Empty:
            break
        if line is None:
            break
        rest.append(line)
    assert rc == code, "".join(lines + rest)
    tail = [x for x in rest if x.strip()]
    assert tail == [f"error: {word}\n"], tail


def _edited_plan(tiny_plan, tmp_path, edit):
    import json
    import shutil

    art, plan = tiny_plan
    p = tmp_path / "edited.plan"
    shutil.copytree(plan, p)
    pj = json.loads((p / "plan.json").read_text())
    edit(pj)
    (p / "plan.json").write_text(json.dumps(pj))  # integrity record left as it was
    return art, p, pj


def _first(pj, extent, route):
    return next(L for L in pj["extents"][extent]["launches"] if L.get("route") == route)


@pytest.mark.parametrize("what", ["param", "swapped_route", "launch_t"])
def test_edited_launch_is_one_line_naming_extent_launch_route(tiny_plan, tmp_path, what):
    def edit(pj):
        prefill = next(n for n, x in pj["extents"].items() if x["phase"] == "prefill")
        if what == "param":
            _first(pj, prefill, "bf16_tiled")["params"]["BLOCK_N"] = 7
        elif what == "swapped_route":
            _first(pj, prefill, "conv1d_prefill")["route"] = "conv1d_decode"
        else:
            _first(pj, prefill, "bf16_tiled")["t"] = 10**6

    art, plan, pj = _edited_plan(tiny_plan, tmp_path, edit)
    # as edited: the integrity record refuses it (in-process: the CLI prints such errors as in the
    # re-hashed case below)
    import ninfer_runtime as nr

    with pytest.raises(nr.PlanMismatch, match="plan.json: body sha256"):
        nr.load(plan, art, progress=False)
    # the hash fixed too: the loader's own checks name the extent, the launch and the route
    S.seal_plan_dir(plan, pj)
    p = _cli(str(plan), "--artifact", str(art), "--tokens", "5", "--max-new-tokens", "1")
    assert p.returncode == 2
    line = _one_line_error(p.stderr.decode())
    if what == "launch_t":
        assert "extents.prefill_t8.launches[" in line and ".t: must be an integer in [1, 8]" in line, line
    else:
        assert "extent prefill_t8: launch " in line and "(route " in line, line
        assert ("BLOCK_N" in line) if what == "param" else ("serves decode extents" in line), line
