"""The --py zip installs and imports exactly as Pulsar's python_instance_main does, in a fresh venv."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from pulsar_lifecycle.config.function_config import load_function_config
from pulsar_lifecycle.packaging.zip_builder import (
    PackagingError,
    build_function_zip,
    build_wheel,
    canonical_name,
    missing_build_requirements,
    project_metadata,
)
from support.paths import REPO

STEM = "pulsar-lifecycle"


def _class_names(project: Path) -> List[str]:
    names = []
    for path in sorted((project / "function-configs").glob("*.yaml")):
        class_name = load_function_config(path).get("className")
        if isinstance(class_name, str):
            names.append(class_name)
    return names


def _project(tmp_path: Path) -> Tuple[Path, List[str]]:
    """The repo when its configs name function modules that exist, else a copy with a throwaway one."""
    names = _class_names(REPO)
    if names and all((REPO / "functions" / f"{n.rsplit('.', 1)[0]}.py").is_file() for n in names):
        return REPO, names
    copy = tmp_path / "project"
    (copy / "functions").mkdir(parents=True)
    (copy / "function-configs").mkdir()
    shutil.copy2(REPO / "pyproject.toml", copy / "pyproject.toml")
    shutil.copytree(REPO / "shared" / "pulsar_lifecycle", copy / "shared" / "pulsar_lifecycle",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "functions" / "throwaway_fn.py").write_text(textwrap.dedent("""
        import yaml  # a dependency from deps/, so a missing wheel fails the import

        class ThrowawayFunction:
            def process(self, input, context):
                return yaml.safe_dump(input)
    """))
    (copy / "function-configs" / "throwaway.yaml").write_text(
        "className: throwaway_fn.ThrowawayFunction\ninputs: [persistent://public/default/in]\n")
    return copy, ["throwaway_fn.ThrowawayFunction"]


def _clean_env() -> Dict[str, str]:
    # No PYTHONPATH/PIP_* leaking the dev venv into the fresh one.
    return {k: v for k, v in os.environ.items()
            if not (k.startswith(("PYTHON", "PIP_")) or k in ("VIRTUAL_ENV", "__PYVENV_LAUNCHER__"))}


# Pulsar's worker imports its own protobuf before user code (python_instance_main imports
# Function_pb2 & co.), so user code runs on the worker's protobuf whatever deps/ holds. The check
# imports it first from the venv's site-packages, then does what python_instance_main +
# util.import_class do, then runs the package's protobuf code; prints a JSON report.
_CHECK = textwrap.dedent("""
    import importlib, importlib.metadata, inspect, json, os, sys
    import google.protobuf
    from google.protobuf import descriptor_pool, message, reflection, symbol_database  # as Function_pb2 does
    zip_dir, stem, class_names, dists = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
    sys.path.insert(0, os.path.join(zip_dir, stem, "src"))
    sys.path.insert(0, zip_dir)
    report = {"classes": {}, "modules": {}, "pulsar_lifecycle": None,
              "protobuf": [google.protobuf.__version__, google.protobuf.__file__], "bucket": None}
    for full in class_names:
        module_name, _, attr = full.rpartition(".")
        try:
            kclass = getattr(importlib.import_module(module_name), attr)
            assert inspect.isclass(kclass), f"{full} is {type(kclass).__name__}, not a class"
            instance = kclass()
            assert callable(getattr(instance, "process", None)), f"{full} has no process()"
            report["classes"][full] = "ok"
        except BaseException as exc:
            report["classes"][full] = f"{type(exc).__name__}: {exc}"
    top = importlib.metadata.packages_distributions()
    for name, dists_of in sorted(top.items()):
        if name.startswith("_") or not any(d.lower().replace("_", "-") in dists for d in dists_of):
            continue
        try:
            importlib.import_module(name)
            report["modules"][name] = "ok"
        except BaseException as exc:
            report["modules"][name] = f"{type(exc).__name__}: {exc}"
    import pulsar_lifecycle
    report["pulsar_lifecycle"] = pulsar_lifecycle.__file__
    # Every protobuf message of the package on this protobuf: journal, seal (segments, metadata,
    # bitmaps), manifest, cursor, recovery, release.
    from pulsar_lifecycle.bucket import BucketConfig, BucketIndex, DelayedMessage, MemorySnapshotStorage
    store = MemorySnapshotStorage()
    ix = BucketIndex(store, BucketConfig(), clock=lambda: 0)
    ix.recover()
    ix.add([DelayedMessage(5, (e << 10) | b, -1, 1000 + e, b"p%d.%d" % (e, b), properties={"k": "v"})
            for e in range(3) for b in range(2)])
    ix.seal()
    again = BucketIndex(store, BucketConfig(), clock=lambda: 0)
    again.recover()
    report["bucket"] = [(r.seq, r.message.payload.decode(), r.message.properties["k"]) for r in again.pop_due(10**6, 100)]
    print(json.dumps(report))
