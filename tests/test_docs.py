"""The README and docs/ name only things that exist, and the README stays a ten-minute read.

- Every path of this repository a page names in backticks (`repro/core/steps.py`,
  `configs/experiments/paper.yaml`) exists; every module or attribute named by its dotted name
  (`method.clustering.cluster_agreement`) imports; a file named with a symbol right after it
  (`repro/core/config/checks.py` `NUMERIC_RANGES`) defines that symbol; every relative link resolves.
- The README is at most 220 lines, opens with a table of contents that links each of its
  sections, and its Quick start has exactly two commands, `make demo` and `make test`.
- Every command line of the README's bash blocks parses: `cluster-repro` lines with the CLI's own
  parser (so a renamed flag or subcommand fails here), `make` lines against the Makefile's targets.
  The README's selector code runs in tests/test_example_selector.py.
"""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TOP = tuple(
    f"{p.name}/"
    for p in REPO.iterdir()
    if p.is_dir() and not p.name.startswith((".", "_")) and p.name != "runs"
) + (".ci/",)
MODULES = ("repro.", "method.", "baselines.", "evals.", "reports.", "slurm.")


def _prose(page: Path) -> str:
    """The page without its fenced code blocks (commands and code are checked elsewhere)."""
    blank = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731 (line numbers stay the page's)
    return re.sub(r"^```.*?^```$", blank, page.read_text(encoding="utf-8"), flags=re.S | re.M)


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for name in parts[i:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def _defines(path: Path, symbol: str) -> bool:
    text = path.read_text(encoding="utf-8")
    return (
        re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{symbol}\b|^\s*{symbol}\s*[:=]", text, re.M) is not None
    )


def docs_problems(pages: list[Path]) -> list[str]:
    """Every name or link of `pages` that points at nothing, as `page:line: what`."""
    out: list[str] = []
    for page in pages:
        text = _prose(page)
        rel = page.relative_to(REPO)
        for m in re.finditer(r"`([^`\n]+)`", text):
            s = m.group(1).strip()
            where = f"{rel}:{_line(text, m.start())}"
            if s.startswith(TOP) and not re.search(r"[\s<>*{}$]", s):
                path = s.split("#")[0].split(":")[0].rstrip(".,")
                if not (REPO / path).exists():
                    out.append(f"{where}: `{s}` is not a path of this repository")
            elif s.startswith(MODULES) and re.fullmatch(r"[\w.]+", s) and not _resolves(s):
                out.append(f"{where}: `{s}` does not import")
        for m in re.finditer(r"`((?:[\w.-]+/)+[\w-]+\.py)`\s*`([A-Za-z_]\w*)(?:\(\))?`", text):
            path, symbol = m.groups()
            if path.startswith(TOP) and (REPO / path).is_file() and not _defines(REPO / path, symbol):
                out.append(f"{rel}:{_line(text, m.start())}: `{path}` does not define `{symbol}`")
        for m in re.finditer(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text):
            target = m.group(1)
            if (
                not target.startswith(("http://", "https://", "mailto:"))
                and not (page.parent / target).exists()
            ):
                out.append(f"{rel}:{_line(text, m.start())}: the link ({target}) leads nowhere")
    return out


def test_every_name_and_link_in_the_docs_exists() -> None:
    problems = docs_problems(PAGES)
    assert not problems, "\n".join(problems)


def test_the_check_finds_a_wrong_path_module_symbol_and_link(tmp_path: Path) -> None:
    page = REPO / "docs" / "_docs_check_probe.md"
    page.write_text(
        "`repro/core/nothing_here.py`, `repro.core.steps.no_such_function`, "
        "`repro/core/config/load.py` `NUMERIC_RANGES`, [a page](no-such-page.md); "
        "fine: `repro/core/config/checks.py` `NUMERIC_RANGES`, `repro.core.steps.step_ids`, "
        "[claims](claims.md)\n",
        encoding="utf-8",
    )
    try:
        problems = docs_problems([page])
    finally:
        page.unlink()
    assert len(problems) == 4, problems
    assert any("nothing_here.py" in p for p in problems)
    assert any("no_such_function" in p for p in problems)
    assert any("does not define `NUMERIC_RANGES`" in p and "load.py" in p for p in problems)
    assert any("no-such-page.md" in p for p in problems)


README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_short_and_opens_with_its_contents() -> None:
    lines = README.splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines; move detail to docs/"
    sections = re.findall(r"^## (.+)$", README, re.M)
    contents = next(ln for ln in lines if ln.startswith("**Contents:**"))
    assert lines.index(contents) < README[: README.index("## ")].count("\n") + 8
    for title in sections:
        anchor = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        assert f"(#{anchor})" in README, f"the table of contents does not link '## {title}'"
    quick = re.search(r"^## Quick start\n.*?^```bash\n(.*?)^```$", README, re.S | re.M)
    assert quick
    commands = [ln.split("#")[0].strip() for ln in quick.group(1).splitlines() if ln.strip()]
    assert commands == ["make demo", "make test"]


def _readme_commands() -> list[str]:
    blocks = re.findall(r"^```bash\n(.*?)^```$", README, re.S | re.M)
    lines = [ln.split(" #")[0].strip() for block in blocks for ln in block.splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


@pytest.mark.parametrize("line", [ln for ln in _readme_commands() if ln.startswith("cluster-repro ")])
def test_each_readme_cluster_repro_command_parses(line: str) -> None:
    from repro.cli import build_parser

    argv = shlex.split(line)[1:]
    try:
        build_parser().parse_args(argv)
    except SystemExit as e:  # argparse's way of refusing
        pytest.fail(f"README.md: `{line}` does not parse (exit {e.code})")


def test_each_readme_make_and_pip_command_names_what_exists() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    for line in _readme_commands():
        word = line.split()[0]
        if word == "make":
            assert line.split()[1] in targets, f"README.md: `{line}`: no such Makefile target"
        elif word == "pip":
            assert "-c constraints.txt" in line, f"README.md: `{line}` installs without the pins"
        else:
            assert word == "cluster-repro", f"README.md: `{line}`: a command the tests do not check"
