"""Imports only point down: every module of the package belongs to a layer, imports nothing from a layer
above its own, and the module import graph has no cycle.

Imports are read with ``ast``, so lazy imports inside functions count as much as those at the top of a
module (they run sooner or later, and a lazy import is still a dependency). Blocks under
``if TYPE_CHECKING:`` are skipped: they never run. ``from pkg import name`` counts as importing the package's
``__init__`` (and its layer) unless ``name`` is a submodule. Nothing is exempt from the cycle check, edges
from a submodule into its own package's ``__init__`` included.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from conftest import REPO

PACKAGE = "yolo9kit"

# Bottom to top. A module may import from its own layer and the layers below it. The longest matching
# prefix decides a module's layer; the bare package name matches only the top-level __init__.
LAYERS: list[tuple[str, list[str]]] = [
    # helpers with no kit dependencies: environment and devices, box formats, crash-safe file writes and byte
    # counts for people
    ("base", ["yolo9kit.env", "yolo9kit.boxes", "yolo9kit.files"]),
    # settings as plain data
    ("settings", ["yolo9kit.config"]),
    # the networks (with their weights files: the kit's checkpoints, official ones, the shipped model), the
    # datasets and the tensor maths both sides share
    ("models and data", ["yolo9kit.models", "yolo9kit.data", "yolo9kit.metrics", "yolo9kit.assigner"]),
    # what training and inference produce, and the figures of those result types, built outside pyplot
    ("loss and results", ["yolo9kit.loss", "yolo9kit.detections", "yolo9kit.figure"]),
    # validation of a model on a dataset
    ("evaluation", ["yolo9kit.validate"]),
    # one training step (its micro-steps, the optimizer step, the EMA, the out-of-memory back-off), its
    # optimizer groups and schedules, and the errors and stops of the loop around it
    ("training step", ["yolo9kit.train.step", "yolo9kit.train.optim", "yolo9kit.train.guards"]),
    # the memory tools: they describe, estimate and measure that step
    ("memory tools", ["yolo9kit.memory"]),
    # the training run: fit, the epoch loop, checkpoints, DDP (an automatic batch is planned with the memory
    # tools before the first step)
    ("training run", ["yolo9kit.train"]),
    # prediction on images and videos: nothing below imports it
    ("inference", ["yolo9kit.prediction"]),
    # figures of training runs and memory, in the plots module that also re-exports every figure below
    ("plots of training and memory", ["yolo9kit.plots"]),
    # notebook widgets
    ("widgets", ["yolo9kit.widgets"]),
    # the command line and the package's public face: nothing of the kit may depend on them
    ("front ends", ["yolo9kit.cli", "yolo9kit", "yolo9kit.__main__"]),
    # the extras (tuning, loggers, the runs table, the GPU self-check, ONNX export, claims): the core never imports
    # them (test_the_core_never_imports_the_extras), it loads their entry points (yolo9kit.env.load_extra)
    ("extras", ["yolo9kit.extras"]),
]
EXTRAS = "yolo9kit.extras"


def _module_files() -> dict[str, Path]:
    """Dotted module name -> file, a package named by its ``__init__.py``."""
    out = {}
    for path in sorted((REPO / PACKAGE).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _module_files()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST, eager_only: bool = False):
    """Every Import / ImportFrom under ``node``: function bodies included unless ``eager_only`` (then only what
    runs when the module is imported), ``if TYPE_CHECKING:`` bodies never."""
    for child in ast.iter_child_nodes(node):
        if eager_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for sub in child.orelse:
                yield from _import_nodes(ast.Module(body=[sub], type_ignores=[]), eager_only)
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        yield from _import_nodes(child, eager_only)


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The kit modules an import statement names. ``from pkg import name`` names ``pkg.name`` when that is a
    module, else ``pkg`` itself (its ``__init__``). Parent packages Python runs on the way are not listed."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: resolve against the importing module's package
            package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
            package = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
            base = f"{package}.{base}" if base else package
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    return [n for n in dict.fromkeys(names) if n == PACKAGE or n.startswith(PACKAGE + ".")]


def imports_in(module: str, source: str, eager_only: bool = False) -> list[tuple[int, str]]:
    """[(line, imported kit module)] for every kit import in ``source``, the module itself left out."""
    tree = ast.parse(source)
    return [(node.lineno, target) for node in _import_nodes(tree, eager_only)
            for target in _targets(module, node) if target != module]


def _imports() -> dict[str, list[tuple[int, str]]]:
    """Module -> its kit imports, lazy ones included."""
    return {module: imports_in(module, path.read_text()) for module, path in MODULES.items()}


def layer_of(module: str) -> int | None:
    """Index into LAYERS of the longest prefix matching ``module`` (None when nothing matches)."""
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or (prefix != PACKAGE and module.startswith(prefix + "."))
            if matches and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


def test_every_module_has_a_layer():
    missing = [m for m in MODULES if layer_of(m) is None]
    assert not missing, f"modules in no layer (add them to LAYERS in {Path(__file__).name}): {missing}"
    stale = [p for _, prefixes in LAYERS for p in prefixes if p not in MODULES]
    assert not stale, f"LAYERS names modules that do not exist: {stale}"


def test_the_parser_sees_lazy_imports_and_skips_type_checking():
    source = """from yolo9kit.models import layers, create_model
