"""The package's layout: imports go down the floors, never round in a circle, and never into another
package's private module (ARCHITECTURE.md). Read from the source, function-level imports included: an
import inside a function that would close a circle is a circle all the same."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "jaxphylo"

# The floors, bottom up. A module may import from lower floors and from its own top-level package; packages
# that share a floor do not import one another.
FLOORS = (
    ("_errors", "_examples"),
    ("runtime", "data"),
    ("tree",),
    ("io",),
    ("models",),
    ("likelihood",),
    ("ml", "inference", "coevolution"),
    ("cli", "__init__"),
)
FLOOR = {name: level for level, names in enumerate(FLOORS) for name in names}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _type_checking_only(node, parents) -> bool:
    return any(isinstance(p, ast.If) and "TYPE_CHECKING" in ast.unparse(p.test) for p in parents)


def _imports(module: str) -> list[tuple[str, int]]:
    """`(imported jaxphylo module, line)` for every import statement of `module` (a `from X import name`
    names the submodule `X.name` when there is one, else `X`)."""
    tree = ast.parse(MODULES[module].read_text())
    parents: dict = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    found = []
    for node in ast.walk(tree):
        chain, up = [], parents.get(node)
        while up is not None:
            chain.append(up)
            up = parents.get(up)
        if _type_checking_only(node, chain):
            continue
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "jaxphylo"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if _is_package(module) else module.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "jaxphylo":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub if sub in MODULES else target, node.lineno))
    return [(t, line) for t, line in found if t in MODULES and t != module]


GRAPH = {module: _imports(module) for module in MODULES}


def _top(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def test_no_import_circles():
    """Depth-first search for a cycle among modules; the first one found is named in full."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module):
        state[module] = 1
        stack.append(module)
        for target, _ in GRAPH[module]:
            if state.get(target) == 1:
                cycle = stack[stack.index(target):] + [target]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(MODULES):
        if module not in state:
            visit(module)


def test_imports_go_down_the_floors():
    upward = []
    for module, targets in GRAPH.items():
        here = _top(module)
        for target, line in targets:
            there = _top(target)
            if there == here or target == "jaxphylo":
                continue
            if FLOOR[there] >= FLOOR[here]:
                upward.append(f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} imports {target} "
                              f"(floor {FLOOR[there]} from floor {FLOOR[here]})")
    assert not upward, "\n".join(upward)


def test_no_module_imports_another_packages_private_module():
    """`from ..pkg._module import x` from outside `pkg` reaches past its public face (`pkg/__init__.py`).
    Inside `pkg` (its subpackages included) its private modules are its own; the ground floor's
    `jaxphylo._errors` and `jaxphylo._examples` are everyone's."""
    reaching = []
    for module, targets in GRAPH.items():
        own = module if _is_package(module) else module.rpartition(".")[0]
        for target, line in targets:
            parent, _, leaf = target.rpartition(".")
            inside = own == parent or own.startswith(parent + ".")
            if leaf.startswith("_") and not inside and parent != "jaxphylo":
                reaching.append(f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} imports {target}")
    assert not reaching, "\n".join(reaching)


def test_the_floors_name_every_package():
    tops = {_top(m) for m in MODULES}
    assert tops <= set(FLOOR), sorted(tops - set(FLOOR))


SCRIPTS = [p for folder in ("tests", "benchmarks", "validation", "notebooks") for p in
           (PACKAGE.parent / folder).rglob("*.py")]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_tests_and_benchmarks_use_public_names(script):
    """Tests, benchmarks and validations import what a user can: no `jaxphylo` module path with a private part."""
    private = []
    for node in ast.walk(ast.parse(script.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
        private += [f"line {node.lineno}: {n}" for n in names
                    if n.split(".")[0] == "jaxphylo" and any(part.startswith("_") for part in n.split(".")[1:])]
    assert not private, private


def test_importing_jaxphylo_starts_no_backend():
    """Nothing runs on a device at import (a module-level `jnp` value would): `jaxphylo --distributed` must call
    `jax.distributed.initialize()` before any backend starts."""
    import subprocess
    import sys

    code = "import jax._src.xla_bridge as xb, jaxphylo, jaxphylo.cli; print(bool(xb._backends))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "False", run.stdout + run.stderr
