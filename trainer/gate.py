"""The publish gate: new weights reach the engine only if they pass every check.

Checks, each reported by name in the gate report (stored with the step and shown by ``stats``):

- ``loss_finite`` / ``grad_finite``: the step's loss and pre-clip gradient norm are finite.
- ``weights_finite``: no NaN/inf in any trainable tensor after the optimizer step.
- ``canaries``: greedy answers to ``trainer.canary_prompts`` are not degenerate (empty, looping on
  token ids, or a sentence looped with small variations, judged on the text as the proxy does).
  Judged relative to the previous version: a prompt the old weights already answered badly does not
  block (a random-init test model loops everywhere); a prompt that *became* degenerate does.
- ``divergence``: mean per-token KL(previous || new) over the previous version's canary
  continuations is at most ``trainer.gate_max_kl``: one step must not rewrite the model.

The previous version's canary continuations and their full next-token distributions are computed
once per version (``canary_reference``) and kept in memory.

The new weights' greedy canary answers are found as speculative decoding finds them, with the
previous version's answers as the draft (``verify_and_extend``): the one forward pass the divergence
check makes over each previous answer also gives the new weights' greedy token at every position,
so the answer is taken as far as the two agree, and only the rest is generated. One step moves the
model a little: on a CPU, where generating token by token is most of the gate, most of each answer
is checked in that one pass. The answers are the new weights' own greedy ones either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from clawproxy.degenerate import canary_broken
from trainer.config import TrainerConfig


@dataclass
class CanaryReference:
    version: int
    prompts: list[list[int]]
    outputs: list[list[int]]
    logprobs: list[torch.Tensor]  # per canary: (len(output), vocab) log-softmax, CPU float32
    degenerate: list[bool]

    @property
    def finite(self) -> bool:
        """Computed from finite weights: only such a reference is worth keeping."""
        return all(bool(torch.isfinite(lp).all()) for lp in self.logprobs)


@dataclass
class GateReport:
    ok: bool
    failed: list[str] = field(default_factory=list)
    checks: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "failed": self.failed, **self.checks}


def canary_prompt_ids(tokenizer: Any, prompts: list[str]) -> list[list[int]]:
    out = []
    for p in prompts:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        out.append([int(t) for t in ids])
    return out


@torch.no_grad()
def _continuation_logprobs(model: torch.nn.Module, prompt: list[int], output: list[int], device: Any) -> torch.Tensor:
    ids = torch.tensor([prompt + output], device=device)
    logits = model(input_ids=ids, logits_to_keep=len(output) + 1).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).cpu()


def greedy_batch(model: Any, prompts: list[list[int]], max_new_tokens: int, pad_id: int | None,
                 device: Any) -> list[list[int]]:
    """Greedy continuations of all ``prompts`` in one left-padded ``generate``: decoding is bound by
    reading the weights, so six canaries cost about what one does on a CPU."""
    width = max(len(p) for p in prompts)
    pad = 0 if pad_id is None else pad_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=pad)
    return [[int(t) for t in row[width:].tolist()] for row in out]


def _until_eos(ids: list[int], eos: Any) -> list[int]:
    """``ids`` up to and including the first EOS (generate pads after it)."""
    for i, t in enumerate(ids):
        if t in eos:
            return ids[: i + 1]
    return ids


@torch.no_grad()
def verify_and_extend(model: Any, previous: CanaryReference, max_new_tokens: int, pad_id: int | None,
                      eos: Any, device: Any) -> tuple[list[list[int]], list[torch.Tensor], list[int]]:
    """The new weights' greedy answers to the canaries, drafted by the previous version's answers.

    Returns the answers, the log-softmax along each *previous* answer under the new weights (what
    the divergence check needs), and per canary how many draft tokens the new weights agreed with.
    """
    outputs, along_previous, agreed = [], [], []
    todo: list[int] = []
    for i, (prompt, draft) in enumerate(zip(previous.prompts, previous.outputs, strict=True)):
        ids = torch.tensor([prompt + draft], device=device)
        logits = model(input_ids=ids, logits_to_keep=len(draft) + 1).logits[0].float()
        along_previous.append(torch.log_softmax(logits[:-1], dim=-1).cpu())
        greedy = logits.argmax(-1).tolist()  # the new weights' token after each prefix of the draft
        k = next((j for j, t in enumerate(draft) if greedy[j] != t), len(draft))
        agreed.append(k)
        out = draft[:k]
        ended = bool(out) and out[-1] in eos
        if k < len(draft):
            out = out + [greedy[k]]  # the first token where they part: the new weights' own
            ended = greedy[k] in eos
        elif not ended and len(out) < max_new_tokens:
            out = out + [greedy[len(draft)]]  # the draft stopped short without an EOS
            ended = out[-1] in eos
        outputs.append(out)
        if not ended and len(out) < max_new_tokens:
            todo.append(i)
    if todo:  # generate the rest of the answers that parted from their drafts, in one batch
        rest = greedy_batch(model, [previous.prompts[i] + outputs[i] for i in todo],
                            max_new_tokens - min(len(outputs[i]) for i in todo), pad_id, device)
        for i, more in zip(todo, rest, strict=True):
            outputs[i] = _until_eos(outputs[i] + more[: max_new_tokens - len(outputs[i])], eos)
    return outputs, along_previous, agreed


@torch.no_grad()
def canary_reference(
    model: torch.nn.Module, tokenizer: Any, cfg: TrainerConfig, version: int, accelerator: Any
) -> CanaryReference:
    """Greedy answers of ``model`` to the canaries and the distributions along them.

    ``generate`` runs under TRL's ``unwrap_model_for_generation`` (it gathers DeepSpeed ZeRO-3
    shards; on one device it yields the unwrapped model).
    """
    from trl.models.utils import unwrap_model_for_generation

    from clawproxy.engine.model import eos_token_ids

    device = accelerator.device
    eos = eos_token_ids(model, tokenizer)
    prompts = canary_prompt_ids(tokenizer, cfg.canary_prompts)
    was_training = model.training
    model.eval()
    outputs, logprobs, degenerate = [], [], []
    try:
        with unwrap_model_for_generation(model, accelerator) as gen:
            generated = greedy_batch(gen, prompts, cfg.canary_max_tokens, tokenizer.pad_token_id, device)
        for prompt, gen_ids in zip(prompts, generated, strict=True):
            gen_ids = _until_eos(gen_ids, eos)
            outputs.append(gen_ids)
            logprobs.append(_continuation_logprobs(model, prompt, gen_ids, device))
            degenerate.append(canary_broken(
                gen_ids, eos, lambda ids: tokenizer.decode(ids, skip_special_tokens=True)))
    finally:
        model.train(was_training)
    return CanaryReference(version, prompts, outputs, logprobs, degenerate)


def _params_finite(model: torch.nn.Module) -> tuple[bool, str | None]:
    for name, p in model.named_parameters():
        if p.requires_grad and not torch.isfinite(p).all():
            return False, name
    return True, None


@torch.no_grad()
def check(
    model: torch.nn.Module,
    tokenizer: Any,
    cfg: TrainerConfig,
    previous: CanaryReference,
    *,
    loss: float,
    grad_norm: float,
    accelerator: Any,
) -> tuple[GateReport, CanaryReference | None]:
    """Run every check on the updated ``model``. Returns the report and, when the weights are
    finite, the new version's canary reference (reused as ``previous`` for the next step)."""
    report = GateReport(ok=True)

    def fail(name: str, detail: Any) -> None:
        report.ok = False
        report.failed.append(name)
        report.checks[name] = detail

    if not math.isfinite(loss):
        fail("loss_finite", loss)
    if not math.isfinite(grad_norm):
        fail("grad_finite", grad_norm)
    finite, bad = _params_finite(model)
    if not finite:
        fail("weights_finite", f"non-finite values in {bad}")
        return report, None  # generating from NaN weights tells nothing more

    from trl.models.utils import unwrap_model_for_generation

    from clawproxy.engine.model import eos_token_ids

    device = accelerator.device
    eos = eos_token_ids(model, tokenizer)
    was_training = model.training
    model.eval()
    try:
        with unwrap_model_for_generation(model, accelerator) as gen:
            outputs, along_previous, agreed = verify_and_extend(
                gen, previous, cfg.canary_max_tokens, tokenizer.pad_token_id, eos, device)
        logprobs = [lp if out == draft else _continuation_logprobs(model, prompt, out, device)
                    for prompt, draft, out, lp in zip(previous.prompts, previous.outputs, outputs, along_previous,
                                                      strict=True)]
    finally:
        model.train(was_training)
    degenerate = [canary_broken(out, eos, lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
                  for out in outputs]
    new = CanaryReference(previous.version + 1, previous.prompts, outputs, logprobs, degenerate)
    newly_bad = [
        cfg.canary_prompts[i]
        for i, (was, now) in enumerate(zip(previous.degenerate, new.degenerate, strict=True))
        if now and not was
    ]
    report.checks["canary_outputs"] = [tokenizer.decode(o, skip_special_tokens=True)[:200] for o in new.outputs]
    report.checks["canary_tokens_drafted"] = [f"{a}/{len(o)}" for a, o in zip(agreed, outputs, strict=True)]
    if newly_bad:
        fail("canaries", {"degenerate": newly_bad})

    kls = [float((prev_lp.exp() * (prev_lp - new_lp)).sum(-1).mean())
           for prev_lp, new_lp in zip(previous.logprobs, along_previous, strict=True)]
    kl = sum(kls) / max(len(kls), 1)
    report.checks["divergence_kl"] = kl
    if not math.isfinite(kl) or kl > cfg.gate_max_kl:
        fail("divergence", {"kl": kl, "max": cfg.gate_max_kl})
    return report, new
