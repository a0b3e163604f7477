"""Imports flow one way (STYLE §1): a static walk of every module of pulsar_lifecycle.

The graph holds module-level AND function-level imports of the package's own modules (imports
under `if TYPE_CHECKING:` are left out: they never run). The build fails on
* an import cycle between modules, or between top-level packages;
* an import from a lower layer to a higher one (LAYERS below, longest prefix wins);
* a function-level import of the package's own modules not listed in LAZY_IMPORTS with a reason;
* a pure engine module importing Pulsar I/O (the `pulsar` client or an adapter);
* two classes with the same name in different modules (one name, one meaning);
* in the offline pipeline (pulsar_lifecycle.spark, SPARK_JOBS below): a module whose side its name
  does not say, an executor module (or a pure piece of a job) that imports PySpark or the driver
  side, a job package importing another job's modules, a shared piece importing a job, or a
  command module that imports PySpark when it is loaded.
"""
from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

from support.paths import REPO, TESTS

ROOT = REPO / "shared" / "pulsar_lifecycle"
PKG = "pulsar_lifecycle"

# Lowest first. A module may import modules of its own layer or of a lower one, never a higher one.
LAYERS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("foundation: errors, wire protocol, names, time, durable files, building blocks", (
        "pulsar_lifecycle",  # the package __init__ and any root module not named below
        "pulsar_lifecycle.config",  # converters and settings every feature's config uses
    )),
    ("stores, the helpers around pulsar-client and the Pulsar Functions seam", (
        "pulsar_lifecycle.state",
        "pulsar_lifecycle.pulsar_io",
        "pulsar_lifecycle.runtime.context_api",
        "pulsar_lifecycle.runtime.state_service",
        "pulsar_lifecycle.runtime.client",
        "pulsar_lifecycle.runtime.metrics",
        "pulsar_lifecycle.runtime.classloader",
    )),
    ("engines and their stores, producers", (
        "pulsar_lifecycle.bucket",
        "pulsar_lifecycle.dedup",
        "pulsar_lifecycle.timing",
    )),
    ("two-phase deletion (contract, backends, worker)", ("pulsar_lifecycle.deletion",)),
    ("the bucket writer (intake, release, wiring)", ("pulsar_lifecycle.scheduler",)),
    ("delay-level topics", ("pulsar_lifecycle.delaylevel",)),
    ("function registry, config loading and validation, docs tables", (
        "pulsar_lifecycle.cli.function_registry",
        "pulsar_lifecycle.cli.docs_reference",
        "pulsar_lifecycle.config.function_config",
        "pulsar_lifecycle.config.validate",
    )),
    ("entry points: local runner, the command line (with the demo), packaging, offline Spark jobs", (
        "pulsar_lifecycle.runtime",
        "pulsar_lifecycle.cli",
        "pulsar_lifecycle.packaging",
        "pulsar_lifecycle.spark",
    )),
)

# Pure engines: no Pulsar I/O, no adapters (STYLE §1). Prefixes; EXCEPT wins over them.
ENGINES = (
    "pulsar_lifecycle.bucket",
    "pulsar_lifecycle.dedup.sequence_map",
    "pulsar_lifecycle.deletion.engine",
    "pulsar_lifecycle.deletion.cache",
    "pulsar_lifecycle.deletion.model",
    "pulsar_lifecycle.delaylevel.strategy",
    "pulsar_lifecycle.delaylevel.rule",
)
ENGINES_EXCEPT = ("pulsar_lifecycle.bucket.storage",)  # the snapshot stores are adapters
ADAPTERS = ("pulsar_lifecycle.state", "pulsar_lifecycle.runtime", "pulsar_lifecycle.scheduler",
            "pulsar_lifecycle.dedup.publisher", "pulsar_lifecycle.deletion.storage")

# Function-level imports of the package's own modules allowed, by importing module: why.
_CLI = ("CLI command bodies import their implementation when the command runs, so `--help` and "
        "unrelated commands load neither pulsar-client, pulsar-lite nor PySpark")