""")

NEWEST = "newest"  # the protobuf wheel the zip ships, i.e. the newest release the pin allows


@pytest.fixture(scope="module")
def installed_zip(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, object]:
    """The zip built once and installed exactly as python_instance_main does (pip -t, --no-index)."""
    tmp_path = tmp_path_factory.mktemp("zip")
    project, class_names = _project(tmp_path)
    out = tmp_path / "out"
    zip_path = build_function_zip(project, out)
    assert zip_path == out / f"{STEM}.zip"

    with zipfile.ZipFile(zip_path) as zf:
        entries = zf.namelist()
    assert all(e.startswith(f"{STEM}/") for e in entries), "zip stem must equal the top-level folder"
    assert f"{STEM}/src/pulsar_lifecycle/__init__.py" in entries
    for module in sorted((project / "functions").glob("*.py")):
        assert f"{STEM}/src/{module.name}" in entries
    wheels = [e for e in entries if e.startswith(f"{STEM}/deps/")]
    assert wheels and all(w.endswith(".whl") for w in wheels)
    project_name, requirements = project_metadata(project)
    wheel_dists = {canonical_name(Path(w).name.split("-", 1)[0]) for w in wheels}
    assert canonical_name(project_name) not in wheel_dists, "the project's own wheel must not be in deps"
    assert not any("__pycache__" in e for e in entries)

    # The instance's Python, without our deps: a fresh venv (no --system-site-packages).
    env = _clean_env()
    instance_dir = tmp_path / "instance"
    instance_dir.mkdir()
    user_code = instance_dir / zip_path.name
    shutil.copy2(zip_path, user_code)
    with zipfile.ZipFile(user_code) as zf:
        zf.extractall(instance_dir)
    basename = os.path.basename(os.path.splitext(str(user_code))[0])
    deps_dir = instance_dir / basename / "deps"
    dep_wheels = sorted(str(p) for p in deps_dir.glob("*.whl"))
    venv = tmp_path / "installer"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=env, timeout=120)
    # Exactly python_instance_main's pip step for a .zip (pip of this interpreter, run as the venv's).
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "--disable-pip-version-check", "-t", str(instance_dir), "--no-index", "--find-links", str(deps_dir),
         *dep_wheels], env=env, cwd=instance_dir, capture_output=True, text=True, timeout=240)
    assert install.returncode == 0, install.stderr[-3000:]
    dists = sorted({canonical_name(r.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip())
                    for r in requirements})
    return {"instance_dir": instance_dir, "basename": basename, "deps_dir": deps_dir,
            "class_names": class_names, "dists": dists, "env": env}


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("worker_protobuf", ["3.20.3", "6.31.1", NEWEST])
def test_zip_imports_and_runs_on_the_workers_protobuf(tmp_path: Path, installed_zip: Dict[str, object],
                                                      worker_protobuf: str) -> None:
    """Pulsar's images pin protobuf 3.20.x (newer ones 6.x): every className loads and the bucket
    protobufs work on the protobuf the worker imported first, from 3.20.3 to the newest."""
    env = installed_zip["env"]
    instance_dir = installed_zip["instance_dir"]
    venv = tmp_path / "worker"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=env, timeout=120)
    vpy = venv / "bin" / "python"
    # The worker's own protobuf in its site-packages (3.20.3: the pure-python py2.py3 wheel).
    spec = ["--no-index", "--find-links", str(installed_zip["deps_dir"]), "protobuf"] \
        if worker_protobuf == NEWEST else [f"protobuf=={worker_protobuf}"]
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "-q",
                          "--disable-pip-version-check", *spec], env=env, capture_output=True, text=True, timeout=240)
    assert pip.returncode == 0, pip.stderr[-3000:]

    check = subprocess.run(
        [str(vpy), "-c", _CHECK, str(instance_dir), installed_zip["basename"], json.dumps(installed_zip["class_names"]),
         json.dumps(installed_zip["dists"])],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)  # not cwd: '' leads sys.path
    assert check.returncode == 0, check.stderr[-3000:]
    report = json.loads(check.stdout.strip().splitlines()[-1])
    version, location = report["protobuf"]
    assert location.startswith(str(venv)), f"protobuf must be the worker's, got {location}"
    if worker_protobuf != NEWEST:
        assert version == worker_protobuf
    assert report["classes"] == {name: "ok" for name in installed_zip["class_names"]}
    bad = {m: r for m, r in report["modules"].items() if r != "ok"}
    assert not bad, bad
    for expected in ("pulsar", "yaml", "fastavro", "pyroaring", "bookkeeper", "grpc", "boto3"):
        assert report["modules"].get(expected) == "ok", report["modules"]
    # The library came from the zip's src/, not from the dev install.
    assert report["pulsar_lifecycle"].startswith(str(instance_dir / installed_zip["basename"] / "src"))
    assert report["bucket"] == [[i + 1, f"p{e}.{b}", "v"] for i, (e, b) in
                                enumerate((e, b) for e in range(3) for b in range(2))]


def test_zip_layout_without_deps(tmp_path: Path) -> None:
    """With every dependency excluded no pip runs: checks src layout, stem and determinism offline."""
    _, requirements = project_metadata(REPO)
    exclude = [r.split(">")[0].split("=")[0].split("<")[0].strip() for r in requirements]
    first = build_function_zip(REPO, tmp_path / "a", stem="my-fn", exclude=exclude)
    second = build_function_zip(REPO, tmp_path / "b", stem="my-fn", exclude=exclude)
    assert first.name == "my-fn.zip"
    with zipfile.ZipFile(first) as zf:
        entries = zf.namelist()
    assert "my-fn/src/pulsar_lifecycle/__init__.py" in entries
    assert "my-fn/src/pulsar_lifecycle/config/validate.py" in entries
    assert all(e.startswith("my-fn/src/") for e in entries)
    assert not any(e.endswith(".pyc") for e in entries)
    assert first.read_bytes() == second.read_bytes(), "same tree must give the same zip bytes"


def test_bad_stem_rejected(tmp_path: Path) -> None:
    with pytest.raises(PackagingError, match="stem"):
        build_function_zip(REPO, tmp_path, stem="a/b")


def test_build_wheel_has_library_and_functions(tmp_path: Path) -> None:
    had_build_dir = (REPO / "build").exists()
    wheel = build_wheel(REPO, tmp_path)
    assert wheel.name.startswith("pulsar_lifecycle-") and wheel.suffix == ".whl"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert "pulsar_lifecycle/__init__.py" in names
    assert "example_function.py" in names
    assert (REPO / "build").exists() == had_build_dir, "the wheel is built from a copy, not in the tree"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_foreign_target_downloads_target_wheels(tmp_path: Path) -> None:
    """A target Python other than this one gets wheels tagged for it (pip download --only-binary)."""
    project = tmp_path / "p"
    (project / "shared" / "pulsar_lifecycle").mkdir(parents=True)
    (project / "shared" / "pulsar_lifecycle" / "__init__.py").write_text("")
    (project / "pyproject.toml").write_text(
        '[project]\nname = "tiny"\nversion = "0"\ndependencies = ["PyYAML>=6.0", "six"]\n')
    other = "3.10" if sys.version_info[:2] != (3, 10) else "3.12"
    tag = "cp" + other.replace(".", "")
    zip_path = build_function_zip(project, tmp_path / "out", stem="tiny", python_version=other,
                                  platform="manylinux2014_x86_64")
    with zipfile.ZipFile(zip_path) as zf:
        wheels = [Path(e).name for e in zf.namelist() if e.startswith("tiny/deps/")]
    yaml_wheels = [w for w in wheels if w.lower().startswith("pyyaml-")]
    assert len(yaml_wheels) == 1 and f"-{tag}-" in yaml_wheels[0], wheels
    assert any(w.startswith("six-") for w in wheels), wheels


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_foreign_target_builds_pure_sdist_only_dependency(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dependency published only as an sdist is built here and shipped when its wheel is pure."""
    sdist_src = tmp_path / "sdistonly"
    (sdist_src / "sdistonly_pkg").mkdir(parents=True)
    (sdist_src / "sdistonly_pkg" / "__init__.py").write_text("VALUE = 42\n")
    (sdist_src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "sdistonly-pkg"\nversion = "0.1"\ndependencies = ["six"]\n')
    links = tmp_path / "links"
    links.mkdir()
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(links),
                    str(sdist_src)], check=True, capture_output=True, timeout=120)
    assert [p.suffix for p in links.iterdir()] == [".gz"]
    # The sdist is findable only through find-links: the index has no such package.
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))

    project = tmp_path / "p"
    (project / "shared" / "pulsar_lifecycle").mkdir(parents=True)
    (project / "shared" / "pulsar_lifecycle" / "__init__.py").write_text("")
    (project / "pyproject.toml").write_text(
        '[project]\nname = "tiny"\nversion = "0"\ndependencies = ["sdistonly-pkg"]\n')
    other = "3.10" if sys.version_info[:2] != (3, 10) else "3.12"
    zip_path = build_function_zip(project, tmp_path / "out", stem="tiny", python_version=other,
                                  platform="manylinux2014_x86_64")
    with zipfile.ZipFile(zip_path) as zf:
        wheels = sorted(Path(e).name for e in zf.namelist() if e.startswith("tiny/deps/"))
    assert any(w.startswith("sdistonly_pkg-0.1-") and w.endswith("-none-any.whl") for w in wheels), wheels
    assert any(w.startswith("six-") for w in wheels), wheels


