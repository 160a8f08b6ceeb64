"""The dashboard (/clawproxy/ui) in a real browser: Debian's chromium driven by selenium, against real
`clawproxy start` processes.

The stack is built once per module, the way a user's data comes about:
1. ``clawproxy start --upstream <fake>`` (``python -m tests.rig.fake_upstream``) with the judge
   (lexical voter) records two conversations and judges them; then it is stopped.
2. ``clawproxy start`` on the same data dir runs the real vLLM serving the tiny model, the judge and
   the real trainer, which trains two steps on those judged turns and publishes v1 and v2 into
   vLLM; this process serves the dashboard the browser reads.
Two starts, because the fake upstream has no weights to reload, and the tiny random model's answers
never end by themselves (each would be a cut-off, untrainable turn). Without a vLLM build the
browser tests skip.

Screenshots of every page go to ``$CLAWPROXY_ARTIFACTS`` (default: a pytest temp dir).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from clawproxy.engine.client import EngineClient
from clawproxy.store import Store
from tests.clawproxy.test_supervisor import wait_http
from tests.net import held_port, stop
from tests.rig.proc_rig import FakeProc
from tests.rig.vllm_engine import engine_settings, require_vllm
from tests.waits import assert_stays_sync, until_sync

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
MODEL = "tiny"  # the name vLLM serves the tiny model under
SAID_NO_WINDOW_S = 0.5  # how long the test watches the serving version after the user says no to a rollback

# Two conversations; each user message after the first is the previous answer's next state.
GOOD = ["What is 2+2?", "thanks, that's perfect!", "great, now name a fruit"]
BAD = ["Write a haiku about rain.", "no, that's wrong, I said shorter", "no, still wrong, try again"]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


@contextlib.contextmanager
def _start(args: list[str], log: Path) -> Iterator[subprocess.Popen]:
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "clawproxy.cli", "start", *args], stdout=out,
                                stderr=subprocess.STDOUT, env=_env(), cwd=ROOT)
    try:
        yield proc
    finally:
        stop(proc)


def _chat(port: int, messages: list[dict[str, Any]], session: str, **extra: Any) -> tuple[dict, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps({"model": MODEL, "messages": messages, **extra}).encode(),
        headers={"Content-Type": "application/json", "session_id": session})
    with _OPENER.open(req, timeout=120) as r:
        return json.loads(r.read()), r.headers


def _converse(port: int, session: str, said: list[str]) -> None:
    messages: list[dict[str, Any]] = []
    for text in said:
        messages.append({"role": "user", "content": text})
        body, _ = _chat(port, messages, session)
        messages.append(body["choices"][0]["message"])


def _store(data: Path) -> Store:
    return Store.reader(data / "clawproxy.db")


def _latest_version(data: Path) -> int:
    with contextlib.closing(_store(data)) as s:
        return s.latest_weight_version()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_vllm_model_dir) -> Iterator[dict[str, Any]]:
    require_vllm()
    base = tmp_path_factory.mktemp("dashboard")
    data = base / "data"
    cfg = base / "config.yaml"
    cfg.write_text(yaml.safe_dump({
        "engine": engine_settings(tiny_vllm_model_dir, served_model_name=MODEL, max_model_len=512, threads=1),
        "judge": {"voter": "lexical", "poll_interval_s": 0.2},
        "trainer": {"batch_size": 2, "learning_rate": 0.001, "poll_interval_s": 0.5, "threads": 1}}))
    fake = FakeProc()
    try:
        with held_port() as port, _start(["--upstream", fake.url, "--port", str(port), "--data-dir", str(data),
                                          "--config", str(cfg), "--no-train"], base / "record.log") as proc:
            wait_http(f"http://127.0.0.1:{port}/clawproxy/health", timeout=60)
            _converse(port, "dash-good", GOOD)
            _converse(port, "dash-bad", BAD)

            def judged() -> bool:
                assert proc.poll() is None, (base / "record.log").read_text()[-3000:]
                with contextlib.closing(_store(data)) as s:
                    return s.judge_backlog()["judged"] >= 4

            until_sync(judged, "the judge scored the four turns with a next state", 90)
    finally:
        fake.close()
    with held_port() as port, held_port() as engine_port, _start(
            ["--port", str(port), "--engine-port", str(engine_port), "--data-dir", str(data),
             "--config", str(cfg)], base / "serve.log") as proc:
        try:
            wait_http(f"http://127.0.0.1:{port}/v1/models", timeout=600)  # 200 once vLLM is up
        except AssertionError as e:
            engine_log = data / "logs" / "engine.log"
            raise AssertionError(f"{e}\n{(base / 'serve.log').read_text()[-2000:]}\n"
                                 f"{engine_log.read_text()[-3000:] if engine_log.exists() else ''}") from None

        def trained() -> bool:
            assert proc.poll() is None, (base / "serve.log").read_text()[-3000:]
            with contextlib.closing(_store(data)) as s:
                return s.latest_weight_version() >= 2

        until_sync(trained, "the trainer published v2", 150)
        yield {"port": port, "engine_port": engine_port, "data": data, "url": f"http://127.0.0.1:{port}/clawproxy/ui"}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    out = Path(os.environ.get("CLAWPROXY_ARTIFACTS") or tmp_path_factory.mktemp("artifacts"))
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[Any]:
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _until(driver: Any, what: str, check, timeout: float = 30.0) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: check(d), message=what)


def _text(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, css).text


def _shot(driver: Any, artifacts: Path, name: str) -> None:
    """Save the page, after checking that its scripts raised nothing (CSP refusals included)."""
    errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors
    # full page: the window height grows to the document's
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, max(600, min(int(height) + 40, 4000)))
    driver.save_screenshot(str(artifacts / f"{name}.png"))
    driver.set_window_size(1400, 1000)


# -- the pages in a browser -----------------------------------------------------------------------
def test_overview_shows_serving_version_counts_states_and_updates_live(stack, browser, artifacts):
    from selenium.webdriver.common.by import By

    from clawproxy.proxy.ui import _midnight

    # "today" is since local midnight, as the page counts it; a load that straddles midnight is redone
    while True:
        midnight = _midnight()
        browser.get(stack["url"] + "/")
        with contextlib.closing(_store(stack["data"])) as s:
            version, today = s.latest_weight_version(), s.turns_and_sessions_since(midnight)
            skipped = s.skipped_by_reason()
        if _midnight() == midnight:
            break
    assert _text(browser, "#serving-version") == f"v{version}" == "v2"
    assert _text(browser, "#turns-today") == str(today["turns"])
    assert _text(browser, "#sessions-today") == str(today["sessions"])
    assert _text(browser, "#judge-state") == "waiting for turns"
    assert _text(browser, "#trainer-state") in ("waiting for samples", "training")
    assert _text(browser, "#quarantined") == "0" and _text(browser, "#lost") == "0"
    for reason, n in skipped.items():
        assert f"{reason} {n}" in _text(browser, "#skipped")
    _until(browser, "the live badge polled", lambda d: _text(d, "#live-serving") == "v2")
    _shot(browser, artifacts, "overview")

    # a new turn shows up without a reload: counters and the latest-turns table
    rows = len(browser.find_elements(By.CSS_SELECTOR, "#recent tbody tr"))
    _chat(stack["port"], [{"role": "user", "content": "live?"}], "dash-live", max_tokens=2)
    def recorded() -> int:
        with contextlib.closing(_store(stack["data"])) as s:
            return s.last_ids()["turn"] if s.last_ids()["turn"] > first else 0

    first = int(browser.find_element(By.CSS_SELECTOR, "#recent").get_attribute("data-after"))
    newest = _until(browser, "the recorder stored the turn", lambda _: recorded())
    _until(browser, "the new turn appeared", lambda d: _text(d, "#recent tbody tr:first-child td") == str(newest))
    assert len(browser.find_elements(By.CSS_SELECTOR, "#recent tbody tr")) == rows + 1, [
        e.text for e in browser.find_elements(By.CSS_SELECTOR, "#recent tbody tr")]
    assert _text(browser, "#turns-today") == str(today["turns"] + 1)
    assert "dash-live" in _text(browser, "#recent tbody tr:first-child")


def test_sessions_list_filters_and_a_session_reads_as_a_conversation(stack, browser, artifacts):
    from selenium.webdriver.common.by import By

    # its own cut-off session, so this test does not lean on the overview test's
    _chat(stack["port"], [{"role": "user", "content": "cut?"}], "dash-cut", max_tokens=2)
    browser.get(stack["url"] + "/sessions")
    listed = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#sessions tr.session td:first-child a")]
    assert {"dash-good", "dash-bad"} <= set(listed)
    _shot(browser, artifacts, "sessions")
    browser.get(stack["url"] + "/sessions?score=neg")
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#sessions tr.session a")] == ["dash-bad"]
    def not_trainable(d: Any) -> list[str]:
        d.get(stack["url"] + "/sessions?trainable=no")
        names = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#sessions tr.session a")]
        return names if "dash-cut" in names else []

    no_train = _until(browser, "the recorder stored the cut-off turn", not_trainable)
    assert "dash-good" not in no_train and "dash-cut" in no_train  # the tiny engine's answer is cut off

    browser.find_element(By.CSS_SELECTOR, "form.filters select[name=trainable] option[value=yes]").click()
    browser.find_element(By.CSS_SELECTOR, "form.filters select[name=score] option[value=pos]").click()
    browser.find_element(By.CSS_SELECTOR, "form.filters button").click()
    _until(browser, "the filter applied", lambda d: "score=pos" in d.current_url)
    browser.find_element(By.LINK_TEXT, "dash-good").click()
    _until(browser, "the session page", lambda d: "/sessions/dash-good" in d.current_url)

    with contextlib.closing(_store(stack["data"])) as s:
        turns = s.session_turns("dash-good")
        votes = s.votes_of([t["id"] for t in turns])
        fate = s.training_fate([t["id"] for t in turns])
    articles = browser.find_elements(By.CSS_SELECTOR, "article.turn")
    assert len(articles) == len(turns) == 3
    for t, art, asked in zip(turns, articles, GOOD, strict=True):
        assert art.find_element(By.CSS_SELECTOR, ".msg.user p").text == asked
        assert art.find_element(By.CSS_SELECTOR, ".msg.assistant p").text == t["response_text"]
        cast = art.find_elements(By.CSS_SELECTOR, "tr.vote")
        assert len(cast) == len(votes[t["id"]])
        for row, v in zip(cast, votes[t["id"]], strict=True):
            assert row.find_elements(By.TAG_NAME, "td")[1].text == v["voter"] == "lexical"
        majority = art.find_element(By.CSS_SELECTOR, ".majority").text
        why = art.find_element(By.CSS_SELECTOR, ".why").text
        if t["judge_score"] is None:
            assert majority == "majority: not judged"
        else:
            assert majority.startswith(f"majority: {t['judge_score']:+d}")
            assert len(cast) == 3
        if fate[t["id"]]["step"] is not None:
            assert why == f"trained in step {fate[t['id']]['step']}"
    # the first answer was praised next: its next state is the user's thanks
    assert articles[0].find_element(By.CSS_SELECTOR, ".msg.next p").text == GOOD[1]
    assert turns[0]["judge_score"] == 1
    _shot(browser, artifacts, "session")


def _chart(driver: Any, canvas_id: str) -> dict[str, Any]:
    return driver.execute_script(
        "const c = Chart.getChart(document.getElementById(arguments[0]));"
        "return c ? {labels: c.data.labels, data: c.data.datasets.map(d => d.data)} : null;", canvas_id)


def test_learning_charts_have_a_point_per_step_and_version(stack, browser, artifacts):
    from clawproxy.simulate.measure import Curve, make_point, write_json

    # what `clawproxy simulate` leaves in the data dir: its held-out adoption curve
    points = [make_point(n, [], None, 0.0) for n in (0, 12, 24)]
    for p, adoption in zip(points, (0.0, 0.25, 0.5), strict=True):
        p.adoption = adoption
    write_json(stack["data"] / "simulate" / "curve.json", [Curve("concise", "concise", "combined", points=points)])
    browser.get(stack["url"] + "/learning")
    with contextlib.closing(_store(stack["data"])) as s:
        steps = s.steps_with_samples()
        per_version = [r for r in s.served_turns_per_version() if r["judged"]]
    samples = _until(browser, "the samples chart drew", lambda d: _chart(d, "chart-samples"))
    assert samples["labels"] == [f"step {st['id']}" for st in steps] and len(steps) >= 2
    assert samples["data"] == [[st["samples"] for st in steps]]
    loss = _chart(browser, "chart-loss")
    assert len(loss["data"]) == 3 and all(len(d) == len(steps) for d in loss["data"])
    assert loss["data"][0] == pytest.approx([st["metrics"]["loss"] for st in steps])
    by_version = _chart(browser, "chart-score-version")
    assert len(by_version["data"][0]) == len(per_version) >= 1
    assert by_version["data"][0] == pytest.approx([r["mean"] for r in sorted(per_version, key=lambda r: r["v"] or 0)])
    assert _chart(browser, "chart-score-time")["data"][0]
    adoption = _chart(browser, "chart-adoption")["data"]
    assert adoption == [[{"x": 0, "y": 0.0}, {"x": 12, "y": 0.25}, {"x": 24, "y": 0.5}]]
    # `clawproxy stats` shows the same curve
    from click.testing import CliRunner

    from clawproxy.cli import main

    res = CliRunner().invoke(main, ["stats", "--json", "--data-dir", str(stack["data"])])
    assert res.exit_code == 0, res.output
    assert [c["points"] for c in json.loads(res.output)["simulate"]] == adoption
    res = CliRunner().invoke(main, ["stats", "--data-dir", str(stack["data"])])
    text = " ".join(res.output.split())  # rich wraps at 80 columns
    assert "held-out adoption (concise, `clawproxy simulate`): 0 -> 0.00, 12 -> 0.25, 24 -> 0.50" in text
    _shot(browser, artifacts, "learning")


def test_rollback_asks_first_then_does_what_clawproxy_rollback_does(stack, browser, artifacts):
    from selenium.webdriver.common.by import By

    # a learning page left open in another tab follows the rollback by itself
    browser.get(stack["url"] + "/learning")
    learning_tab = browser.current_window_handle
    assert _markers(browser) == []
    browser.switch_to.new_window("tab")
    browser.get(stack["url"] + "/versions")
    rows = browser.find_elements(By.CSS_SELECTOR, "#versions tr.version")
    assert [r.get_attribute("data-version") for r in rows] == ["0", "1", "2"]
    assert "passed" in rows[1].text and "passed" in rows[2].text  # each publish passed the gate
    assert _text(browser, "#current-version") == "v2"
    _shot(browser, artifacts, "versions")

    browser.find_element(By.ID, "rollback-1").click()
    alert = _until(browser, "a confirmation", lambda d: d.switch_to.alert)
    assert "v1" in alert.text
    alert.dismiss()  # said no: nothing happens
    assert_stays_sync(lambda: _latest_version(stack["data"]) == 2, "no rollback after the user said no",
                      SAID_NO_WINDOW_S)

    browser.find_element(By.ID, "rollback-1").click()
    _until(browser, "a confirmation", lambda d: d.switch_to.alert).accept()
    _until(browser, "the rollback finished", lambda d: d.find_elements(By.ID, "flash"), timeout=120)
    assert _text(browser, "#flash").startswith("now serving v3 = the weights of v1"), _text(browser, "#flash")
    assert _text(browser, "#current-version") == "v3"
    with contextlib.closing(_store(stack["data"])) as s:
        assert s.latest_weight_version() == 3
        (event,) = s.events_of("rollback")
        assert event["data"] == {"from": 2, "to": 1, "new_version": 3, "engine": True}
    # vLLM serves it (its /weight_info), and a request through the proxy is recorded as answered by v3
    engine = EngineClient(f"http://127.0.0.1:{stack['engine_port']}", kind="vllm")
    assert engine.weight_version() == 3
    _chat(stack["port"], [{"role": "user", "content": "which version?"}], "dash-after", max_tokens=2)

    def recorded(_: Any) -> list[dict[str, Any]]:
        with contextlib.closing(_store(stack["data"])) as s:
            return s.session_turns("dash-after")

    (turn,) = _until(browser, "the recorder stored the turn", recorded)
    assert turn["weight_version"] == 3
    _shot(browser, artifacts, "versions-after-rollback")
    browser.close()
    browser.switch_to.window(learning_tab)
    _until(browser, "the open learning page marked the rollback", lambda d: _markers(d) == [2])
    browser.refresh()
    assert "v2 → the weights of v1, served as v3" in _text(browser, "#marks")


def _markers(driver: Any) -> list[int]:
    """Where the samples chart draws rollbacks (after how many steps)."""
    return driver.execute_script(
        "return Chart.getChart(document.getElementById('chart-samples')).options.plugins.markers.at;")
