import pytest

from .support import make_registry, tiny_artifact, write_table


@pytest.fixture
def test_registry(monkeypatch):
    """Route tables loaded through table_for_sm use the isolated test registry."""
    import ninfer_compile.routes.table as table_mod

    import ninfer_compile.compile_cli as compile_cli

    reg = make_registry()
    monkeypatch.setattr(table_mod, "default_registry", reg)
    # fake routes have no launchers: nothing to emit (emission is tested in tests/runtime/test_emit.py)
    monkeypatch.setattr(compile_cli, "EMIT_KERNELS", False)
    return reg


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    """A tiny synthetic artifact, shared by a module's tests (treat as read-only)."""
    return tiny_artifact(tmp_path_factory.mktemp("art") / "tiny.ninfer")


@pytest.fixture
def table(tmp_path, test_registry):
    """An sm90 route table over the isolated test registry's launcher-less routes."""
    d = tmp_path / "routes"
    d.mkdir()
    return write_table(d, 90)
