"""Benchmarks that reproduce the paper's experiments next to the systems a user would pick.

Each benchmark runs pathdask and its baselines in one run on the same cluster,
prints a table, and writes JSON with the ratios (``pathdask bench ...``).
"""
