"""Build the artifacts ``pulsar-admin functions create --py`` takes: a function zip and a wheel.

The zip follows what Pulsar's ``python_instance_main.py`` expects of ``--py <stem>.zip``:
it is extracted next to itself, ``<stem>/deps/*.whl`` are installed with
``pip install -t <dir> --no-index --find-links <stem>/deps <wheels>`` and ``<stem>/src`` is put on
``sys.path``. So the zip's file stem must equal its top-level folder, and every transitive runtime
dependency must be a wheel for the runtime's Python version and platform (``--no-index``).
"""

from __future__ import annotations

import importlib.util
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Collection, Dict, List, Optional, Sequence, Tuple, Union

from ..exceptions import PulsarLifecycleError

logger = logging.getLogger(__name__)

LIBRARY_PACKAGE = "pulsar_lifecycle"
LIBRARY_DIR = Path("shared") / LIBRARY_PACKAGE
FUNCTIONS_DIR = Path("functions")
# Fixed timestamp for zip entries so two builds of the same tree give the same bytes.
_ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)
# Bounded retries when pip download meets sdist-only packages (each retry builds one more wheel).
_MAX_SDIST_BUILDS = 10
_PIP_TIMEOUT_S = 900
_IGNORED_SRC = ("__pycache__", "*.pyc", "*.pyo", "*.egg-info", ".pytest_cache", ".mypy_cache")


class PackagingError(PulsarLifecycleError, RuntimeError):
    """Building a function zip or wheel failed; the message names the step and the cause."""


