"""The layering holds: every import in air/ and air_mlgym/ goes to the same layer or one below (never up), and no
module imports itself back through others. Anyone can check it: `python3 -m pytest tests/test_layers.py`.

Layers, bottom up (DESIGN.md): foundations (errors, paths, validation, display, files, failures), the sandbox
runtime, the image builder and the policies (three that know nothing of each other), tasks, episodes, the
integrations on top of episodes (verifiers, services, exports, reports), the CLI. Imports under
`if TYPE_CHECKING:` count as the others do: an annotation that names a module above, or one that imports this one
back, is the same knot in the design even where Python never runs it (issue 65).

Inside the tasks layer each task family is a package of its own (FAMILIES): no family imports another, and the rest
of air/tasks reaches a family only through the one module its job needs (DOORS): scoring.py, a thin dispatcher, its
`contract`; registry.py its `loader`; task_images.py Harbor's `installs`. What a family's contract shares with the
others sits below them all, in air/tasks/scoring_cell.py.

Inside the sandbox layer each backend (each engine `PoolConfig.backend` names: docker, kubernetes, enroot) is a
package of its own, air/sandbox/<backend>/, over the parts every backend shares at the top of air/sandbox (the
interface, the warden and its link, the base sandbox and pool, GPUs, the spec): no backend imports another,
and the shared parts import no backend (but the package's door, `air.sandbox`, and SHARED_DOORS).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = [  # (module prefix, layer); the longest matching prefix wins
    ("air.errors", 0), ("air.paths", 0), ("air.validation", 0), ("air.display", 0), ("air", 0),
    ("air.sandbox", 1), ("air.images", 1), ("air.policies", 1), ("air.model", 1),
    ("air.tasks", 2),
    ("air.episode", 3),
    ("air.services", 4), ("air.audit", 4), ("air.export", 4), ("air.report", 4), ("air_mlgym", 4),
    ("air.cli", 5),
]


FAMILIES = ("air.tasks.air_format", "air.tasks.harbor", "air.tasks.mlgym")
DOORS = {"air.tasks.scoring": "contract", "air.tasks.registry": "loader", "air.tasks.task_images": "installs"}
"""The modules of air/tasks outside the families that may import one, and the only module of a family each may."""


SHARED_DOORS = {"air.sandbox.spec": {"air.sandbox.kubernetes.config"}}
"""The shared modules that may import a backend's module, and which: PoolConfig carries the kubernetes backend's
config (a pydantic model of its own, which imports nothing of the backend)."""


def backends() -> tuple[str, ...]:
    """The sandbox backends, as PoolConfig names them: each is the package air.sandbox.<name>."""
    from typing import get_args

    from air.sandbox.spec import PoolConfig

    return tuple(f"air.sandbox.{name}" for name in get_args(PoolConfig.model_fields["backend"].annotation))


def backend(module: str) -> str | None:
    return next((b for b in backends() if module == b or module.startswith(b + ".")), None)


def family(module: str) -> str | None:
    return next((f for f in FAMILIES if module == f or module.startswith(f + ".")), None)


def layer(module: str) -> int:
    best = max((p for p, _ in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return dict(LAYERS)[best]


def modules() -> dict[str, Path]:
    found = {}
    for top in ("air", "air_mlgym"):
        for path in (ROOT / top).rglob("*.py"):
            if "scripts" in path.parts:  # files sent into sandboxes, not imported
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The project's modules this file imports (names that are modules, or the module a name comes from)."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):  # every import, those under `if TYPE_CHECKING:` included
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                    for a in node.names}
    return {m for m in out if m.split(".")[0] in ("air", "air_mlgym") and m in known}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) for name, path in found.items()}


def test_no_import_goes_up_a_layer():
    upward = [f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
              for a, targets in graph().items() for b in targets if layer(b) > layer(a)]
    assert not upward, upward


def test_no_module_imports_itself_back():
    edges = graph()
    # A package's __init__ re-exporting its own modules is not a cycle of the code: leave those edges out.
    edges = {a: {b for b in bs if not b.startswith(a + ".")} for a, bs in edges.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(start: str) -> None:
        stack = [(start, iter(sorted(edges[start])))]
        path = [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                cycles.append(path[path.index(child):] + [child])
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(sorted(edges[child]))))
                path.append(child)

    for module in sorted(edges):
        if module not in state:
            visit(module)
    assert not cycles, cycles


def test_each_task_family_stands_apart():
    """No family imports another (type-only imports too); air/tasks reaches a family only through its DOORS."""
    crossings = []
    for a, targets in graph().items():
        for b in targets:
            if family(b) is None or family(a) == family(b):
                continue
            if family(a) is not None:
                crossings.append(f"{a} imports {b}: a family imports another")
            elif a.startswith("air.tasks.") and (a not in DOORS or b != f"{family(b)}.{DOORS[a]}"):
                crossings.append(f"{a} imports {b}: air/tasks reaches a family only through {DOORS}")
    assert not crossings, crossings
    assert set(modules()) >= {f"{f}.{m}" for f in FAMILIES for m in ("loader", "contract")}


def test_each_backend_is_a_package_of_its_own():
    """Every engine PoolConfig names is a package air.sandbox.<name> whose pool module names its pool (POOL, the
    class `SandboxPool(config)` makes for that backend)."""
    import importlib

    found = modules()
    loose = [p for p in backends() if p not in found or found[p].name != "__init__.py"]
    assert not loose, f"not a package of its own: {loose}"
    from air.sandbox.base_pool import SandboxPool

    for package in backends():
        pool = importlib.import_module(f"{package}.pool").POOL
        assert issubclass(pool, SandboxPool), pool


def backend_crossings(edges: dict[str, set[str]]) -> list[str]:
    """Each import of `edges` that goes from a backend to another, or from a shared part of the sandbox to a backend
    (but through the package's door, `air.sandbox`, and SHARED_DOORS)."""
    crossings = []
    for a, targets in edges.items():
        if not a.startswith("air.sandbox."):
            continue
        for b in targets:
            if backend(b) is None or backend(b) == backend(a):
                continue
            if backend(a) is not None:
                crossings.append(f"{a} imports {b}: a backend imports another")
            elif b not in SHARED_DOORS.get(a, ()):
                crossings.append(f"{a} imports {b}: a shared module imports a backend")
    return crossings


def test_no_backend_imports_another():
    """A backend imports its own modules and the shared ones (type-only imports too), never another backend's; the
    shared parts import no backend."""
    assert not backend_crossings(graph()), backend_crossings(graph())


def test_every_contract_a_spec_names_has_its_familys_scorer():
    from typing import get_args

    from air.tasks.scoring import CONTRACTS
    from air.tasks.spec import Contract

    assert set(CONTRACTS) == set(get_args(Contract))
    assert {family(CONTRACTS[name].score.__module__) for name in CONTRACTS} == set(FAMILIES)


def test_an_import_for_type_checking_only_is_counted(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from air.cli.app import app\n")
    assert imports(module, {"air.cli.app"}) == {"air.cli.app"}


def test_the_check_can_fail():
    """The layer table knows every package, and a made-up upward import is seen as one."""
    assert layer("air.cli.main") > layer("air.episode.loop") > layer("air.tasks.spec") > layer("air.sandbox.base_pool")
    assert set(modules()) >= {"air.sandbox.warden.server", "air.cli.main", "air_mlgym.taskset"}
    made_up = {"air.sandbox.kubernetes.pool": {"air.sandbox.docker.container"},
               "air.sandbox.session": {"air.sandbox.enroot.sandbox"}, "air.sandbox.docker.pool": {"air.sandbox.spec"}}
    assert len(backend_crossings(made_up)) == 2
