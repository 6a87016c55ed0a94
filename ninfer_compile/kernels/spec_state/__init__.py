"""Rollback of a recurrent state after a verify round: select each row's accepted column (spec.py)."""