def test_missing_build_requirements_names_what_this_interpreter_lacks(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=9999", "pip", "no-such-dist-xyz", "odd[extra]>=1"]\n'
        '[project]\nname = "p"\nversion = "0"\n')
    missing = missing_build_requirements(tmp_path)
    assert missing[0].startswith("setuptools>=9999 (have ") and missing[1:] == [
        "no-such-dist-xyz (not installed)", "odd[extra]>=1"]
    assert missing_build_requirements(REPO) == []  # the test extra brings setuptools >= 77 and wheel


@pytest.mark.timeout(240)
def test_package_works_in_a_plain_venv(tmp_path: Path) -> None:
    """`python3 -m venv V && V/bin/pip install . && V/bin/pulsar-lifecycle package`: the venv's
    setuptools is older than the build requires, so the wheel is built in isolation (pip's cache
    makes the install ~15 s and the package ~7 s here)."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, project / name)
    for name in ("shared", "functions", "function-configs"):
        shutil.copytree(REPO / name, project / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    venv = tmp_path / "V"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(project)], capture_output=True, text=True,
                             timeout=600)
    assert install.returncode == 0, install.stderr[-2000:]
    res = subprocess.run([str(venv / "bin" / "pulsar-lifecycle"), "package", "--project-dir", str(project),
                          "--out-dir", str(tmp_path / "dist")], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "event=wheel_build_isolated" in res.stderr  # the plain venv lacks the build requirements
    assert (tmp_path / "dist" / f"{STEM}.zip").is_file()
    assert len(list((tmp_path / "dist").glob("pulsar_lifecycle-*.whl"))) == 1
