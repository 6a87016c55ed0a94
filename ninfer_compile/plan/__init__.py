"""The plan directory: manifest (plan.json), memory report, atomic deterministic writer."""
