import pytest

from .support import make_registry


@pytest.fixture
def test_registry(monkeypatch):
    """Route tables loaded through table_for_sm use the isolated test registry."""
    import ninfer_compile.routes.table as table_mod

    reg = make_registry()
    monkeypatch.setattr(table_mod, "default_registry", reg)
    return reg
