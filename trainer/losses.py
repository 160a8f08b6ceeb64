"""The losses, as plain functions on padded tensors (batch B, completion length T).

Read top to bottom: per-token log-probs -> advantages (binary RL, OPD, combined) -> the PPO-style
clipped surrogate against the behaviour log-probs the engine recorded.

TRL pieces used:
- ``trl.trainer.utils.selective_log_softmax``: the memory-frugal ``log_softmax -> gather`` (and its
  Triton kernel when available) for per-token log-probs.
- ``trl.trainer.utils.pad``: left-pad prompts, right-pad completions, as GRPOTrainer batches them.
- ``PackedBatch`` (tree packing) is written here: TRL 1.16 has no shared-prefix pass (its
  ``packing="tree"`` for AsyncGRPO is an open pull request, huggingface/trl#7328). The idea is the
  same: samples become one token trie, forwarded once under an ancestor mask.
- ``ppo_clipped_loss`` is the ``loss_type="dapo"``/``"bnpo"`` branch of ``GRPOTrainer._compute_loss``
  (two-sided ``epsilon_low``/``epsilon_high`` clip, the k3 KL estimator, token-level normalization,
  the low/high clip-ratio metrics). TRL keeps that code inside a trainer method that needs a whole
  GRPOTrainer, so the few lines are restated here with per-token (B, T) advantages, which
  GRPOTrainer also accepts.
- OPD's per-token advantage is the sampled-token reverse-KL signal of TRL's self-distillation
  trainers (``trl.experimental.sdpo.loss_utils.compute_sampled_token_self_distillation_loss``:
  ``(student - teacher).detach() * student_logp``), used as an advantage inside the same clipped
  surrogate so RL and OPD share one loss, one ratio and one staleness correction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from trl.trainer.utils import pad, selective_log_softmax


@dataclass
class TokenBatch:
    """A micro-batch: prompts left-padded and completions right-padded (TRL's GRPO layout)."""

    input_ids: torch.Tensor  # (B, P + T)
    attention_mask: torch.Tensor  # (B, P + T)
    completion_ids: torch.Tensor  # (B, T)
    completion_mask: torch.Tensor  # (B, T) 1 on real completion tokens


def make_token_batch(
    prompts: list[list[int]], completions: list[list[int]], pad_id: int, device: torch.device | str = "cpu"
) -> TokenBatch:
    p = [torch.tensor(x, dtype=torch.long) for x in prompts]
    c = [torch.tensor(x, dtype=torch.long) for x in completions]
    prompt_ids = pad(p, padding_value=pad_id, padding_side="left")
    prompt_mask = pad([torch.ones_like(x) for x in p], padding_value=0, padding_side="left")
    completion_ids = pad(c, padding_value=pad_id, padding_side="right")
    completion_mask = pad([torch.ones_like(x) for x in c], padding_value=0, padding_side="right")
    return TokenBatch(
        input_ids=torch.cat([prompt_ids, completion_ids], dim=1).to(device),
        attention_mask=torch.cat([prompt_mask, completion_mask], dim=1).to(device),
        completion_ids=completion_ids.to(device),
        completion_mask=completion_mask.to(device),
    )


@dataclass
class PackedBatch:
    """Samples folded into one sequence along their shared prefixes (a token trie).

    A token shared by several samples (OpenClaw's ~2.7k-token system prompt, an earlier turn of the
    same conversation) is computed once; the tree mask lets each token see exactly its own
    sample's earlier tokens, and the position ids are its depth, so every log-prob equals the
    unpacked one. Completions are read at ``keep`` and scattered to the (B, T) layout.
    """

    input_ids: torch.Tensor  # (1, N) the trie's tokens in depth-first order
    position_ids: torch.Tensor  # (1, N) each token's depth
    tree_mask: torch.Tensor  # (1, 1, N, N) bool: query row may attend to key column (its ancestors and itself)
    keep: torch.Tensor  # (K,) positions whose logits predict a completion token
    targets: torch.Tensor  # (K,) the completion tokens they predict
    rows: torch.Tensor  # (K,) sample of each kept position
    cols: torch.Tensor  # (K,) completion index of each kept position
    completion_ids: torch.Tensor  # (B, T) as TokenBatch
    completion_mask: torch.Tensor  # (B, T)


class TokenTrie:
    """The tokens of several sequences with their shared prefixes stored once; node i holds
    ``tokens[i]``, and its children by token are ``children[i + 1]`` (``children[0]``: the root's)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.children: list[dict[int, int]] = [{}]

    @property
    def size(self) -> int:
        return len(self.tokens)

    def new_tokens(self, seq: list[int]) -> int:
        """How many tokens ``seq`` would add."""
        node = -1
        for i, tok in enumerate(seq):
            node = self.children[node + 1].get(tok, -2)
            if node == -2:
                return len(seq) - i
        return 0

    def add(self, seq: list[int]) -> list[int]:
        """Insert ``seq``; returns its path (the node of each of its tokens)."""
        path, node = [], -1
        for tok in seq:
            kids = self.children[node + 1]
            if tok not in kids:
                kids[tok] = len(self.tokens)
                self.tokens.append(tok)
                self.children.append({})
            node = kids[tok]
            path.append(node)
        return path


def packed_length(sequences: list[list[int]]) -> int:
    """Tokens in the trie of ``sequences``: what one packed pass computes."""
    trie = TokenTrie()
    for seq in sequences:
        trie.add(seq)
    return trie.size


def make_packed_batch(
    prompts: list[list[int]], completions: list[list[int]], pad_id: int, device: torch.device | str = "cpu"
) -> PackedBatch:
    trie = TokenTrie()
    paths = [trie.add(list(p) + list(c)) for p, c in zip(prompts, completions, strict=True)]
    tokens, children = trie.tokens, trie.children
    # depth-first order, so each subtree is a contiguous range [tin, tout): k is an ancestor of q
    # (or q itself) exactly when tin[k] <= tin[q] < tout[k]
    n = len(tokens)
    tin, tout, depth = [0] * n, [0] * n, [0] * n
    order: list[int] = []
    stack = [(kid, 0, False) for kid in reversed(list(children[0].values()))]
    while stack:
        node, d, done = stack.pop()
        if done:
            tout[node] = len(order)
            continue
        tin[node], depth[node] = len(order), d
        order.append(node)
        stack.append((node, d, True))
        stack.extend((kid, d + 1, False) for kid in reversed(list(children[node + 1].values())))
    pos = torch.arange(n)  # position j holds node order[j], whose tin is j
    end = torch.tensor(tout)[torch.tensor(order, dtype=torch.long)]  # (N,) subtree end of each position's node
    tree_mask = (pos.unsqueeze(0) <= pos.unsqueeze(1)) & (pos.unsqueeze(1) < end.unsqueeze(0))  # [query, key]
    keep, targets, rows, cols = [], [], [], []
    for b, (p, c, path) in enumerate(zip(prompts, completions, paths, strict=True)):
        for j in range(len(c)):
            keep.append(tin[path[len(p) + j - 1]])
            targets.append(c[j])
            rows.append(b)
            cols.append(j)
    c_ids = pad([torch.tensor(x, dtype=torch.long) for x in completions], padding_value=pad_id, padding_side="right")
    c_mask = pad([torch.ones(len(x), dtype=torch.long) for x in completions], padding_value=0, padding_side="right")
    return PackedBatch(
        input_ids=torch.tensor([tokens[i] for i in order], dtype=torch.long).unsqueeze(0).to(device),
        position_ids=torch.tensor([depth[i] for i in order], dtype=torch.long).unsqueeze(0).to(device),
        tree_mask=tree_mask.view(1, 1, n, n).to(device),
        keep=torch.tensor(keep, dtype=torch.long, device=device),
        targets=torch.tensor(targets, dtype=torch.long, device=device),
        rows=torch.tensor(rows, dtype=torch.long, device=device),
        cols=torch.tensor(cols, dtype=torch.long, device=device),
        completion_ids=c_ids.to(device),
        completion_mask=c_mask.to(device),
    )


def can_pack(model: torch.nn.Module) -> bool:
    """A tree mask needs an attention that takes an arbitrary 4D mask (flash-attention kernels do not)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) in ("sdpa", "eager")