LAZY_IMPORTS: Dict[str, str] = {
    "pulsar_lifecycle.cli.main": _CLI,
    "pulsar_lifecycle.cli.deletion_cli": _CLI,
    "pulsar_lifecycle.spark.export.cli": _CLI,
    "pulsar_lifecycle.spark.seed.cli": _CLI,
    "pulsar_lifecycle.spark.verify.cli": _CLI,
    "pulsar_lifecycle.spark.orphans.cli": _CLI,
    "pulsar_lifecycle.cli.inspect_cli": _CLI,
    "pulsar_lifecycle.cli.delayed_cli": _CLI,
    "pulsar_lifecycle.cli.up_cli": _CLI,
    "pulsar_lifecycle.cli.common": "BookKeeper backend: bookkeeper/grpc cost ~0.2 s, loaded only when used",
    "pulsar_lifecycle.state": "BookKeeper backend: bookkeeper/grpc cost ~0.2 s, loaded only when used",
    "pulsar_lifecycle.bucket.storage": "BookKeeper backend: bookkeeper/grpc cost ~0.2 s, loaded only when used",
    "pulsar_lifecycle.scheduler.factory": "two-phase snapshot deletion: the deletion service pulls in requests and "
                                          "the admin client (~0.1 s of every writer start), loaded only when used; "
                                          "the partition machinery (leases, assignment, PartitionedWriter), loaded "
                                          "only by a partitioned writer",
    "pulsar_lifecycle.scheduler.config": "validate --system's topology (config.system, the deletion topics) and "
                                         "pulsarAdminUrl's converter (deletion.config): the deletion package cost "
                                         "every writer start 15-35 ms, loaded only when used",
}

# The offline pipeline: one package per job under pulsar_lifecycle.spark, the pieces they share
# beside them. In a job package a module's name says where it runs: `cli` (the command, loaded
# with the CLI), `driver` / `driver_*` (the Spark driver), `executor` / `executor_*` (Spark tasks'
# Python workers); any other name is a pure piece either side may use.
SPARK = "pulsar_lifecycle.spark"
SPARK_JOBS = ("export", "seed", "verify", "orphans")
SPARK_IMPORTS = ("pyspark", "py4j")


# Class names defined in more than one module on purpose, with the reason.
SAME_NAME_ALLOWED: Dict[str, str] = {}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    function_level: bool


def _modules(root: Path = ROOT) -> Dict[str, Tuple[Path, bool]]:
    mods: Dict[str, Tuple[Path, bool]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        mods[".".join(parts)] = (path, is_pkg)
    return mods


def _resolve(name: str, mods: Dict[str, Tuple[Path, bool]]) -> str:
    while name not in mods and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def import_graph(root: Path = ROOT) -> Tuple[Dict[str, Tuple[Path, bool]], List[Edge]]:
    """Every import of the package's own modules, module-level and function-level."""
    mods = _modules(root)
    edges: List[Edge] = []
    for mod, (path, is_pkg) in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))

        def walk(node: ast.AST, in_function: bool) -> Iterator[Tuple[ast.AST, bool]]:
            for child in ast.iter_child_nodes(node):
                if _is_type_checking(child):
                    continue
                fn = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                yield child, fn
                yield from walk(child, fn)

        for node, fn in walk(tree, False):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == PKG]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod if is_pkg else mod.rsplit(".", 1)[0]
                    for _ in range(node.level - 1):
                        base = base.rsplit(".", 1)[0]
                    source = f"{base}.{node.module}" if node.module else base
                else:
                    source = node.module or ""
                if source.split(".")[0] != PKG:
                    continue
                # `from pkg import sub` imports the submodule; `from mod import name` the module.
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in mods else source for a in node.names]
            for t in targets:
                target = _resolve(t, mods)
                if target != mod:
                    edges.append(Edge(mod, target, node.lineno, fn))  # type: ignore[attr-defined]
    return mods, edges


def layer_of(module: str) -> int:
    best, rank = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    assert rank >= 0, f"{module} is in no layer: add it to LAYERS in tests/unit/test_layers.py"
    return rank


