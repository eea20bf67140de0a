"""Adapters that put kbpg where users already work (each an optional extra)."""
