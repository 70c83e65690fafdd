"""Every name has one home: it is imported from the module that defines it (docs/architecture.md).

Read with Python's `ast`, like tests/test_layers.py:

- every `from M import n` of a library module M, in the library, the tests and the examples,
  names a module, class, function or variable that M itself defines (or a submodule of M), and
  the library reads no `m.n` of a module m that only imports n;
- no library module imports a name it does not use (a re-export), and no `__all__` lists a name
  its module imports;
- a package's `__init__.py` holds its docstring and nothing else (`__version__` aside).

The one exception is evals/tasks/utils.py: lm-eval resolves a task YAML's `!function utils.<name>`
to the file beside the YAML, so that file names functions that live elsewhere.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("repro", "method", "baselines", "evals", "reports", "slurm")
IMPORTERS = (*PACKAGES, "tests", "examples")
BY_PATH = {"evals.tasks.utils"}  # lm-eval loads it by path: it must name the task functions


def _rel(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else Path(path.name)


def module_name(path: Path) -> str:
    parts = list(_rel(path).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def library() -> dict[str, ast.Module]:
    return {
        module_name(p): ast.parse(p.read_text(encoding="utf-8"), str(p))
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
    }


def _top_level(body: list[ast.stmt]):
    """The module's statements, those under a top-level if/try/with included."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for field in ("body", "orelse", "finalbody"):
                yield from _top_level(getattr(node, field, None) or [])
            for handler in getattr(node, "handlers", None) or []:
                yield from _top_level(handler.body)


def defined(tree: ast.Module) -> set[str]:
    """The names a module defines itself: functions, classes and assigned variables."""
    out: set[str] = set()
    for node in _top_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


def _absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    anchor = importer if is_package else importer.rpartition(".")[0]
    for _ in range(node.level - 1):
        anchor = anchor.rpartition(".")[0]
    return f"{anchor}.{node.module}" if node.module else anchor


def library_bound(tree: ast.Module, mods: dict[str, ast.Module]) -> set[str]:
    """The names a module binds by importing them from a library module (not submodules)."""
    return {
        a.asname or a.name
        for node in _top_level(tree.body)
        if isinstance(node, ast.ImportFrom) and node.module in mods
        for a in node.names
        if f"{node.module}.{a.name}" not in mods
    }


def imports_through(
    path: Path, mods: dict[str, ast.Module], homes: dict[str, set[str]], attributes: bool = False
) -> list[str]:
    """`path:line: M.n` for every name imported from a library module that does not define it;
    with `attributes`, also every `m.n` read from a library module `m` that only imports n (tests
    may read or patch a name where the code under test looks it up)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    importer = module_name(path)
    out = []
    aliases: dict[str, str] = {}  # local name -> the library module it is
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname: a.name for a in node.names if a.asname and a.name in mods}
        if not isinstance(node, ast.ImportFrom):
            continue
        source = _absolute(node, importer, path.name == "__init__.py")
        if source not in mods:
            continue
        for alias in node.names:
            if f"{source}.{alias.name}" in mods:
                aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
            elif alias.name not in homes[source]:
                out.append(f"{_rel(path)}:{node.lineno}: {source}.{alias.name}")
    if attributes:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                mod = aliases.get(node.value.id)
                if mod and node.attr not in homes[mod] and node.attr in library_bound(mods[mod], mods):
                    out.append(f"{_rel(path)}:{node.lineno}: {node.value.id}.{node.attr} ({mod})")
    return out


def _used(tree: ast.Module) -> set[str]:
    """Names the module's code reads (string annotations included), `__all__` left out."""
    body = [
        n
        for n in tree.body
        if not (isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets))
    ]
    out: set[str] = set()
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 200:
            try:  # a quoted annotation such as "list[Problem]"
                out |= {n.id for n in ast.walk(ast.parse(node.value, mode="eval")) if isinstance(n, ast.Name)}
            except SyntaxError:
                pass
    return out


def passed_on(name: str, tree: ast.Module, mods: dict[str, ast.Module]) -> list[str]:
    """What module `name` imports only to pass on: imported names it never uses (a submodule
    imported for what importing it does is not a name passed on), and `__all__` entries it does
    not define."""
    used, own = _used(tree), defined(tree)
    out = []
    for node in _top_level(tree.body):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            source = node.module or ""
            for alias in node.names:
                bound = alias.asname or alias.name
                if bound not in used and f"{source}.{alias.name}" not in mods:
                    out.append(f"{name}:{node.lineno}: imports {alias.name} and does not use it")
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            for elt in getattr(node.value, "elts", []):
                if isinstance(elt, ast.Constant) and elt.value not in own:
                    out.append(f"{name}:{node.lineno}: __all__ lists {elt.value}, defined elsewhere")
    return out


def init_names(where: str, tree: ast.Module) -> list[str]:
    """What a package's `__init__.py` holds beyond its docstring and `__version__`."""
    out = []
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["__version__"]:
            continue
        out.append(f"{where}:{node.lineno}: {type(node).__name__}")
    return out


def test_every_name_is_imported_from_its_home() -> None:
    mods = library()
    homes = {m: defined(t) for m, t in mods.items()}
    files = [p for d in IMPORTERS for p in sorted((ROOT / d).rglob("*.py"))]
    in_library = {p: _rel(p).parts[0] in PACKAGES for p in files}
    bad = [line for p in files for line in imports_through(p, mods, homes, in_library[p])]
    assert not bad, "imported from a module that does not define them:\n" + "\n".join(bad)


def test_no_module_passes_on_what_it_imports() -> None:
    mods = library()
    bad = [line for m, t in mods.items() if m not in BY_PATH for line in passed_on(m, t, mods)]
    assert not bad, "re-exports:\n" + "\n".join(bad)


def test_package_inits_hold_only_their_docstring() -> None:
    bad = [
        line
        for pkg in PACKAGES
        for init in sorted((ROOT / pkg).rglob("__init__.py"))
        for line in init_names(str(_rel(init)), ast.parse(init.read_text(encoding="utf-8")))
    ]
    assert not bad, "package __init__.py files with code:\n" + "\n".join(bad)


def test_the_checks_catch_a_re_export_and_an_import_through_it(tmp_path: Path) -> None:
    """The readers themselves, on a made-up pair: b passes on a's name, c imports it through b."""
    a = ast.parse("def f():\n    pass\n")
    b = ast.parse("from a import f\nfrom a import g\n__all__ = ['f', 'h']\n\ndef h():\n    return g\n")
    assert passed_on("b", b, {"a": a}) == [
        "b:1: imports f and does not use it",
        "b:3: __all__ lists f, defined elsewhere",
    ]
    assert defined(b) == {"__all__", "h"}
    assert init_names("pkg/__init__.py", ast.parse('"""doc"""\n__version__ = "1"\nfrom a import f\n')) == [
        "pkg/__init__.py:3: ImportFrom"
    ]
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from repro.core.data import collate\nfrom repro.core.tokens import collate as c\n"
        "from repro.core import data as D\n\nD.load_pool, D.DataError\n"
    )
    mods = library()
    found = imports_through(probe, mods, {m: defined(t) for m, t in mods.items()}, attributes=True)
    assert found == ["probe.py:1: repro.core.data.collate", "probe.py:5: D.DataError (repro.core.data)"]
