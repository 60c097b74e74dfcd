"""The pure part of the engine: decisions with no I/O, threads, clocks or drivers.

Every engine operation is *prepare (pure) → one backend call → interpret
(pure)*; this package holds the two pure ends, so the sync and async shells
and every backend share them. ``tests/unit/test_layers.py`` keeps it pure.
"""
