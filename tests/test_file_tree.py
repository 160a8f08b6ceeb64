"""The file-by-file tree in docs/architecture.md ("## Files") names every module of clawproxy/, judge/,
trainer/ and bench/, and every ``*.py`` it names exists: the one tree is checked against the real one."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("clawproxy", "judge", "trainer", "bench")
_ENTRY = re.compile(r"^( {0,2})(\S+)")  # a name in the first columns; descriptions start further right
_PY = re.compile(r"[\w/]*\w+\.py\b")


def tree_block(text: str) -> str:
    """The fenced block under the "## Files" heading."""
    after = text.split("\n## Files\n", 1)[1]
    return after.split("```", 2)[1]


def sections(block: str) -> dict[str, str]:
    """Each entry's path ('clawproxy/', 'clawproxy/proxy/', 'judge/') -> its text, continuation lines included."""
    out: dict[str, str] = {}
    top = key = ""
    for line in block.splitlines():
        m = _ENTRY.match(line)
        if m and len(m.group(1)) == 0:
            top = key = m.group(2)
        elif m and len(m.group(1)) == 2 and top:
            key = top + m.group(2)
        if key:
            out[key] = out.get(key, "") + " " + line
    return out


def modules(root: Path) -> list[str]:
    """Every module of the four packages, as repository paths, less ``__init__.py`` and templates."""
    found = []
    for top in TOPS:
        for p in (root / top).rglob("*.py"):
            rel = p.relative_to(root)
            if p.name == "__init__.py" or "results" in rel.parts or "__pycache__" in rel.parts:
                continue
            found.append(rel.as_posix())
    return sorted(found)


def missing(block: str, paths: list[str]) -> list[str]:
    """The paths the tree does not name: a top-level module in its package's text, a deeper one in
    its subpackage's entry (or written out with its subpackage anywhere in the package)."""
    secs = sections(block)
    out = []
    for path in paths:
        parts = path.split("/")
        top = parts[0] + "/"
        whole = " ".join(v for k, v in secs.items() if k.startswith(top))
        if len(parts) == 2:
            named = re.search(rf"(?<![\w/]){re.escape(parts[1])}\b", whole)
        else:
            sub = secs.get(top + parts[1] + "/", whole)  # a subpackage without an entry: in its package's text
            named = (re.search(rf"(?<![\w/]){re.escape(parts[-1])}\b", sub) and len(parts) == 3) \
                or f"{parts[1]}/{parts[-1]}" in whole or (len(parts) > 3 and f"{parts[2]}/" in sub)
        if not named:
            out.append(path)
    return out


def stale(block: str, root: Path) -> list[str]:
    """The ``*.py`` names in the tree's package entries that no file of that package carries."""
    out = []
    for key, text in sections(block).items():
        top = key.split("/")[0]
        if top not in TOPS:
            continue
        names = {p.name for p in (root / top).rglob("*.py")} | {
            p.relative_to(root / top).as_posix() for p in (root / top).rglob("*.py")}
        for name in _PY.findall(text):
            bare = name.split("/")[-1]
            if name not in names and bare not in names and not name.startswith(("tests/", "bench/")):
                out.append(f"{key}: {name}")
    return sorted(set(out))


def test_the_tree_names_every_module_and_no_module_that_is_gone():
    block = tree_block((ROOT / "docs" / "architecture.md").read_text())
    assert missing(block, modules(ROOT)) == [], "add these to the tree in docs/architecture.md"
    assert stale(block, ROOT) == [], "these are named in docs/architecture.md's tree but do not exist"


def test_the_check_fails_on_a_tree_that_forgets_a_module_or_names_a_deleted_one(tmp_path):
    for f in ("clawproxy/cli.py", "clawproxy/proxy/app.py", "clawproxy/proxy/ui/views.py", "judge/eval/fit.py"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("")
    for top in TOPS:
        (tmp_path / top).mkdir(exist_ok=True)
    block = ("clawproxy/\n  cli.py            the command\n  proxy/            app.py (forwarding), gone.py,\n"
             "                    ui/ (the dashboard)\njudge/              cli.py\n")
    assert missing(block, modules(tmp_path)) == ["judge/eval/fit.py"]
    assert stale(block, tmp_path) == ["clawproxy/proxy/: gone.py", "judge/: cli.py"]
