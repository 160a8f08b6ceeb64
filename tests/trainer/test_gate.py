"""The publish gate's canaries: all answered in one batched generate, the same as one at a time."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer.gate import canary_prompt_ids, greedy_batch


def test_batched_canaries_answer_as_one_at_a_time(default_model_dir):
    tok = AutoTokenizer.from_pretrained(default_model_dir)
    model = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    # different lengths, so the shorter prompts are left-padded
    prompts = canary_prompt_ids(tok, ["What is the capital of Japan?", "Say hi.",
                                      "Give me two tips for drinking more water during a busy day."])
    assert len({len(p) for p in prompts}) == 3
    eos = tok.eos_token_id

    def cut(ids: list[int]) -> list[int]:
        return ids[: ids.index(eos) + 1] if eos in ids else ids

    with torch.no_grad():
        batched = [cut(o) for o in greedy_batch(model, prompts, 24, tok.pad_token_id, "cpu")]
        alone = []
        for p in prompts:
            out = model.generate(input_ids=torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id)
            alone.append(cut(out[0, len(p):].tolist()))
    assert batched == alone
    assert all(len(o) > 3 for o in batched)


def test_the_new_weights_answers_drafted_by_the_previous_ones_are_their_own_greedy_answers(default_model_dir):
    """Speculative decoding with the previous version's answers as the draft: unchanged weights take
    every drafted token and generate nothing; changed weights part from the draft somewhere, and the
    answers are still exactly what plain greedy generation gives."""
    from trainer.gate import CanaryReference, verify_and_extend

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    model = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    prompts = canary_prompt_ids(tok, ["What is the capital of Japan?", "Say hi.", "Name two colors."])
    eos = {tok.eos_token_id}

    def cut(ids: list[int]) -> list[int]:
        return next((ids[: i + 1] for i, t in enumerate(ids) if t in eos), ids)

    with torch.no_grad():
        before = [cut(o) for o in greedy_batch(model, prompts, 20, tok.pad_token_id, "cpu")]
        prev = CanaryReference(0, prompts, before, [], [False] * 3)
        same, along, agreed = verify_and_extend(model, prev, 20, tok.pad_token_id, eos, "cpu")
        assert same == before and agreed == [len(o) for o in before]
        assert [lp.shape[0] for lp in along] == [len(o) for o in before]
        torch.manual_seed(0)
        for p in model.parameters():  # a step's worth of change, enough to part somewhere
            p.add_(torch.randn_like(p) * 0.02 * p.std())
        after = [cut(o) for o in greedy_batch(model, prompts, 20, tok.pad_token_id, "cpu")]
        drafted, _, agreed = verify_and_extend(model, prev, 20, tok.pad_token_id, eos, "cpu")
    assert drafted == after
    assert after != before and any(a < len(o) for a, o in zip(agreed, before, strict=True))
