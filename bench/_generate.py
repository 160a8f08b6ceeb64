"""Greedy or sampled answers from a transformers model to the simulator's prompts, batched: what
the hinted-teacher and replay benchmarks share (``from _generate import generate``)."""

from __future__ import annotations

from typing import Any

from clawproxy.simulate.prompts import SYSTEM_PROMPT


def _chat_ids(tok: Any, prompt: str) -> list[int]:
    msgs = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}]
    out = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(out["input_ids"])


def generate(model: Any, tok: Any, prompts: list[str], max_new_tokens: int, sample: bool,
             temperature: float = 1.0) -> list[tuple[list[int], list[int], str]]:
    """(prompt ids, completion ids up to and including EOS, text) per prompt, batched."""
    import torch

    prompt_ids = [_chat_ids(tok, p) for p in prompts]
    width = max(len(x) for x in prompt_ids)
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(x)) + x for x in prompt_ids])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in prompt_ids])
    kwargs: dict[str, Any] = {"do_sample": sample, "max_new_tokens": max_new_tokens, "pad_token_id": pad}
    if sample:
        kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, **kwargs)
    results = []
    eos = tok.eos_token_id
    for i, row in enumerate(out[:, width:].tolist()):
        comp = []
        for t in row:
            comp.append(t)
            if t == eos:
                break
        text = tok.decode([t for t in comp if t != eos], skip_special_tokens=True)
        results.append((prompt_ids[i], comp, text))
    return results