def canonical_name(name: str) -> str:
    """PEP 503 normalised distribution name (``Foo_Bar.baz`` -> ``foo-bar-baz``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _read_pyproject(project_dir: Path) -> Dict[str, object]:
    path = project_dir / "pyproject.toml"
    try:
        import tomllib  # type: ignore[import-not-found]
    except ModuleNotFoundError:  # Python < 3.11
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError as exc:
            raise PackagingError("reading pyproject.toml needs Python >= 3.11 or the 'tomli' package") from exc
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise PackagingError(f"cannot read {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise PackagingError(f"{path} is not valid TOML: {exc}") from exc


def project_metadata(project_dir: Path) -> Tuple[str, List[str]]:
    """(project name, [project].dependencies) from ``project_dir/pyproject.toml``."""
    data = _read_pyproject(Path(project_dir))
    project = data.get("project")
    if not isinstance(project, dict) or not isinstance(project.get("name"), str):
        raise PackagingError(f"{project_dir / 'pyproject.toml'} has no [project] name")
    deps = project.get("dependencies", [])
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        raise PackagingError(f"{project_dir / 'pyproject.toml'}: [project].dependencies must be a list of strings")
    return project["name"], list(deps)


def _requirement_name(req: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    if not match:
        raise PackagingError(f"cannot parse requirement {req!r} in [project].dependencies")
    return canonical_name(match.group(1))


def _wheel_dist_name(wheel: Path) -> str:
    return canonical_name(wheel.name.split("-", 1)[0])


def _normalise_python_version(version: str) -> Tuple[int, int]:
    match = re.fullmatch(r"(\d)\.?(\d+)", version.strip())
    if not match:
        raise PackagingError(f"python version {version!r} is not like '3.11' or '311'")
    return int(match.group(1)), int(match.group(2))


def _platforms(platform: Union[str, Sequence[str], None]) -> List[str]:
    if platform is None:
        return []
    items = platform.split(",") if isinstance(platform, str) else list(platform)
    return [p.strip() for p in items if p.strip()]


def _running_platform_tags() -> List[str]:
    """Platform tags the running interpreter installs, e.g. manylinux_2_28_x86_64, linux_x86_64."""
    try:
        from packaging.tags import sys_tags
    except ModuleNotFoundError:  # pip always vendors packaging
        from pip._vendor.packaging.tags import sys_tags  # type: ignore[no-redef,assignment]
    seen: List[str] = []
    for tag in sys_tags():
        if tag.platform not in seen:
            seen.append(tag.platform)
    return seen


def _is_running_target(python_version: Optional[str], platforms: List[str],
                       implementation: str, abi: Optional[str]) -> bool:
    if python_version is not None and _normalise_python_version(python_version) != sys.version_info[:2]:
        return False
    if implementation != "cp" or sys.implementation.name != "cpython":
        return False
    if abi is not None and abi != f"cp{sys.version_info[0]}{sys.version_info[1]}":
        return False
    running = _running_platform_tags()
    return all(p in running for p in platforms)


def _run(cmd: List[str], step: str, cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
    logger.debug("%s: %s", step, " ".join(cmd))
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise PackagingError(f"{step}: timed out after {_PIP_TIMEOUT_S} s: {' '.join(cmd)}") from exc


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _pip() -> List[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]


def _is_pure_wheel(wheel: Path) -> bool:
    # name-version(-build)?-python-abi-platform.whl
    parts = wheel.name[:-len(".whl")].split("-")
    return len(parts) >= 5 and parts[-2] == "none" and parts[-1] == "any"


def collect_dependency_wheels(
    requirements: Sequence[str],
    deps_dir: Path,
    python_version: Optional[str] = None,
    platform: Union[str, Sequence[str], None] = None,
    implementation: str = "cp",
    abi: Optional[str] = None,
) -> List[Path]:
    """Put a wheel of every requirement and all their transitive dependencies into ``deps_dir``.

    For the running interpreter (the default) this is ``pip wheel``, which also builds wheels of
    sdist-only packages. For a foreign target it is ``pip download --only-binary=:all:`` with
    ``--python-version/--platform/--implementation/--abi``; a package with no wheel on the index
    is built here with ``pip wheel --no-deps`` and used only if the result is pure Python
    (``none-any``), since a compiled wheel built here would not fit the target.
    """
    deps_dir.mkdir(parents=True, exist_ok=True)
    if not requirements:
        return []
    platforms = _platforms(platform)
    if _is_running_target(python_version, platforms, implementation, abi):
        logger.info("collecting %d requirements as wheels for the running interpreter into %s",
                    len(requirements), deps_dir)
        result = _run([*_pip(), "wheel", "--wheel-dir", str(deps_dir), *requirements], "pip wheel")
        if result.returncode != 0:
            raise PackagingError(f"pip wheel of the runtime dependencies failed:\n{_tail(result.stderr or result.stdout)}")
    else:
        _download_foreign(requirements, deps_dir, python_version, platforms, implementation, abi)
    wheels = sorted(deps_dir.glob("*.whl"))
    stray = sorted(p for p in deps_dir.iterdir() if not p.name.endswith(".whl"))
    if stray:
        raise PackagingError(f"dependency collection left non-wheel files in {deps_dir}: "
                             f"{', '.join(p.name for p in stray)} (pip install --no-index needs wheels)")
    logger.info("collected %d dependency wheels in %s", len(wheels), deps_dir)
    return wheels


def _download_foreign(requirements: Sequence[str], deps_dir: Path, python_version: Optional[str],
                      platforms: List[str], implementation: str, abi: Optional[str]) -> None:
    target: List[str] = ["--only-binary=:all:", "--implementation", implementation]
    if python_version is not None:
        major, minor = _normalise_python_version(python_version)
        target += ["--python-version", f"{major}.{minor}"]
    for plat in platforms:
        target += ["--platform", plat]
    if abi is not None:
        target += ["--abi", abi]
    built: List[str] = []
    with tempfile.TemporaryDirectory(prefix="pl-sdist-wheels-") as local:
        for _ in range(_MAX_SDIST_BUILDS + 1):
            logger.info("downloading wheels for target %s into %s", " ".join(target[1:]), deps_dir)
            result = _run([*_pip(), "download", "--dest", str(deps_dir), "--find-links", local,
                           *target, *requirements], "pip download")
            if result.returncode == 0:
                return
            missing = re.search(r"No matching distribution found for (\S+)", result.stderr)
            if not missing or missing.group(1) in built:
                raise PackagingError(f"pip download for target {' '.join(target[1:])} failed:\n"
                                     f"{_tail(result.stderr or result.stdout)}")
            req = missing.group(1)
            built.append(req)
            logger.info("no wheel on the index for %s: building one locally", req)
            wheel = _build_one_wheel(req, Path(local))
            if not _is_pure_wheel(wheel):
                raise PackagingError(
                    f"{req} has no wheel for target {' '.join(target[1:])} and builds a "
                    f"platform-specific wheel ({wheel.name}); build the zip on a machine matching "
                    f"the target (leave --python-version/--platform unset there)")
        raise PackagingError(f"gave up after building {len(built)} sdist-only packages: {', '.join(built)}")


def _build_one_wheel(req: str, out_dir: Path) -> Path:
    before = set(out_dir.glob("*.whl"))
    result = _run([*_pip(), "wheel", "--no-deps", "--wheel-dir", str(out_dir), req], f"pip wheel {req}")
    if result.returncode != 0:
        raise PackagingError(f"building a wheel of {req} failed:\n{_tail(result.stderr or result.stdout)}")
    new = sorted(set(out_dir.glob("*.whl")) - before)
    if not new:
        raise PackagingError(f"pip wheel {req} produced no wheel")
    return new[0]


def _copy_sources(project_dir: Path, src_dir: Path) -> List[str]:
    """Copy the library package and every functions/*.py module; return the top-level names."""
    lib = project_dir / LIBRARY_DIR
    if not (lib / "__init__.py").is_file():
        raise PackagingError(f"library package not found: {lib}/__init__.py")
    shutil.copytree(lib, src_dir / LIBRARY_PACKAGE, ignore=shutil.ignore_patterns(*_IGNORED_SRC))
    names = [LIBRARY_PACKAGE]
    functions = sorted((project_dir / FUNCTIONS_DIR).glob("*.py"))
    for module in functions:
        shutil.copy2(module, src_dir / module.name)
        names.append(module.stem)
    if not functions:
        logger.warning("no function modules in %s: the zip holds only the library", project_dir / FUNCTIONS_DIR)
    return names


def _write_zip(root: Path, zip_path: Path) -> None:
    tmp = zip_path.with_name(zip_path.name + ".part")
    with zipfile.ZipFile(tmp, "w") as zf:
        for path in sorted(root.rglob("*")):
            arcname = path.relative_to(root.parent).as_posix()
            if path.is_dir():
                continue
            info = zipfile.ZipInfo(arcname, date_time=_ZIP_DATE_TIME)
            info.external_attr = 0o644 << 16
            # Wheels are zips already: storing them saves time and loses nothing.
            info.compress_type = zipfile.ZIP_STORED if path.suffix == ".whl" else zipfile.ZIP_DEFLATED
            with path.open("rb") as fh:
                zf.writestr(info, fh.read())
    tmp.replace(zip_path)


def build_function_zip(
    project_dir: Path,
    out_dir: Path,
    stem: str = "pulsar-lifecycle",
    python_version: Optional[str] = None,
    platform: Union[str, Sequence[str], None] = None,
    implementation: str = "cp",
    abi: Optional[str] = None,
    exclude: Collection[str] = (),
) -> Path:
    """Build ``out_dir/<stem>.zip`` for ``pulsar-admin functions create --py``.

    Layout: ``<stem>/src/pulsar_lifecycle/...``, ``<stem>/src/<each functions/*.py>`` and
    ``<stem>/deps/*.whl`` holding every transitive dependency of pyproject's
    ``[project].dependencies`` as a wheel for the target (default: the running interpreter;
    ``python_version`` like "3.11", ``platform`` a wheel platform tag such as
    "manylinux2014_x86_64" or several comma-separated). ``exclude`` names distributions to leave
    out of deps (for example ``pulsar-client``, which the Pulsar runtime image already has); the
    project's own distribution is never in deps, its code is in src/.
    """
    project_dir = Path(project_dir).resolve()
    out_dir = Path(out_dir).resolve()
    if not stem or "/" in stem or "\\" in stem or stem.startswith("."):
        raise PackagingError(f"zip stem {stem!r} must be a plain file name (it is also the top-level folder)")
    project_name, requirements = project_metadata(project_dir)
    excluded = {canonical_name(e) for e in exclude}
    unknown = excluded - {_requirement_name(r) for r in requirements}
    if unknown:
        logger.warning("exclude names %s are not direct dependencies; they are dropped only as wheels",
                       ", ".join(sorted(unknown)))
    kept = [r for r in requirements if _requirement_name(r) not in excluded]
    out_dir.mkdir(parents=True, exist_ok=True)
    zip_path = out_dir / f"{stem}.zip"
    with tempfile.TemporaryDirectory(prefix="pl-zip-") as tmp:
        root = Path(tmp) / stem
        src_dir = root / "src"
        deps_dir = root / "deps"
        src_dir.mkdir(parents=True)
        logger.info("copying sources of %s into %s/src", project_dir, stem)
        modules = _copy_sources(project_dir, src_dir)
        logger.info("source modules: %s", ", ".join(modules))
        collect_dependency_wheels(kept, deps_dir, python_version, platform, implementation, abi)
        for wheel in sorted(deps_dir.glob("*.whl")):
            name = _wheel_dist_name(wheel)
            if name == canonical_name(project_name) or name in excluded:
                logger.info("dropping %s from deps", wheel.name)
                wheel.unlink()
        logger.info("writing %s", zip_path)
        _write_zip(root, zip_path)
    logger.info("built %s (%d bytes)", zip_path, zip_path.stat().st_size)
    return zip_path


# Top-level folders of the work tree that are not sources; at any depth only caches are skipped.
_WHEEL_COPY_TOP_IGNORE = frozenset({".git", ".venv", "venv", "build", "dist", "data", "node_modules",
                                    ".pytest_cache", ".hypothesis", ".mypy_cache"})
_WHEEL_COPY_ANY_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")


def _wheel_copy_ignore(root: Path):  # type: ignore[no-untyped-def]
    def ignore(directory: str, names: List[str]) -> set:
        skipped = set(_WHEEL_COPY_ANY_IGNORE(directory, names))
        if Path(directory) == root:
            skipped |= _WHEEL_COPY_TOP_IGNORE & set(names)
        return skipped
    return ignore


# PEP 517's build requirements when pyproject.toml names none.
_DEFAULT_BUILD_REQUIRES = ("setuptools>=40.8.0", "wheel")


def _version_key(version: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:4])


def missing_build_requirements(project_dir: Path) -> List[str]:
    """The project's build requirements (`[build-system] requires`) this interpreter does not
    meet, each as written (with the version found); a requirement other than `name` or
    `name>=version` counts as missing, so the build isolates rather than guesses."""
    from importlib import metadata

    system = _read_pyproject(Path(project_dir)).get("build-system")
    requires = system.get("requires") if isinstance(system, dict) else None
    missing = []
    for req in requires if isinstance(requires, list) else _DEFAULT_BUILD_REQUIRES:
        match = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:>=\s*(\d[\d.]*))?\s*", str(req))
        if not match:
            missing.append(str(req))
            continue
        try:
            have = metadata.version(match.group(1))
        except metadata.PackageNotFoundError:
            missing.append(f"{req} (not installed)")
            continue
        if match.group(2) and _version_key(have) < _version_key(match.group(2)):
            missing.append(f"{req} (have {have})")
    return missing


def build_wheel(project_dir: Path, out_dir: Path) -> Path:
    """Build the project's wheel into ``out_dir`` and return its path.

    Builds from a temporary copy of the project so setuptools' ``build/`` and ``*.egg-info``
    never land in the work tree; uses ``python -m build --wheel`` when the ``build`` package is
    installed, else ``pip wheel --no-deps``. When this interpreter has the build requirements
    (`[build-system] requires`, e.g. the test extra's setuptools >= 77) the build uses them, with
    no isolation and no download; otherwise (a plain ``pip install .``, whose venv keeps an
    older setuptools) the frontend builds in an isolated environment with the requirements
    fetched, as ``pip install .`` itself did.
    """
    project_dir = Path(project_dir).resolve()
    out_dir = Path(out_dir).resolve()
    name, _ = project_metadata(project_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pl-wheel-") as tmp:
        copy = Path(tmp) / "project"
        shutil.copytree(project_dir, copy, ignore=_wheel_copy_ignore(project_dir))
        built = Path(tmp) / "out"
        built.mkdir()
        missing = missing_build_requirements(project_dir)
        if importlib.util.find_spec("build") is not None:
            cmd = [sys.executable, "-m", "build", "--wheel", *([] if missing else ["--no-isolation"]),
                   "--outdir", str(built), str(copy)]
        else:
            cmd = [*_pip(), "wheel", "--no-deps", *([] if missing else ["--no-build-isolation"]),
                   "--wheel-dir", str(built), str(copy)]
        if missing:
            logger.info("event=wheel_build_isolated missing=%s hint='the build requirements are fetched into an "
                        "isolated environment'", ";".join(missing))
        logger.info("building wheel of %s", project_dir)
        result = _run(cmd, "build wheel")
        if result.returncode != 0:
            raise PackagingError(f"building the wheel of {project_dir} failed:\n{_tail(result.stderr or result.stdout)}")
        wheels = [w for w in built.glob("*.whl") if _wheel_dist_name(w) == canonical_name(name)]
        if len(wheels) != 1:
            raise PackagingError(f"expected one {name} wheel, got {[w.name for w in built.glob('*.whl')]}")
        target = out_dir / wheels[0].name
        shutil.copy2(wheels[0], target)
    logger.info("built %s", target)
    return target
