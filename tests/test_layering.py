"""The import contract of ``fsm/`` and ``providers/``, read from the source with ``ast``.

One test per rule, so that a red test names the rule it broke:

- the engine's layers, lowest first, and a module imports only its own layer or lower ones;
- ``fsm`` never imports ``providers``, ``openai`` or ``httpx`` (the engine does no network I/O);
- ``providers`` reads no error body or Retry-After itself: what an error means is decided
  in ``fsm.catalogue.classify``, which the SDK-exception reader hands the status, headers
  and body to;
- no module imports another module's underscore names (a name used across modules is public);
- no import cycles among the modules (at run time);

and the house rule on size: no module of fsm/, providers/ or fallgate/ over 600 lines
(split one along a real seam rather than trimming it to fit).

Nothing is imported: the files are parsed, so the test also guards modules no other test loads
(the checker's, the CLI's), and a broken import shows up as the rule it breaks, not as an
ImportError. Every import counts, wherever it stands: at the top, inside a function (a lazy
import still runs, so it still ties the two modules), inside ``try``. ``if TYPE_CHECKING:``
imports never run: they count for the layers and for underscore names (a lower layer does not
name a higher one's types either, and a private name is private to type hints too) but not for
cycles, which are a run-time property.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fsm", "providers")
# The installed spelling of the two packages (fallgate.fsm, fallgate.providers).
DIST = "fallgate"

# The engine's layers, lowest first: a module prefix per entry (a package or a module).
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "fsm.kinds",
        "fsm.catalogue",
        "fsm.clock",
        "fsm.errors",
        "fsm.redact",
        "fsm.trace",
        "fsm.printable",
    ),
    ("fsm.policy",),
    ("fsm.health",),
    ("fsm.core",),
    ("fsm.host",),
    ("fsm.diagram", "fsm.replay", "fsm.telemetry"),
    ("fsm.checker",),
)
# The package ``fsm`` itself (fsm/__init__.py) is the engine's facade: it may import every
# layer, and no module of a layer imports it (it stands above the top one).
FACADE = "fsm"
FORBIDDEN_IN_FSM = ("providers", "openai", "httpx")
# What an error means is decided in fsm.catalogue.classify; providers hand it the status,
# headers and body and never read the catalogue's parts themselves.
CATALOGUE_PARTS = ("fsm.catalogue.error_body", "fsm.catalogue.retry_after")

# Underscore names imported across modules, each with the reason it is not public.
UNDERSCORE_ALLOWED: dict[tuple[str, str, str], str] = {}


@attrs.frozen
class Import:
    """One imported module (and, for ``from m import n``, the name) at a place in a file."""

    importer: str
    target: str  # the module's dotted name in the repository (fsm.x, providers.y, openai)
    name: str | None  # the imported name, when it is not a module
    line: int
    type_only: bool  # under ``if TYPE_CHECKING:``
    path: str  # the importer's file, relative to the repository

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def module_names(root: Path = ROOT) -> dict[str, Path]:
    """Every module of fsm/ and providers/ by dotted name (a package is its __init__)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST, type_only: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """Every node below ``node``, with whether it stands under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for sub in child.body:
                yield sub, True
                yield from _walk(sub, True)
            for sub in child.orelse:
                yield sub, type_only
                yield from _walk(sub, type_only)
            continue
        yield child, type_only
        yield from _walk(child, type_only)


def _local(dotted: str) -> str:
    """``fallgate.fsm.x`` -> ``fsm.x``; other names unchanged."""
    head, _, rest = dotted.partition(".")
    if head == DIST and rest.split(".")[0] in PACKAGES:
        return rest
    return dotted


class Graph:
    """The imports of every module, and the names each module binds to an imported module."""

    def __init__(self, root: Path = ROOT) -> None:
        self.root = root
        self.modules = module_names(root)
        self.imports: list[Import] = []
        # (importer, local name) -> module, for ``x._y`` on a module bound by an import
        self.aliases: dict[tuple[str, str], str] = {}
        self.attribute_uses: list[Import] = []
        for module, path in self.modules.items():
            self._read(module, path)

    def _package(self, module: str) -> str:
        is_package = self.modules[module].name == "__init__.py"
        return module if is_package else module.rpartition(".")[0]

    def _resolve(self, module: str, level: int, name: str | None) -> str:
        if level == 0:
            return _local(name or "")
        base = self._package(module).split(".")
        base = base[: len(base) - (level - 1)]
        return ".".join([*base, name] if name else base)

    def _read(self, module: str, path: Path) -> None:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = str(path.relative_to(self.root))
        for node, type_only in _walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    target = _local(alias.name)
                    self.imports.append(Import(module, target, None, node.lineno, type_only, rel))
                    if alias.asname:
                        self.aliases[(module, alias.asname)] = target
            elif isinstance(node, ast.ImportFrom):
                base = self._resolve(module, node.level, node.module)
                for alias in node.names:
                    candidate = f"{base}.{alias.name}"
                    if candidate in self.modules:
                        self.imports.append(
                            Import(module, candidate, None, node.lineno, type_only, rel)
                        )
                        self.aliases[(module, alias.asname or alias.name)] = candidate
                    else:
                        self.imports.append(
                            Import(module, base, alias.name, node.lineno, type_only, rel)
                        )
        for node, type_only in _walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and (module, node.value.id) in self.aliases
            ):
                target = self.aliases[(module, node.value.id)]
                self.attribute_uses.append(
                    Import(module, target, node.attr, node.lineno, type_only, rel)
                )

    def local_imports(self) -> list[Import]:
        """The imports of a module of this repository (not the standard library's, nor openai's)."""
        return [i for i in self.imports if i.target.split(".")[0] in PACKAGES]

    def runtime_edges(self) -> dict[str, set[str]]:
        edges: dict[str, set[str]] = {m: set() for m in self.modules}
        for imp in self.local_imports():
            if not imp.type_only and imp.target in self.modules and imp.target != imp.importer:
                edges[imp.importer].add(imp.target)
        return edges


def layer_of(module: str) -> int | None:
    """The layer index of an ``fsm`` module; above the top for the facade; None outside fsm."""
    if module == FACADE:
        return len(LAYERS)
    for index, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    return None


def layer_violations(graph: Graph) -> list[str]:
    found = []
    for imp in graph.local_imports():
        if imp.importer == FACADE or not imp.importer.startswith("fsm"):
            continue
        mine, theirs = layer_of(imp.importer), layer_of(imp.target)
        if mine is None:
            found.append(f"{imp.where()}: {imp.importer} is in no layer (add it to LAYERS)")
        elif theirs is not None and theirs > mine:
            kind = " (TYPE_CHECKING)" if imp.type_only else ""
            found.append(
                f"{imp.where()}: {imp.importer} (layer {mine}) imports {imp.target} "
                f"(layer {theirs}){kind}"
            )
    return sorted(set(found))


def forbidden_in_fsm(graph: Graph) -> list[str]:
    found = []
    for imp in graph.imports:
        head = imp.target.split(".")[0]
        if imp.importer.split(".")[0] == "fsm" and head in FORBIDDEN_IN_FSM:
            found.append(f"{imp.where()}: {imp.importer} imports {imp.target}")
    return sorted(set(found))


def catalogue_parts_in_providers(graph: Graph) -> list[str]:
    found = []
    for imp in graph.local_imports():
        if imp.importer.startswith("providers") and imp.target in CATALOGUE_PARTS:
            found.append(f"{imp.where()}: {imp.importer} imports {imp.target}")
    return sorted(set(found))


def _private(name: str | None) -> bool:
    return name is not None and name.startswith("_") and not name.startswith("__")


def underscore_imports(graph: Graph) -> list[tuple[tuple[str, str, str], str]]:
    """(importer, module, name) and where, for each underscore name used across modules."""
    found = []
    uses = [i for i in graph.local_imports() if i.name is not None] + graph.attribute_uses
    for imp in uses:
        if _private(imp.name) and imp.target != imp.importer and imp.name is not None:
            found.append(((imp.importer, imp.target, imp.name), imp.where()))
    for imp in graph.local_imports():
        # a private module (``_x.py``) is private to its package
        leaf_package, _, leaf = imp.target.rpartition(".")
        if imp.name is None and _private(leaf) and not imp.importer.startswith(leaf_package):
            found.append(((imp.importer, leaf_package, leaf), imp.where()))
    return sorted(set(found))


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path ``a -> b -> ... -> a``, or None (iterative DFS)."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    for start in sorted(edges):
        if state.get(start):
            continue
        stack: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(edges[start])))]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            for child in children:
                if state.get(child) == 1:
                    path = [n for n, _ in stack]
                    return [*path[path.index(child) :], child]
                if not state.get(child):
                    state[child] = 1
                    stack.append((child, iter(sorted(edges.get(child, ())))))
                    break
            else:
                state[node] = 2
                stack.pop()
    return None


def all_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of modules (to report them all at once)."""
    remaining = {m: set(t) for m, t in edges.items()}
    cycles = []
    while (cycle := find_cycle(remaining)) is not None:
        cycles.append(cycle)
        remaining[cycle[-2]].discard(cycle[-1])  # break it and look again
    return cycles


