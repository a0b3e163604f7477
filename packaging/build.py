#!/usr/bin/env python3
"""Build the artifacts ``pulsar-admin functions create`` takes: the ``--py`` zip and the wheel.

    python packaging/build.py                 # zip + wheel into dist/, for this interpreter
    python packaging/build.py zip --python-version 3.10 --platform manylinux2014_x86_64
    python packaging/build.py wheel --out-dir /tmp/out

A thin wrapper over ``pulsar_lifecycle.packaging.zip_builder``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent

try:
    from pulsar_lifecycle.packaging.zip_builder import PackagingError, build_function_zip, build_wheel
except ModuleNotFoundError:  # run from a checkout without the package installed
    sys.path.insert(0, str(PROJECT_DIR / "shared"))
    from pulsar_lifecycle.packaging.zip_builder import PackagingError, build_function_zip, build_wheel


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Build the Pulsar Functions zip (<stem>/src + <stem>/deps/*.whl) and the wheel.")
    parser.add_argument("what", nargs="?", choices=("all", "zip", "wheel"), default="all",
                        help="what to build (default: all)")
    parser.add_argument("--project-dir", type=Path, default=PROJECT_DIR,
                        help="project root holding pyproject.toml (default: %(default)s)")
    parser.add_argument("--out-dir", type=Path, default=PROJECT_DIR / "dist",
                        help="where the artifacts go (default: %(default)s)")
    parser.add_argument("--stem", default="pulsar-lifecycle",
                        help="zip file stem and top-level folder (default: %(default)s)")
    parser.add_argument("--python-version", default=None,
                        help="target Python, e.g. 3.10 (default: this interpreter)")
    parser.add_argument("--platform", default=None,
                        help="target wheel platform tag(s), comma-separated, e.g. manylinux2014_x86_64 "
                             "(default: this machine)")
    parser.add_argument("--implementation", default="cp", help="target implementation (default: cp)")
    parser.add_argument("--abi", default=None, help="target ABI tag, e.g. cp310 (default: pip's choice)")
    parser.add_argument("--exclude", action="append", default=[], metavar="DIST",
                        help="leave this distribution out of deps/ (repeatable), e.g. pulsar-client")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = _parser().parse_args(argv)
    try:
        from rich.console import Console
        from rich.logging import RichHandler

        console = Console(stderr=True)
        handler: logging.Handler = RichHandler(console=console, show_path=False)
    except ModuleNotFoundError:
        console = None
        handler = logging.StreamHandler()
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(message)s", handlers=[handler])
    log = logging.getLogger("packaging.build")
    try:
        if args.what in ("all", "zip"):
            if console is not None:
                with console.status(f"building {args.stem}.zip ..."):
                    path = _zip(args)
            else:
                path = _zip(args)
            log.info("function zip: %s", path)
        if args.what in ("all", "wheel"):
            if console is not None:
                with console.status("building wheel ..."):
                    path = build_wheel(args.project_dir, args.out_dir)
            else:
                path = build_wheel(args.project_dir, args.out_dir)
            log.info("wheel: %s", path)
    except PackagingError as exc:
        log.error("%s", exc)
        return 1
    return 0


def _zip(args: argparse.Namespace) -> Path:
    return build_function_zip(args.project_dir, args.out_dir, stem=args.stem,
                              python_version=args.python_version, platform=args.platform,
                              implementation=args.implementation, abi=args.abi, exclude=args.exclude)


if __name__ == "__main__":
    sys.exit(main())
