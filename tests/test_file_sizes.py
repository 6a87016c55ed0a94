"""The size rule: a `.py` file under ninfer_compile/, runtime/ or bench/ stays at or under 500 lines.

A file over the limit fails with its path and line count. ALLOWED lists the exceptions, each with
the reason it may be longer (none today); an entry whose file is gone or back under the limit fails
too, so the list cannot go stale.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("ninfer_compile", "runtime", "bench")
LIMIT = 500
ALLOWED: dict[str, str] = {}  # "folder/file.py": why it may pass the limit (e.g. a generated table)


def line_count(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def python_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py")
                  if not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(ROOT).parts))


def test_the_rule_sees_files():
    """Guards the test itself: an empty walk (a moved folder) would pass vacuously."""
    files = python_files()
    for folder in FOLDERS:
        assert any(p.relative_to(ROOT).parts[0] == folder for p in files), f"no .py file found under {folder}/"


def test_python_files_stay_within_the_limit():
    over = []
    for path in python_files():
        rel = path.relative_to(ROOT).as_posix()
        n = line_count(path)
        if n > LIMIT and rel not in ALLOWED:
            over.append(f"{rel}: {n} lines (limit {LIMIT})")
    assert not over, "split these along their seams or add them to ALLOWED with a reason:\n" + "\n".join(over)


def test_allowed_entries_are_still_needed():
    stale = []
    for rel, why in sorted(ALLOWED.items()):
        path = ROOT / rel
        if not path.is_file():
            stale.append(f"{rel}: on ALLOWED but does not exist")
        elif line_count(path) <= LIMIT:
            stale.append(f"{rel}: on ALLOWED but has {line_count(path)} lines")
        elif not why.strip():
            stale.append(f"{rel}: on ALLOWED without a reason")
    assert not stale, "fix ALLOWED:\n" + "\n".join(stale)
