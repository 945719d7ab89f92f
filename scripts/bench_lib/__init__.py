"""The modules of scripts/bench.py, one per kind of measurement (run bench.py, not these)."""
