"""Test and demo helpers shipped with the package (no test framework needed)."""
