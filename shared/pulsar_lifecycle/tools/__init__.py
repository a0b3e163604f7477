"""Operator tools behind the CLI: `inspect`, `delayed send/cancel` and `up`.

Each command checks its arguments before it connects to anything (`checks`), reads the engines'
stores through the engines' own readers, and leaves the functions' data as it found it.
"""
__all__: list = []