def _matches(module: str, prefixes: Tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def strongly_connected_components(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Tarjan's algorithm (iterative); only components with more than one node."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    result: List[List[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    result.append(sorted(comp))
    return result


def _top(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def test_every_module_has_a_layer() -> None:
    mods, _ = import_graph()
    for mod in mods:
        layer_of(mod)


def test_no_module_cycles() -> None:
    _, edges = import_graph()
    graph: Dict[str, Set[str]] = defaultdict(set)
    for e in edges:
        graph[e.source].add(e.target)
    assert strongly_connected_components(graph) == []


def test_no_package_cycles() -> None:
    _, edges = import_graph()
    graph: Dict[str, Set[str]] = defaultdict(set)
    for e in edges:
        if _top(e.source) != _top(e.target):
            graph[_top(e.source)].add(_top(e.target))
    assert strongly_connected_components(graph) == []


def test_no_upward_imports() -> None:
    _, edges = import_graph()
    upward = [f"{e.source}:{e.line} ({LAYERS[layer_of(e.source)][0].split(':')[0]}) imports {e.target} "
              f"({LAYERS[layer_of(e.target)][0].split(':')[0]})"
              for e in edges if layer_of(e.target) > layer_of(e.source)]
    assert upward == [], "\n".join(upward)


def test_function_level_imports_have_a_reason() -> None:
    _, edges = import_graph()
    unlisted = sorted({f"{e.source}:{e.line} imports {e.target} inside a function" for e in edges
                       if e.function_level and e.source not in LAZY_IMPORTS})
    assert unlisted == [], "\n".join(unlisted)


def test_engines_know_no_pulsar_io() -> None:
    mods, edges = import_graph()
    bad = [f"{e.source}:{e.line} imports adapter {e.target}" for e in edges
           if _matches(e.source, ENGINES) and not _matches(e.source, ENGINES_EXCEPT) and _matches(e.target, ADAPTERS)]
    for mod, (path, _) in mods.items():
        if not _matches(mod, ENGINES) or _matches(mod, ENGINES_EXCEPT):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{mod}:{node.lineno} imports {n}" for n in names if n.split(".")[0] == "pulsar"]  # type: ignore[attr-defined]
    assert bad == [], "\n".join(bad)


def test_one_name_one_class() -> None:
    mods, _ = import_graph()
    where: Dict[str, List[str]] = defaultdict(list)
    for mod, (path, _) in mods.items():
        if "_pb2" in mod:
            continue  # generated protobuf modules
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(mod)
    dupes = {name: ms for name, ms in where.items() if len(ms) > 1 and name not in SAME_NAME_ALLOWED}
    assert dupes == {}, "\n".join(f"{n}: {ms}" for n, ms in dupes.items())


def test_no_test_module_imports_another() -> None:
    tests_dir = TESTS
    bad = []
    for path in sorted(tests_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.relative_to(tests_dir)}:{node.lineno} imports {n}"  # type: ignore[attr-defined]
                    for n in names if n.split(".")[-1].startswith("test_")]
    assert bad == [], "helpers belong in fixture/support modules: " + "; ".join(bad)


def spark_side(module: str) -> str:
    """'cli', 'driver', 'executor' or 'pure' for a module of a Spark job package; 'shared' for the
    pieces beside the job packages."""
    parts = module.split(".")
    if len(parts) < 3 or parts[2] not in SPARK_JOBS:
        return "shared"
    name = parts[3] if len(parts) > 3 else "__init__"  # a job package's __init__ is a pure piece
    for side in ("cli", "driver", "executor"):
        if name == side or name.startswith(side + "_"):
            return side
    return "pure"


def _third_party_imports(path: Path, module_level_only: bool) -> List[Tuple[int, str]]:
    """(line, top-level name) of every absolute import in the file, or only those at module level."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = [n for n in tree.body if not _is_type_checking(n)] if module_level_only else list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def _own_closure(start: str, edges: List[Edge], module_level_only: bool) -> Set[str]:
    graph: Dict[str, Set[str]] = defaultdict(set)
    for e in edges:
        if not (module_level_only and e.function_level):
            graph[e.source].add(e.target)
    seen, todo = {start}, [start]
    while todo:
        for t in graph[todo.pop()]:
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def _spark_job(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "spark" and parts[2] in SPARK_JOBS else ""


def test_spark_job_packages_exist() -> None:
    mods, _ = import_graph()
    jobs = {m.split(".")[2] for m in mods if m.startswith(SPARK + ".") and mods[m][1] and m.count(".") == 2}
    assert jobs == set(SPARK_JOBS), f"job packages under {SPARK}: {sorted(jobs)}; update SPARK_JOBS"


def test_spark_executor_side_imports_no_pyspark_and_no_driver() -> None:
    """Executor modules and a job's pure pieces run where PySpark is not imported: no PySpark in
    them, and nothing they import (at any depth) is a command, a driver module or imports PySpark
    when loaded."""
    mods, edges = import_graph()
    loads_spark = {m for m, (path, _) in mods.items()
                   if any(name in SPARK_IMPORTS for _, name in _third_party_imports(path, True))}
    bad = []
    for mod, (path, _) in mods.items():
        if not _spark_job(mod) or spark_side(mod) not in ("executor", "pure"):
            continue
        bad += [f"{mod}:{line} imports {name}" for line, name in _third_party_imports(path, False)
                if name in SPARK_IMPORTS]
        for dep in sorted(_own_closure(mod, edges, False) - {mod}):
            if _spark_job(dep) and spark_side(dep) in ("cli", "driver"):
                bad.append(f"{mod} ({spark_side(mod)}) imports {dep} ({spark_side(dep)} side)")
            elif dep in loads_spark:
                bad.append(f"{mod} ({spark_side(mod)}) imports {dep}, which imports PySpark when loaded")
    assert bad == [], "\n".join(bad)


def test_spark_jobs_import_each_other_only_through_the_shared_pieces() -> None:
    _, edges = import_graph()
    bad = [f"{e.source}:{e.line} imports {e.target}" for e in edges
           if e.source.startswith(SPARK + ".") and e.target.startswith(SPARK + ".")
           and _spark_job(e.target) and _spark_job(e.source) != _spark_job(e.target)]
    assert bad == [], "a job uses another job's code through a shared piece beside them: " + "; ".join(bad)


def test_spark_driver_side_stays_off_the_executor_side_imports() -> None:
    """Within a job, imports go cli -> driver -> executor -> pure: never back."""
    rank = {"cli": 3, "driver": 2, "executor": 1, "pure": 0}
    _, edges = import_graph()
    bad = [f"{e.source}:{e.line} ({spark_side(e.source)}) imports {e.target} ({spark_side(e.target)})"
           for e in edges if _spark_job(e.source) and _spark_job(e.source) == _spark_job(e.target)
           and rank[spark_side(e.target)] > rank[spark_side(e.source)]]
    assert bad == [], "\n".join(bad)


def test_spark_commands_load_without_pyspark() -> None:
    """`pulsar-lifecycle --help` and the spark group load every command module: none may import
    PySpark (or a module that does) or a driver module when loaded; its job is imported when the
    command runs."""
    mods, edges = import_graph()
    commands = [m for m in mods if _spark_job(m) and spark_side(m) == "cli"] + [f"{SPARK}.cli"]
    bad = []
    for mod in commands:
        for dep in sorted(_own_closure(mod, edges, True)):
            bad += [f"{mod} loads {dep}, which imports {name} (line {line})"
                    for line, name in _third_party_imports(mods[dep][0], True) if name in SPARK_IMPORTS]
            if _spark_job(dep) and spark_side(dep) == "driver":
                bad.append(f"{mod} loads the job {dep} when loaded (import it in the command's body)")
    assert bad == [], "\n".join(bad)


def test_spark_shared_pieces_import_no_job() -> None:
    _, edges = import_graph()
    bad = [f"{e.source}:{e.line} imports {e.target}" for e in edges
           if e.source.startswith(SPARK) and not _spark_job(e.source) and _spark_job(e.target)]
    assert bad == [], "the pieces beside the job packages serve them and import none: " + "; ".join(bad)


# The package root holds only what several packages share; a module with one user lives beside it.
ROOT_MODULES_MAX = 8
# Root modules whose users are outside the package, with the reason.
ROOT_NAMED_BY_USERS: Dict[str, str] = {
    "pulsar_lifecycle.serde": "function configs name `pulsar_lifecycle.serde.BytesSerDe` (serdeClassName)",
}


def test_the_package_root_holds_only_shared_modules() -> None:
    mods, edges = import_graph()
    root = sorted(m for m, (_, is_pkg) in mods.items() if m.count(".") == 1 and not is_pkg)
    assert len(root) <= ROOT_MODULES_MAX, f"{len(root)} modules at the package root (at most {ROOT_MODULES_MAX}): {root}"
    users: Dict[str, Set[str]] = defaultdict(set)
    for e in edges:
        if e.target in root and _top(e.source) != e.target:
            users[e.target].add(_top(e.source))
    lonely = {m: sorted(users[m]) for m in root if len(users[m]) < 2 and m not in ROOT_NAMED_BY_USERS}
    assert lonely == {}, f"root modules with fewer than two user packages (move each beside its user): {lonely}"