import yolo9kit.boxes as B
if TYPE_CHECKING:
    from yolo9kit.train.fit import fit
else:
    from yolo9kit.metrics import COCO80_TO_COCO91
def f():
    from yolo9kit.loss import DetectionLoss
"""
    found = imports_in("yolo9kit.config", source)
    assert found == [(1, "yolo9kit.models.layers"), (1, "yolo9kit.models"), (2, "yolo9kit.boxes"),
                     (6, "yolo9kit.metrics"), (8, "yolo9kit.loss")]
    assert [t for _, t in imports_in("yolo9kit.config", source, eager_only=True)] == [
        "yolo9kit.models.layers", "yolo9kit.models", "yolo9kit.boxes", "yolo9kit.metrics"]


def test_imports_point_down():
    violations = []
    for module, imports in _imports().items():
        own = layer_of(module)
        for line, target in imports:
            theirs = layer_of(target)
            if own is not None and theirs is not None and theirs > own:
                violations.append(f"{MODULES[module].relative_to(REPO)}:{line} {module} ({LAYERS[own][0]}) imports "
                                  f"{target} ({LAYERS[theirs][0]})")
    assert not violations, "imports that point up a layer:\n" + "\n".join(violations)


def test_package_inits_do_not_lift_their_submodules():
    """Importing ``pkg.sub`` runs ``pkg/__init__.py`` first, so what that ``__init__`` imports at import time
    is imported by every user of the lowest submodule too: it must stay at or below that submodule's layer. The
    top-level ``yolo9kit/__init__.py`` is the exception: it imports the core's public names, the whole core."""
    violations = []
    for package, path in MODULES.items():
        if path.name != "__init__.py" or package == PACKAGE:
            continue
        lowest = min(layer_of(m) for m in MODULES if m.startswith(package + ".") or m == package)
        for line, target in imports_in(package, path.read_text(), eager_only=True):
            if layer_of(target) > lowest:
                violations.append(f"{path.relative_to(REPO)}:{line} imports {target} ({LAYERS[layer_of(target)][0]}) "
                                  f"when loaded for a submodule of layer {LAYERS[lowest][0]}")
    assert not violations, "\n".join(violations)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _cycle_through(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest closed path from the component's first module back to itself, for the error message."""
    start, members = component[0], set(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in parents:
                    parents[w] = v
                    following.append(w)
        frontier = following
    return component


def test_no_import_cycles():
    graph: dict[str, set[str]] = defaultdict(set)
    for module, imports in _imports().items():
        graph[module].update(target for _, target in imports)
    cycles = [" -> ".join(_cycle_through(graph, c)) + f"  (modules {c})" for c in _cycles(graph)]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_core_never_imports_the_extras():
    """No module outside yolo9kit/extras/ imports it, in a function or by a string naming one of its modules
    (importlib): the core reaches the extras only through the entry points of pyproject.toml."""
    found = []
    for module, path in MODULES.items():
        if module == EXTRAS or module.startswith(EXTRAS + "."):
            continue
        source = path.read_text()
        found += [f"{path.relative_to(REPO)}:{line} imports {target}" for line, target in imports_in(module, source)
                  if target == EXTRAS or target.startswith(EXTRAS + ".")]
        found += [f"{path.relative_to(REPO)}:{node.lineno} names {node.value!r}" for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and re.fullmatch(re.escape(EXTRAS) + r"(\.\w+)*(:\w+)?", node.value.strip())]
    assert not found, "the core reaches into yolo9kit.extras:\n" + "\n".join(found)
