"""Each loss moves the tiny model the right way, and the clipping does what PPO says."""

from __future__ import annotations

import random

import pytest
import torch

from trainer.losses import (
    combined_advantages,
    completion_logps,
    make_packed_batch,
    make_token_batch,
    opd_advantages,
    packed_length,
    ppo_clipped_loss,
    rl_advantages,
)


@pytest.fixture
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model.train()
    return model


def _seq(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 5000) for _ in range(n)]


PROMPT, COMPLETION = _seq(12, 0), _seq(10, 1)


def _one_step(model, batch, advantages_fn, lr=1e-3):
    """One AdamW step on the clipped surrogate; behaviour log-probs = the model's own (on-policy)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    logps = completion_logps(model, batch)
    adv = advantages_fn(logps.detach())
    loss, stats = ppo_clipped_loss(
        logps, logps.detach(), adv, batch.completion_mask,
        epsilon_low=0.2, epsilon_high=0.28, num_tokens=int(batch.completion_mask.sum()),
    )
    loss.backward()
    opt.step()
    opt.zero_grad()
    return stats


def _total_logp(model, batch) -> float:
    with torch.no_grad():
        return float(completion_logps(model, batch).sum())


@pytest.mark.parametrize("score,direction", [(1, 1), (-1, -1)])
def test_binary_rl_moves_response_logprob_with_the_score(tiny, score, direction):
    batch = make_token_batch([PROMPT], [COMPLETION], pad_id=0)
    before_params = [p.detach().clone() for p in tiny.parameters()]
    before = _total_logp(tiny, batch)
    stats = _one_step(tiny, batch, lambda lp: rl_advantages(torch.tensor([score]), batch.completion_mask))
    after = _total_logp(tiny, batch)
    assert direction * (after - before) > 0.05, (before, after)
    changed = sum(not torch.equal(a, b) for a, b in zip(before_params, tiny.parameters(), strict=True))
    assert changed >= len(before_params) - 1  # every trained tensor moved
    assert stats.clip_frac == 0.0 and abs(stats.ratio_mean - 1) < 1e-5


def test_padded_micro_batch_matches_single_samples(tiny):
    """Left-padded prompts / right-padded completions give the same log-probs as unpadded rows."""
    tiny.eval()
    a = make_token_batch([PROMPT], [COMPLETION], pad_id=0)
    b = make_token_batch([_seq(5, 7)], [_seq(4, 8)], pad_id=0)
    both = make_token_batch([PROMPT, _seq(5, 7)], [COMPLETION, _seq(4, 8)], pad_id=0)
    with torch.no_grad():
        la, lb, lboth = completion_logps(tiny, a), completion_logps(tiny, b), completion_logps(tiny, both)
    torch.testing.assert_close(lboth[0], la[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lboth[1, :4], lb[0], atol=1e-4, rtol=1e-4)
    assert torch.all(lboth[1, 4:] == 0)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_pass_matches_separate_rows_in_logps_and_gradients(tiny_model_dir, attn):
    """A shared system prompt, a later turn that re-sends an earlier answer, the same prompt answered
    twice, and an unrelated sample: one packed pass computes each shared token once and gives every
    completion token the log-prob, and every weight the gradient, of the padded rows."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, attn_implementation=attn)
    model.train()
    system, question, answer = _seq(40, 10), _seq(10, 11), _seq(8, 12)
    prompts = [system + question, system + _seq(7, 13), system + question + answer + _seq(6, 14), _seq(9, 15),
               system + question]
    completions = [answer, _seq(5, 16), _seq(4, 17), _seq(3, 18), _seq(6, 19)]
    padded = make_token_batch(prompts, completions, pad_id=0)
    packed = make_packed_batch(prompts, completions, pad_id=0)
    unpacked_len = sum(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))
    assert packed.input_ids.size(1) == packed_length([p + c for p, c in zip(prompts, completions, strict=True)])
    assert packed.input_ids.size(1) == unpacked_len - 3 * 40 - 2 * 10 - 8  # each shared token once
    params = list(model.parameters())
    lp_padded = completion_logps(model, padded)
    g_padded = torch.autograd.grad((lp_padded * torch.arange(1, 6).unsqueeze(1)).sum(), params)
    lp_packed = completion_logps(model, packed)
    g_packed = torch.autograd.grad((lp_packed * torch.arange(1, 6).unsqueeze(1)).sum(), params)
    torch.testing.assert_close(lp_packed, lp_padded, atol=1e-5, rtol=1e-5)
    assert torch.all(lp_packed[padded.completion_mask == 0] == 0)
    for a, b in zip(g_packed, g_padded, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_opd_moves_student_toward_teacher(tiny):
    """Teacher = a frozen copy of the model that sees the hint in its prompt (teacher='base')."""
    import copy

    teacher = copy.deepcopy(tiny).eval()
    hint_prompt = PROMPT + _seq(6, 3)  # the same prompt plus "hint" tokens
    student_batch = make_token_batch([PROMPT], [COMPLETION], pad_id=0)
    teacher_batch = make_token_batch([hint_prompt], [COMPLETION], pad_id=0)
    with torch.no_grad():
        t_logps = completion_logps(teacher, teacher_batch)

    def gap() -> float:
        return float((t_logps - completion_logps(tiny, student_batch).detach()).abs().sum())

    before = gap()
    for _ in range(3):
        _one_step(
            tiny, student_batch,
            lambda lp: opd_advantages(t_logps, lp, student_batch.completion_mask, clip=1.0),
            lr=3e-4,
        )
    after = gap()
    assert after < before * 0.9, (before, after)


def test_combined_advantage_is_weighted_sum_and_opd_only_with_hint():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    teacher = torch.tensor([[-1.0, -5.0, 0.0], [-1.0, -1.0, -1.0]])
    student = torch.tensor([[-2.0, -1.0, 0.0], [-3.0, -3.0, -3.0]])
    adv = combined_advantages(
        torch.tensor([1, -1]), teacher, student, torch.tensor([True, False]), mask,
        w_rl=0.5, w_opd=2.0, clip=1.0,
    )
    # row 0: 0.5*1 + 2*clip(+1), 0.5*1 + 2*clip(-4 -> -1), padding 0; row 1: no hint -> RL only.
    torch.testing.assert_close(adv, torch.tensor([[2.5, -1.5, 0.0], [-0.5, -0.5, -0.5]]))


def test_ppo_clipping_stops_gradient_outside_the_trust_region():
    behaviour = torch.zeros(1, 4)
    # log-ratios: inside, above 1+0.28 (A>0: clipped), below 1-0.2 (A<0: clipped), above with A<0
    logps = torch.tensor([[0.1, 0.5, -0.5, 0.5]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, stats = ppo_clipped_loss(
        logps, behaviour, adv, torch.ones(1, 4), epsilon_low=0.2, epsilon_high=0.28, num_tokens=4
    )
    loss.backward()
    g = logps.grad[0]
    assert g[0] != 0 and g[1] == 0 and g[2] == 0
    assert g[3] != 0  # a bad token that got *more* likely is never clipped: pessimistic bound
    assert stats.clip_high == pytest.approx(0.25) and stats.clip_low == pytest.approx(0.25)
    assert stats.kl_behaviour > 0


def test_kl_to_reference_pulls_back():
    logps = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    ref = torch.tensor([[-2.0, -0.5]])
    zero = torch.zeros(1, 2)
    loss, stats = ppo_clipped_loss(
        logps, logps.detach(), zero, torch.ones(1, 2), epsilon_low=0.2, epsilon_high=0.28,
        num_tokens=2, ref_logps=ref, kl_coef=1.0,
    )
    loss.backward()
    # gradient descent moves each log-prob toward the reference's
    assert logps.grad[0, 0] > 0 and logps.grad[0, 1] < 0 and stats.kl_ref > 0
