"""Benchmarks. `python -m bench` runs every `bench/*_bench.py` module's `main()`.

Each benchmark reports figures as ratios against a baseline measured in the same run (the machine
is small and noisy), never as pass/fail asserts.
"""
