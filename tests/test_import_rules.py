"""The import rules that keep the folders the architecture (read from the source with ast, nothing imported).

- judge/ and trainer/ reach into clawproxy/ only through the shared edges listed in ``SHARED``.
- clawproxy/ (the proxy, the engine, the simulator) never imports judge/ or trainer/; only the
  wiring modules (``WIRING``: the config, the CLI, the supervisor) put them together.
- No module imports another module's private (``_name``) attribute.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SHARED = {
    "clawproxy.store",  # the store is the interface
    "clawproxy.errors",
    "clawproxy.openclaw",  # OpenClaw's wire rules
    "clawproxy.engine.client",  # EngineClient, for our engine and vLLM alike
    "clawproxy.httpjson",  # the one JSON-over-HTTP helper (EngineClient's; the LLM judge's too)
    "clawproxy.config", "clawproxy.fields", "clawproxy.cli_options",  # config types and CLI options
    "clawproxy.degenerate",  # what a looping generation is
    "clawproxy.chat_template",  # the prompt text the engine renders (the OPD teacher renders the same)
    "clawproxy.instruct",  # where an instruction goes in a request: the proxy serves it, the teacher sees it
    "clawproxy.convert",  # checkpoints written atomically, as converted models are
    "clawproxy.engine.model",  # the model files the engine and the trainer both load (dtype, EOS ids)
    "clawproxy.users",  # a user's adapter name: the proxy routes to it, the trainer publishes under it
    "clawproxy.stop",  # a stop a signal handler may set: every child command's SIGTERM
    "clawproxy.simulate.measure",  # the adoption curve file: `clawproxy stats` shows it as the dashboard does
}
WIRING = {"clawproxy/config.py", "clawproxy/cli.py", "clawproxy/supervisor.py"}  # where the parts are wired


def imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) for every import in ``path``, at any depth (lazy imports count)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module, [a.name for a in node.names]))
    return out


def breaches(folders: tuple[str, ...], allowed: Callable[[str, str, list[str]], bool]) -> list[str]:
    return [
        f"{p.relative_to(ROOT)}:{line}: {module} {names or ''}".rstrip()
        for folder in folders
        for p in sorted((ROOT / folder).rglob("*.py"))
        for line, module, names in imports(p)
        if not allowed(str(p.relative_to(ROOT)), module, names)
    ]


def test_judge_and_trainer_use_only_the_shared_edges_of_clawproxy():
    def allowed(_path: str, module: str, names: list[str]) -> bool:
        if module != "clawproxy" and not module.startswith("clawproxy."):
            return True
        return module in SHARED or (module == "clawproxy" and not names)

    assert breaches(("judge", "trainer"), allowed) == []


def test_clawproxy_never_imports_judge_or_trainer():
    def allowed(path: str, module: str, _names: list[str]) -> bool:
        return path in WIRING or module.split(".")[0] not in ("judge", "trainer")

    assert breaches(("clawproxy",), allowed) == []


def test_no_private_names_across_modules():
    def allowed(_path: str, module: str, names: list[str]) -> bool:
        own = module.split(".")[0] in ("clawproxy", "judge", "trainer")
        return not own or not any(n.startswith("_") and not n.startswith("__") for n in names)

    assert breaches(("clawproxy", "judge", "trainer"), allowed) == []


def test_the_rules_see_a_breach(tmp_path, monkeypatch):
    # the checks above must be able to fail: a planted breach is reported with its line
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "x.py").write_text(
        "def f():\n    from clawproxy.proxy.sessions import classify\n    from trainer.policy import _unwrap\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    with pytest.raises(AssertionError, match=r"trainer/x.py:2: clawproxy.proxy.sessions"):
        test_judge_and_trainer_use_only_the_shared_edges_of_clawproxy()
    with pytest.raises(AssertionError, match=r"trainer/x.py:3: trainer.policy \['_unwrap'\]"):
        test_no_private_names_across_modules()


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_cycles(folders: tuple[str, ...]) -> list[list[str]]:
    """The circles among our modules (lazy imports count: a circle hidden in a function is still one)."""
    paths = {module_name(p): p for folder in folders for p in (ROOT / folder).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        # `from pkg import submodule` depends on the submodule, not on the package's __init__
        graph[name] = {target for _, module, names in imports(path)
                       for target in ([f"{module}.{n}" for n in names if f"{module}.{n}" in paths]
                                      or [module])
                       if target in paths and target != name}
    cycles, done = [], set()
    for start in sorted(graph):
        stack, path_ = [(start, iter(sorted(graph[start])))], [start]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path_.pop()
                done.add(node)
            elif child in path_:
                cycle = path_[path_.index(child):]
                if sorted(cycle) not in [sorted(c) for c in cycles]:
                    cycles.append(cycle)
            elif child not in done:
                stack.append((child, iter(sorted(graph[child]))))
                path_.append(child)
    return cycles


def test_no_import_cycles():
    assert import_cycles(("clawproxy", "judge", "trainer")) == []


def test_a_planted_import_cycle_is_found(tmp_path, monkeypatch):
    (tmp_path / "clawproxy").mkdir()
    (tmp_path / "clawproxy" / "a.py").write_text("from clawproxy import b\n")
    (tmp_path / "clawproxy" / "b.py").write_text("def f():\n    from clawproxy.a import g\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert import_cycles(("clawproxy",)) == [["clawproxy.a", "clawproxy.b"]]


def _names_a_kind(node: ast.expr) -> bool:
    from clawproxy.engine_spec import KINDS

    values = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return any(isinstance(v, ast.Constant) and v.value in KINDS for v in values)


def engine_kind_branches(folders: tuple[str, ...]) -> list[str]:
    """Every comparison with an engine's name (``kind == "vllm"``, ``s.engine_kind in ("embedded",)``,
    ``getattr(engine, "kind", "embedded")``) outside clawproxy/engine/: callers ask the EngineSpec."""
    out = []
    for folder in folders:
        for p in sorted((ROOT / folder).rglob("*.py")):
            rel = p.relative_to(ROOT).as_posix()
            if rel.startswith("clawproxy/engine/"):
                continue
            for node in ast.walk(ast.parse(p.read_text(), str(p))):
                if isinstance(node, ast.Compare) and any(map(_names_a_kind, [node.left, *node.comparators])):
                    out.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                      and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value == "kind"):
                    out.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_engine_kind_branch_outside_the_engine():
    # the embedded engine lives behind clawproxy/engine_spec.py alone (docs/architecture.md)
    assert engine_kind_branches(("clawproxy", "judge", "trainer")) == []


def test_an_engine_kind_branch_is_found(tmp_path, monkeypatch):
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "x.py").write_text(
        "def f(cfg, e):\n    return cfg.engine.kind == 'vllm' or getattr(e, 'kind', None) or 'lora' == cfg.kind\n")
    (tmp_path / "clawproxy" / "engine").mkdir(parents=True)
    (tmp_path / "clawproxy" / "engine" / "y.py").write_text("ok = lambda kind: kind == 'embedded'\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert engine_kind_branches(("clawproxy", "trainer")) == [
        "trainer/x.py:2: cfg.engine.kind == 'vllm'", "trainer/x.py:2: getattr(e, 'kind', None)"]
