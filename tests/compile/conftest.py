import pytest

from .support import make_registry


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
