"""The whole publish cycle against the fake vLLM 0.33: trainer checkpoint -> gate -> validate ->
vLLM reload, for full fine-tuning and LoRA, and each way it fails (a reload that loses the
weights, an adapter vLLM refuses, a checkpoint cut short, a restarted vLLM: its full weights the
trainer reloads, a lost adapter it only reports, for the proxy loads it back)."""

from __future__ import annotations

import pytest

from clawproxy.engine.client import EngineClient
from tests.fakes.fake_vllm import CALLS, STATE, create_fake_vllm, restart
from tests.fakes.serve import serve_in_thread
from tests.trainer.test_loop import _add, _trainer, rig  # noqa: F401 (fixture)
from trainer.checkpoints import ensure_engine_serves


@pytest.fixture
def vllm():
    app = create_fake_vllm(model="tiny", api_key="sk-up")
    with serve_in_thread(app) as url:
        yield app, EngineClient(url, kind="vllm", token="sk-up")


def _calls(app, path: str) -> list:
    return [b for m, p, b in app[CALLS] if p.split("?")[0] == path]


def _untrained(store) -> int:
    return store.query_one("SELECT COUNT(*) AS n FROM turns WHERE id NOT IN "
                           "(SELECT turn_id FROM trained_samples)")["n"]


def test_full_publish_reloads_vllm_and_a_restart_gets_it_back(rig, tiny_model_dir, vllm):  # noqa: F811
    app, engine = vllm
    cfg, store = rig()
    _add(store, tiny_model_dir, 2)
    tr = _trainer(cfg, store, engine)
    (r,) = tr.run(steps=1)
    assert r.status == "published" and r.new_version == 1
    v1 = str(cfg.data_path / "checkpoints" / "v1")
    assert _calls(app, "/collective_rpc") == [{"method": "reload_weights", "kwargs": {"weights_path": v1}}]
    assert app[STATE]["weight_version"] == "1" and engine.weight_version() == 1
    # the reload's own time, apart from writing the checkpoint: /metrics serves it from the store
    assert 0 < r.metrics["reload_s"] < r.metrics["publish_s"] - r.metrics["save_s"] + 1e-6
    assert store.reload_durations() == [r.metrics["reload_s"]]
    restart(app)  # vLLM came back on the base model: /weight_info says "default"
    assert ensure_engine_serves(store, engine, tr.base_dir)
    assert app[STATE]["weights_path"] == v1 and engine.weight_version() == 1


def test_failed_full_reload_puts_the_last_good_version_back(rig, tiny_model_dir, vllm):  # noqa: F811
    app, engine = vllm
    cfg, store = rig()
    _add(store, tiny_model_dir, 2)
    tr = _trainer(cfg, store, engine)
    app[STATE]["fail_reload"] = True
    (r,) = tr.run(steps=1)
    assert r.status == "error" and "cannot read weights" in r.metrics["engine_error"]
    paths = [c["kwargs"]["weights_path"] for c in _calls(app, "/collective_rpc")]
    assert paths == [str(cfg.data_path / "checkpoints" / "v1"), str(tr.base_dir)]  # v0 back
    assert app[STATE]["weights_ok"] and app[STATE]["pause_mode"] is None
    assert _untrained(store) == 0  # refused by the engine: not retried forever
    assert store.query("SELECT * FROM checkpoints") == []


def test_checkpoint_cut_short_never_reaches_vllm(rig, tiny_model_dir, vllm, monkeypatch):  # noqa: F811
    app, engine = vllm
    cfg, store = rig()
    _add(store, tiny_model_dir, 2)
    tr = _trainer(cfg, store, engine)
    save = type(tr.publisher).save

    def save_then_truncate(self, tmp, state_dict):
        save(self, tmp, state_dict)
        f = tmp / "model.safetensors"
        f.write_bytes(f.read_bytes()[:-16])

    monkeypatch.setattr(type(tr.publisher), "save", save_then_truncate)
    (r,) = tr.run(steps=1)
    assert r.status == "error" and "not fully covered" in r.metrics["engine_error"]
    assert _calls(app, "/collective_rpc") == [] and _calls(app, "/pause") == []


def test_lora_publish_and_refused_adapter_is_not_retried(rig, tiny_model_dir, vllm):  # noqa: F811
    app, engine = vllm
    cfg, store = rig(finetune="lora", learning_rate=1e-2)
    _add(store, tiny_model_dir, 2)
    tr = _trainer(cfg, store, engine)
    (r,) = tr.run(steps=1)
    assert r.status == "published"
    v1 = str(cfg.data_path / "checkpoints" / "v1")
    assert app[STATE]["loras"] == {"clawproxy": v1}

    _add(store, tiny_model_dir, 2, seed=3, version=1)
    app[STATE]["fail_lora"] = True  # vLLM 0.33: add_lora raised -> 500 InternalServerError
    (r,) = tr.run(steps=1)
    assert r.status == "error" and r.metrics["engine_error"].startswith("POST /v1/load_lora_adapter refused (500)")
    assert app[STATE]["loras"] == {"clawproxy": v1}  # vLLM still serves v1
    assert _untrained(store) == 0 and tr.run(steps=1) == []  # used up, not retried forever

    loads = len(_calls(app, "/v1/load_lora_adapter"))
    restart(app)  # the restarted vLLM lost the adapter: the trainer reports it, the proxy loads it back
    assert not ensure_engine_serves(store, engine, tr.base_dir)  # (tests/proxy/test_proxy_routing.py)
    assert app[STATE]["loras"] == {} and len(_calls(app, "/v1/load_lora_adapter")) == loads
    lost = {"adapter": "clawproxy", "path": v1, "version": 1}
    assert [e["data"] for e in store.events_of("lost")] == [lost]
    assert not ensure_engine_serves(store, engine, tr.base_dir)
    assert [e["data"] for e in store.events_of("lost")] == [lost]  # once per version lost, not per poll
