"""Local paths made absolute once, where they enter (a command's options, a launcher).

A relative path means "relative to the working directory", and that differs between a command
and what it starts: the embedded broker runs in its own data directory, Spark executors in work
directories of their own. A relative path handed on names a different place there, so one
directory spelled relatively and absolutely would hold two different states. Every path a user
gives is therefore resolved against the working directory of the command that received it,
before anything uses or passes it on.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Union

__all__ = ["absolute", "absolute_path"]


def absolute(path: Union[str, "os.PathLike[str]"]) -> Path:
    """`path` as an absolute path (`~` expanded, `.`/`..` folded; symlinks kept as spelled)."""
    return Path(os.path.abspath(os.path.expanduser(os.fspath(path))))


def absolute_path(_ctx: Any, _param: Any, value: Any) -> Any:
    """Click option callback: the value (each value of a multiple option) made absolute as a str;
    None stays None. Kept free of click so that importing it costs a command's start nothing."""
    if value is None:
        return None
    if isinstance(value, tuple):
        return tuple(str(absolute(v)) for v in value)
    return str(absolute(value))
