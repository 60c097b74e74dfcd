"""The databases behind the engine's seam, one package each (DESIGN.md).

Only a backend imports its driver: ``sqlite3`` under ``backends/sqlite/``
(``tests/unit/test_layers.py`` enforces it).
"""