def pad_floats(rows: list[list[float]], device: torch.device | str = "cpu") -> torch.Tensor:
    return pad([torch.tensor(r, dtype=torch.float32) for r in rows], padding_value=0.0).to(device)


def completion_logps(model: torch.nn.Module, batch: TokenBatch | PackedBatch) -> torch.Tensor:
    """Log-prob of each completion token under ``model`` (B, T); zero on padding.

    Only the last T + 1 positions' logits are materialized (``logits_to_keep``, as GRPOTrainer
    does): the vocabulary projection dominates memory for small models.
    """
    if isinstance(batch, PackedBatch):
        return _packed_logps(model, batch)
    t = batch.completion_ids.size(1)
    position_ids = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=position_ids,
        logits_to_keep=t + 1,
    ).logits
    logits = logits[:, :-1, :].float()  # position i predicts token i + 1
    logps = selective_log_softmax(logits, batch.completion_ids)
    return logps * batch.completion_mask


def _packed_logps(model: torch.nn.Module, batch: PackedBatch) -> torch.Tensor:
    mask = batch.tree_mask
    if model.config._attn_implementation == "eager":  # eager adds its mask to the scores
        dtype = next(model.parameters()).dtype
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=mask,
        position_ids=batch.position_ids,
        logits_to_keep=batch.keep,
    ).logits  # (1, K, V)
    lp = selective_log_softmax(logits.float(), batch.targets.unsqueeze(0))[0]
    out = torch.zeros(batch.completion_ids.shape, dtype=lp.dtype, device=lp.device)
    return out.index_put((batch.rows, batch.cols), lp)


