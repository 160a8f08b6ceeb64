"""Our CPU LoRA ops (clawproxy/engine/vllm/lora_cpu.py) against vLLM's own: equal for tokens with an
adapter, no delta for tokens without one (vLLM's give them the last slot's), and installed by the
plugin vLLM loads in every process."""

from __future__ import annotations

import importlib
import importlib.metadata

import pytest
import torch

vllm_ops = pytest.importorskip("vllm.lora.ops.torch_ops.lora_ops")
from clawproxy.engine.vllm import lora_cpu as ours  # noqa: E402

# vLLM's originals, taken before any test installs ours over them
ORIGINAL = {name: getattr(importlib.reload(vllm_ops), name)
            for name in ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")}


def _case(seed: int, tokens: int = 7, loras: int = 3, rank: int = 4, hidden: int = 12, out: int = 10):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    a = torch.randn(loras, 1, rank, hidden, generator=g)  # vLLM stacks slots as [loras, 1, out, in]
    b = torch.randn(loras, 1, out, rank, generator=g)
    idx = torch.randint(0, loras, (tokens,), generator=g)
    return x, a, b, idx


@pytest.mark.parametrize("seed", range(4))
def test_equal_to_vllm_for_tokens_with_an_adapter(seed):
    x, a, b, idx = _case(seed)
    want, got = torch.zeros(len(x), 4), torch.zeros(len(x), 4)
    ORIGINAL["bgmv_shrink"](x, a, want, idx, 0.5)
    ours.bgmv_shrink(x, a, got, idx, 0.5)
    torch.testing.assert_close(got, want)

    base = torch.randn(len(x), 10)
    for add in (True, False):
        want, got = base.clone(), base.clone()
        ORIGINAL["bgmv_expand"](want_in := torch.randn(len(x), 4, generator=torch.Generator().manual_seed(seed)),
                                b, want, idx, add)
        ours.bgmv_expand(want_in, b, got, idx, add)
        torch.testing.assert_close(got, want)

        want, got = torch.zeros(len(x), 30), torch.zeros(len(x), 30)
        ORIGINAL["bgmv_expand_slice"](want_in, b, want, idx, 10, 10, add)
        ours.bgmv_expand_slice(want_in, b, got, idx, 10, 10, add)
        torch.testing.assert_close(got, want)


def test_a_token_without_an_adapter_gets_no_delta():
    x, a, b, idx = _case(0)
    idx[2] = -1  # a base-model request's token in the same batch
    got = torch.zeros(len(x), 4)
    ours.bgmv_shrink(x, a, got, idx, 1.0)
    assert torch.all(got[2] == 0) and torch.all(got[idx >= 0].abs().sum(1) > 0)
    out = torch.ones(len(x), 10)
    ours.bgmv_expand(torch.randn(len(x), 4), b, out, idx, True)
    assert torch.all(out[2] == 1)
    vllm_out = torch.zeros(len(x), 4)
    ORIGINAL["bgmv_shrink"](x, a, vllm_out, idx, 1.0)
    assert vllm_out[2].abs().sum() > 0  # vLLM's applies the last slot: the defect this replaces


def test_one_index_or_one_row_broadcasts_as_in_vllm():
    x, a, b, idx = _case(1)
    want, got = torch.zeros(len(x), 4), torch.zeros(len(x), 4)
    ORIGINAL["bgmv_shrink"](x, a, want, idx[:1], 1.0)
    ours.bgmv_shrink(x, a, got, idx[:1], 1.0)
    torch.testing.assert_close(got, want)


def test_the_plugin_is_registered_and_installs_the_ops():
    eps = [ep for ep in importlib.metadata.entry_points(group="vllm.general_plugins")
           if ep.value == "clawproxy.engine.vllm.lora_cpu:register"]
    assert eps, "pyproject.toml's vllm.general_plugins entry point is missing (reinstall: make install)"
    from vllm.lora.punica_wrapper import punica_cpu

    try:
        eps[0].load()()
        assert punica_cpu.bgmv_shrink is ours.bgmv_shrink and vllm_ops.bgmv_expand is ours.bgmv_expand
    finally:
        for name, fn in ORIGINAL.items():
            setattr(vllm_ops, name, fn)
            setattr(punica_cpu, name, fn)


def test_the_engine_launcher_sees_the_plugin():
    from clawproxy.engine.vllm.launch import lora_plugin_installed

    assert lora_plugin_installed()


@pytest.mark.parametrize("value", [1, -1])
def test_one_adapter_for_the_whole_batch(value):
    x, a, b, idx = _case(2)
    idx[:] = value
    want, got = torch.zeros(len(x), 4), torch.zeros(len(x), 4)
    ORIGINAL["bgmv_shrink"](x, a, want, idx, 1.0)
    ours.bgmv_shrink(x, a, got, idx, 1.0)
    if value >= 0:
        torch.testing.assert_close(got, want)
    else:
        assert torch.all(got == 0)


def test_an_empty_batch_is_no_error():
    _, a, _, _ = _case(3)
    out = torch.zeros(0, 4)
    ours.bgmv_shrink(torch.zeros(0, 12), a, out, torch.zeros(0, dtype=torch.long), 1.0)
    assert out.shape == (0, 4)
