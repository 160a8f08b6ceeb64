"""One definition of each shared concept: a second copy fails here, not in review."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = [p for d in ("clawproxy", "judge", "trainer", "bench", "tests") for p in (ROOT / d).rglob("*.py")]


def where(pattern: str) -> list[str]:
    rx = re.compile(pattern)
    return sorted(str(p.relative_to(ROOT)) for p in CODE if rx.search(p.read_text()))


def test_one_dtype_map():
    assert where(r'"bfloat16":\s*torch\.bfloat16') == ["clawproxy/engine/model.py"]


def test_one_eos_rule():
    assert where(r"def _?eos(_token)?_ids\(") == ["clawproxy/engine/model.py"]


def test_one_way_to_get_a_test_port():
    # a port picked, released and used later is a race: tests and benchmarks hold it (tests/net.py)
    assert [p for p in where(r"return \w+\.getsockname\(\)\[1\]") if p.startswith(("tests/", "bench/"))] == []


def test_one_engine_url_default_and_v1_strip():
    assert where(r'f"http://\{cfg\.engine\.host\}:\{cfg\.engine\.port\}"') == []
    # every OpenAI base URL goes through httpjson.strip_v1; a client that appends to the URL it was
    # given ("/chat/completions" after a base that must end in /v1) is a copy too
    v1 = r'(endswith|removesuffix)\("/v1"\)|len\("/v1"\)|rstrip\("/"\) \+ "/(chat|completions|models)'
    assert product(where(v1)) == ["clawproxy/httpjson.py"]
    assert where(r"def \w*strip_v1\(|def v1\(") == ["clawproxy/httpjson.py"]


def test_one_config_loader_for_the_commands():
    assert where(r"from clawproxy\.cli import build_config") == []
    assert where(r"def _config\(") == []


def test_no_lab_notebook_options():
    product = [p for p in where(r"truncated ==|cfg\.truncated|loss_norm|sequence_weights")
               if p.startswith(("clawproxy/", "judge/", "trainer/"))]
    assert product == []


def test_one_definition_of_degenerate():
    # the recorder, the trainer, the gate and the simulator all ask clawproxy/degenerate.py; one of
    # its questions is "degenerate", the others are named for what they ask (its docstring)
    named = r"def (?!test_)\w*degenera\w*\(|def \w*loops?\((text|ids)|def \w*_(broken|flaw)\("
    assert where(named) == ["clawproxy/degenerate.py"]
    src = (ROOT / "clawproxy" / "degenerate.py").read_text()
    assert re.findall(r"def (\w*degenera\w*)\(", src) == ["is_degenerate"]
    assert where(r"\[i : i \+ 3\]\) for i in range") == ["clawproxy/degenerate.py"]  # one 3-gram measure


# SQL lives in the clawproxy/store/ package, behind named methods; tests may still query the store directly.
SQL = (r"\b(SELECT|INSERT (OR \w+ )?INTO|UPDATE \w+ SET|DELETE FROM|CREATE (TABLE|INDEX))\b"
       r"|\b(store|conn)\.(query|query_one|execute|executemany|transaction|insert|update)\(")


def test_sql_only_in_the_store():
    product = [p for p in where(SQL) if p.startswith(("clawproxy/", "judge/", "trainer/"))]
    assert product and all(p.startswith("clawproxy/store/") for p in product), product


def product(paths: list[str]) -> list[str]:
    return [p for p in paths if p.startswith(("clawproxy/", "judge/", "trainer/"))]


def test_one_error_response_and_one_control_guard():
    # the proxy and the engine answer every error through clawproxy/edge.py (the body from
    # clawproxy/errors.py) and guard their control routes with its one check
    assert product(where(r"(?<!`)\{\s*[\"']error[\"']\s*:\s*\{")) == ["clawproxy/errors.py"]  # {"error": {...}}
    assert product(where(r"json_response\([^)]*[\"']error")) == []
    assert product(where(r"def \w*error_(response|body)\(")) == ["clawproxy/edge.py", "clawproxy/errors.py"]
    assert product(where(r"(?m)compare_digest|^def \w*loopback\w*\(")) == ["clawproxy/edge.py"]
    assert product(where(r"class \w*(BadRequest|Unauthori[sz]ed|Forbidden)\w*\(")) == ["clawproxy/errors.py"]


def test_one_json_over_http_client():
    # EngineClient, the supervisor, the simulator, the judge and the benchmarks share clawproxy/httpjson.py
    code = [p for p in where(r"urllib\.request|urlopen\(") if p.startswith(("clawproxy/", "judge/", "trainer/", "bench/"))]
    assert code == ["clawproxy/httpjson.py"]
    assert product(where(r"def free_port\(")) == []  # a port picked, released and used later is a race
