"""The layout keeps its promises (docs/reference.md, Layout): imports run one way (scripts and tools -> callbacks ->
flux_cp), no module imports itself around a circle, flux_cp's folders import each other in one order, and every
module is one a reader holds in one sitting. Every import is counted, those inside functions too."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# flux_cp's folders (and its top-level modules, "core"), lowest first: a folder imports only those before it
# (flux_cp.opbench, the ops mode, sits above parallel/ and runs/; report/ reads runs and predictions)
ORDER = ["core", "measure", "predict", "runs", "parallel", "train", "opbench", "report", "plan"]
MAX_LINES = 520


def _modules() -> dict[str, Path]:
    mods = {}
    for top in ("flux_cp", "callbacks"):
        for p in (ROOT / top).rglob("*.py"):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = p
    return mods


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Project modules that `name` (at `path`) imports anywhere in its body."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def _graph():
    mods = _modules()
    return {m: _imports(p, m, set(mods)) for m, p in mods.items()}


def _folder(mod: str) -> str:
    parts = mod.split(".")
    if parts[0] != "flux_cp" or len(parts) == 1:
        return parts[0]
    if len(parts) == 2 and parts[1] != "opbench":
        return "core" if not (ROOT / "flux_cp" / parts[1]).is_dir() else parts[1]
    return parts[1]


def test_no_module_imports_itself_around_a_circle():
    g = _graph()
    state, cycles = {}, []

    def visit(m, path):
        state[m] = "open"
        for n in sorted(g[m]):
            if n.startswith(m + "."):  # a package's __init__ re-exporting its own modules is no circle
                continue
            if state.get(n) == "open":
                cycles.append(path[path.index(n):] + [n] if n in path else [m, n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = "done"

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_flux_cp_never_imports_callbacks_and_folders_import_one_way():
    bad = []
    for m, deps in _graph().items():
        for d in deps:
            if m.startswith("flux_cp") and d.startswith("callbacks"):
                bad.append(f"{m} -> {d}")
            elif m.startswith("flux_cp") and d.startswith("flux_cp."):
                a, b = _folder(m), _folder(d)
                if a != b and ORDER.index(b) > ORDER.index(a):
                    bad.append(f"{m} ({a}) -> {d} ({b})")
    assert not bad, "imports against the layering: " + ", ".join(sorted(bad))


@pytest.mark.parametrize("top", ["flux_cp", "callbacks", "scripts", "tools"])
def test_every_module_holds_in_one_sitting(top):
    long = {str(p.relative_to(ROOT)): n for p in (ROOT / top).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split by what they do: {long}"


def test_scripts_hold_only_what_a_user_runs():
    entry_points = {"train_bench.py", "sweep.py", "report.py", "plan.py"}
    extra = {p.name for p in (ROOT / "scripts").iterdir() if p.suffix in (".py", ".sh")} - entry_points
    assert not extra, f"probes and device helpers belong in tools/: {sorted(extra)}"
    readme = (ROOT / "tools" / "README.md").read_text()
    missing = [p.name for p in (ROOT / "tools").iterdir() if p.suffix in (".py", ".sh") and f"`{p.name}`" not in readme]
    assert not missing, f"tools/README.md has no line for {missing}"


def _pages() -> list[Path]:
    """The pages a reader follows links through: README.md, docs/'s pages (its folders' READMEs and dated pages, not
    the raw material beside them: a call's report.md names figures that were not kept), tools/ and the suites'."""
    docs = ROOT / "docs"
    return [ROOT / "README.md", ROOT / "tools" / "README.md", ROOT / "configs" / "suites" / "README.md",
            *docs.glob("*.md"), *docs.glob("*/*.md")]


def _anchors(md: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    out = set()
    for line in md.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_every_relative_link_of_the_pages_resolves():
    bad = []
    for md in _pages():
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", md.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            dest = (md.parent / target) if target else md
            if not dest.exists():
                bad.append(f"{md.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{md.relative_to(ROOT)}: {target}#{anchor} (no such heading)")
    assert not bad, "links that lead nowhere: " + ", ".join(bad)


def test_results_keeps_five_dated_pages_and_indexes_them():
    """docs/results/ holds the newest five dated pages (older ones go to docs/archive/), each in its README."""
    dated = sorted(p.stem for p in (ROOT / "docs" / "results").glob("20*.md"))
    assert len(dated) <= 5, f"move the oldest of {dated} to docs/archive/"
    index = (ROOT / "docs" / "results" / "README.md").read_text()
    assert not [p for p in dated if f"]({p}.md)" not in index]
    archive = (ROOT / "docs" / "archive" / "README.md").read_text()
    assert not [p.stem for p in (ROOT / "docs" / "archive").glob("20*.md") if f"]({p.stem}.md)" not in archive]


def test_the_readme_answers_in_forty_lines_and_explains_its_terms():
    """README.md's answer (everything before Quick start) fits 40 lines, and explains its terms where it first uses
    them (in italics there): a simulated rank, priced collectives, a lease."""
    answer = (ROOT / "README.md").read_text().partition("## Quick start")[0]
    assert len(answer.splitlines()) <= 40
    for word in ("simulated rank", "priced", "lease"):
        first = answer.lower().find(word)
        assert first > 0 and answer[first - 1] == "*", f"{word!r}: used before it is explained, or not at all"
