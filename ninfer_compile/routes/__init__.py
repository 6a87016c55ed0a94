"""Route tables (`routes/smNN.yaml`): per-GPU-architecture maps from (op family, match, T range)
to a registered route and its parameters. See `table.py` for the rules and `schema.py` for the
file format."""

from .table import (  # noqa: F401
    ROUTES_DIR,
    RouteTable,
    Selection,
    UnsupportedRange,
    effective_match,
    load_table,
    shipped_tables,
    table_for_sm,
)
