"""The suite's layers import only downward, and no two modules import each other.

Every `import` and `from ... import` in the library's source counts, including those inside
functions (lazy imports) and under `if TYPE_CHECKING:` (read by the AST, not by running). The
layers, lowest first (docs/architecture.md):

    0  repro.core                 config, types, interfaces, registry, io, distributed, runtime, ...
    1  method | evals | reports   the method, the benchmarks, the reports: siblings, none imports another
    2  baselines                  baseline selectors (they reuse method's gradient code)
    3  repro                      the application: pipeline, trainer, experiments, preflight, demo
    4  slurm                      the SLURM launcher, on top of the application
    5  repro.bench                benchmarks (measurements, not tests)
    6  repro.commands             the subcommands (each module registers its own)
    7  repro.cli, repro.__main__  the command line, on top of everything

A module may import its own unit and any unit of a lower layer. Registries load built-in
implementations by name at run time (importlib), which this test does not see and allows: that is
the plug-in mechanism, the same path a third-party package takes.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("repro", "method", "baselines", "evals", "reports", "slurm")

# (unit, layer): the first unit whose prefix matches a module is its unit.
UNITS = [
    ("repro.core", 0),
    ("method", 1),
    ("evals", 1),
    ("reports", 1),
    ("baselines", 2),
    ("repro.bench", 5),
    ("repro.commands", 6),
    ("repro.cli", 7),
    ("repro.__main__", 8),
    ("slurm", 4),
    ("repro", 3),
]


def unit_of(module: str) -> tuple[str, int]:
    for unit, layer in UNITS:
        if module == unit or module.startswith(unit + "."):
            return unit, layer
    raise AssertionError(f"{module}: in no layer; add its package to UNITS")


def library_modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if any(p.startswith(".") or p == "tasks" or p == "metrics" for p in parts):
                continue  # lm-eval task helpers and metric scripts are data files loaded by path
            mods[".".join(parts)] = path
    return mods


def imports_of(module: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The library modules `module` imports, anywhere in its source."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
        else:
            continue
        for name in names:
            target = known(name)
            if target and target != module:
                out.add(target)
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = library_modules()
    return {m: imports_of(m, p, mods) for m, p in mods.items()}


def test_every_import_goes_down_the_layers(graph: dict[str, set[str]]) -> None:
    bad = []
    for mod, targets in sorted(graph.items()):
        unit, layer = unit_of(mod)
        for t in sorted(targets):
            t_unit, t_layer = unit_of(t)
            if t_unit != unit and t_layer >= layer:
                bad.append(f"{mod} (layer {layer}, {unit}) imports {t} (layer {t_layer}, {t_unit})")
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    """No two modules import each other through any chain (Tarjan's strongly connected
    components: any component of more than one module is a loop)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                loops.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not loops, "import loops: " + "; ".join(" <-> ".join(c) for c in loops)


def test_the_checker_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    """The AST reader itself: a lazy import inside a function and a relative import both count."""
    (tmp_path / "a.py").write_text("def f():\n    from b import x\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "c.py").write_text("from . import d\nif True:\n    import a\n")
    (tmp_path / "pkg" / "d.py").write_text("")
    mods = {
        "a": tmp_path / "a.py",
        "b": tmp_path / "a.py",
        "pkg": tmp_path / "pkg" / "__init__.py",
        "pkg.c": tmp_path / "pkg" / "c.py",
        "pkg.d": tmp_path / "pkg" / "d.py",
    }
    assert imports_of("a", mods["a"], mods) == {"b"}
    assert imports_of("pkg.c", mods["pkg.c"], mods) == {"pkg.d", "a"}


def test_an_upward_import_would_be_reported() -> None:
    """The layer table orders the units as documented: core lowest, cli highest."""
    assert unit_of("repro.core.config") == ("repro.core", 0)
    assert unit_of("repro.pipeline") == ("repro", 3)
    assert unit_of("repro.cli") == ("repro.cli", 7)
    assert unit_of("repro.commands.bench") == ("repro.commands", 6)
    assert unit_of("baselines.less")[1] > unit_of("method.features")[1]
    assert unit_of("slurm.launcher")[1] > unit_of("repro.pipeline")[1]


def test_the_stage_table_is_what_the_pipeline_runs_and_the_job_split_reads():
    """One declared table (repro/core/stages.py): the pipeline's functions, the fingerprinted
    outputs, the eval-keyed stages and the SLURM job's split points all come from it."""
    from repro import pipeline
    from repro.core import fingerprints, rundir, stages

    assert tuple(pipeline.STAGE_FUNCTIONS) == stages.NAMES == pipeline.STAGES
    assert fingerprints.STAGE_OUTPUTS == {s.name: s.outputs for s in stages.TABLE if s.outputs}
    assert rundir.EVAL_STAGES == ("eval", "results")
    # The owner alone prepares (up to the schedule), the group trains, then scores its share.
    assert (stages.SOLO_UNTIL, stages.TRAIN_UNTIL) == ("schedule", "train")
    assert stages.after("train") == ("eval", "results")
    import pytest

    with pytest.raises(ValueError, match="stage 'trian': expected one of model, pool"):
        stages.after("trian")


def test_no_module_outside_the_demo_plugin_names_the_demo() -> None:
    """The demo is a plugin like any user's (repro/demo/, docs/demo.md): no other library module
    holds the string "demo" as a value, so no layer can branch on it. What a stage needs to know of
    a data source or a benchmark it declares (repro/core/sources.py, evals/plugins.py)."""
    found = []
    for module, path in library_modules().items():
        if module == "repro.demo" or module.startswith("repro.demo."):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value == "demo":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, "the demo named outside repro/demo/: " + ", ".join(found)