@functools.cache
def repository() -> Graph:
    return Graph()


MAX_LINES = 600


def oversized(root: Path = ROOT) -> list[str]:
    found = []
    for package in (*PACKAGES, DIST):
        for path in sorted((root / package).rglob("*.py")):
            n = len(path.read_text(encoding="utf-8").splitlines())
            if n > MAX_LINES:
                found.append(f"{path.relative_to(root)}: {n} lines")
    return found


# -- the tests -------------------------------------------------------------------------------


def test_every_fsm_module_imports_only_its_own_layer_or_lower_ones() -> None:
    violations = layer_violations(repository())
    assert not violations, "an fsm module imports a higher layer:\n" + "\n".join(violations)


def test_fsm_never_imports_providers_openai_or_httpx() -> None:
    violations = forbidden_in_fsm(repository())
    assert not violations, "the engine imports network code:\n" + "\n".join(violations)


def test_providers_classify_only_through_the_catalogues_entry_points() -> None:
    violations = catalogue_parts_in_providers(repository())
    assert not violations, (
        "a provider module reads error bodies or Retry-After itself "
        "(hand them to fsm.catalogue.classify):\n" + "\n".join(violations)
    )


def test_no_module_imports_another_modules_underscore_names() -> None:
    found = underscore_imports(repository())
    unexpected = [
        f"{where}: {importer} uses {module}.{name}"
        for (importer, module, name), where in found
        if (importer, module, name) not in UNDERSCORE_ALLOWED
    ]
    assert not unexpected, (
        "a private name is used across modules (make it public, or keep it where it is used):\n"
        + "\n".join(unexpected)
    )
    stale = set(UNDERSCORE_ALLOWED) - {key for key, _ in found}
    assert not stale, f"allow-list entries no longer needed: {sorted(stale)}"


def test_no_import_cycles_among_modules() -> None:
    cycles = all_cycles(repository().runtime_edges())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_reader_sees_what_it_checks() -> None:
    """The rules above pass vacuously if the reader finds nothing: it finds the known imports."""
    graph = repository()
    assert layer_of("fsm.core.turn") == 3 and layer_of("fsm.checker.search") == 6
    edges = graph.runtime_edges()
    assert "fsm.kinds" in edges["fsm.core.machine"]
    assert "fsm.core.machine" in edges["fsm.core.turn"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert all(layer_of(m) is not None for m in graph.modules if m.startswith("fsm"))


def test_no_source_module_is_over_600_lines() -> None:
    found = oversized()
    assert not found, f"modules over {MAX_LINES} lines (split them):\n" + "\n".join(found)