# -- advantages (B, T), zero on padding -----------------------------------------------------------


def rl_advantages(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Binary RL: the judge's score (+1 / -1) on every response token."""
    return scores.to(mask.dtype).unsqueeze(1) * mask


def opd_advantages(
    teacher_logps: torch.Tensor, student_logps: torch.Tensor, mask: torch.Tensor, clip: float
) -> torch.Tensor:
    """On-policy distillation: how much more the hint-conditioned teacher likes each sampled token
    than the student does, clipped to [-clip, clip]. Positive where the hint makes the token more
    likely (push it up), negative where the hint argues against it (push it down)."""
    gap = (teacher_logps - student_logps).detach()
    return gap.clamp(-clip, clip) * mask


def combined_advantages(
    scores: torch.Tensor,
    teacher_logps: torch.Tensor,
    student_logps: torch.Tensor,
    has_teacher: torch.Tensor,
    mask: torch.Tensor,
    *,
    w_rl: float,
    w_opd: float,
    clip: float,
) -> torch.Tensor:
    """w_rl * score + w_opd * clip(teacher - student); the OPD term is 0 for samples without a hint."""
    opd = opd_advantages(teacher_logps, student_logps, mask, clip) * has_teacher.to(mask.dtype).unsqueeze(1)
    return w_rl * rl_advantages(scores, mask) + w_opd * opd


# -- the clipped surrogate ------------------------------------------------------------------------


@dataclass
class LossStats:
    clip_low: float  # fraction of tokens whose ratio fell under 1 - eps_low with A < 0
    clip_high: float  # ... over 1 + eps_high with A > 0
    kl_behaviour: float  # k3 KL(behaviour || policy) per token: how off-policy the batch is
    kl_ref: float  # k3 KL to the reference model per token (0 when kl_coef is 0)
    ratio_mean: float

    @property
    def clip_frac(self) -> float:
        return self.clip_low + self.clip_high


def k3_kl(logp: torch.Tensor, other_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(other || policy) per token (GRPOTrainer's ``per_token_kl``)."""
    d = other_logp - logp
    return torch.exp(d) - d - 1


def ppo_clipped_loss(
    logps: torch.Tensor,
    behaviour_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float,
    epsilon_high: float,
    num_tokens: int | float,
    ref_logps: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, LossStats]:
    """PPO-style clipped surrogate, normalized by ``num_tokens`` (all completion tokens in the step,
    so micro-batches accumulate to a token-level mean, DAPO's normalization).

    The ratio is taken against the engine's recorded log-probs, not the trainer's own weights, so a
    sample generated by an older version is importance-corrected and its update bounded.
    """
    mask = mask.to(logps.dtype)
    log_ratio = (logps - behaviour_logps).clamp(-20.0, 20.0)  # exp() stays finite on wild samples
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    kl_ref = torch.zeros_like(per_token)
    if ref_logps is not None and kl_coef:
        kl_ref = k3_kl(logps, ref_logps)
        per_token = per_token + kl_coef * kl_ref
    loss = (per_token * mask).sum() / max(float(num_tokens), 1.0)

    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        low = ((ratio < 1 - epsilon_low) & (advantages < 0)).to(mask.dtype)
        high = ((ratio > 1 + epsilon_high) & (advantages > 0)).to(mask.dtype)
        stats = LossStats(
            clip_low=float((low * mask).sum() / n),
            clip_high=float((high * mask).sum() / n),
            kl_behaviour=float((k3_kl(logps, behaviour_logps) * mask).sum() / n),
            kl_ref=float((kl_ref * mask).sum() / n),
            ratio_mean=float((ratio * mask).sum() / n),
        )
    return loss, stats


def pack_groups(sequences: list[list[int]], budget: int) -> list[list[int]]:
    """Indices of ``sequences`` in passes, in order: a sequence joins the current pass while the
    pass's trie stays within ``budget`` tokens (one longer than the budget gets a pass alone)."""
    groups: list[list[int]] = []
    trie = TokenTrie()
    for i, seq in enumerate(sequences):
        if not groups or trie.size + trie.new_tokens(seq) > budget:
            groups.append([])
            trie = TokenTrie()
        groups[-1].append(i)
        trie.add(seq)
    return groups
