"""bench/oracle.py, the oracle baseline's REINFORCE loop on a tiny random model: it samples, rewards,
steps, measures."""

from __future__ import annotations

import torch

from clawproxy.simulate.personas import PREFERENCES
from clawproxy.simulate.prompts import HELDOUT_PROMPTS
from tests.bench.util import bench_module

oracle = bench_module("oracle")
OracleSettings, generate, reinforce_step = oracle.OracleSettings, oracle.generate, oracle.reinforce_step
reward_of, run_oracle = oracle.reward_of, oracle.run_oracle


def test_reinforce_step_moves_logprob_in_the_reward_direction(tiny_model_dir):
    from clawproxy.engine.model import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    torch.manual_seed(0)
    [(p, c, _)] = generate(model, tok, ["How do I boil an egg?"], max_new_tokens=6, sample=True)

    def logp() -> float:
        ids = torch.tensor([p + c])
        with torch.no_grad():
            lp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
        return float(lp[len(p) - 1 :].gather(-1, ids[0, len(p) :, None]).sum())

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = logp()
    reinforce_step(model, opt, [(p, c)], [1.0], tok.pad_token_id)
    up = logp()
    reinforce_step(model, opt, [(p, c)], [-1.0], tok.pad_token_id)
    reinforce_step(model, opt, [(p, c)], [-1.0], tok.pad_token_id)
    assert up > before and logp() < up


def test_oracle_run_produces_a_curve(tiny_model_dir):
    steps = []
    s = OracleSettings(model=str(tiny_model_dir), interactions=4, eval_every=2, batch_size=2,
                       max_new_tokens=6, eval_max_tokens=6, threads=1)
    curve = run_oracle("concise", s, on_step=steps.append)
    assert [p.interactions for p in curve.points] == [0, 2, 4]
    assert [p.weight_version for p in curve.points] == [0, 1, 2]
    assert len(steps) == 2 and all(len(st["rewards"]) == 2 for st in steps)
    assert all(r in (1.0, -1.0) for st in steps for r in st["rewards"])
    concise = PREFERENCES["concise"]
    for p in curve.points:  # held-out answers, graded by the persona's own check
        assert [a.prompt for a in p.answers] == list(HELDOUT_PROMPTS)
        assert [a.met for a in p.answers] == [bool(concise.check(a.answer)) for a in p.answers]
        assert p.preference_rate == sum(a.met for a in p.answers) / 8
        assert p.adoption == sum(a.adopted for a in p.answers) / 8 and p.adoption <= p.preference_rate
    assert curve.settings["learning_rate"] == 1e-5 and curve.wall_s > 0


def test_rewards():
    concise, bullets = PREFERENCES["concise"], PREFERENCES["bullets"]
    long60, long120 = " ".join(["word"] * 60), " ".join(["word"] * 120)
    assert reward_of(concise, "Short answer here.") == 1.0 and reward_of(concise, long60) == -1.0
    assert reward_of(concise, "Short answer here.", "graded") == 1.0
    assert reward_of(concise, long120, "graded") < reward_of(concise, long60, "graded") < 0
    assert reward_of(bullets, long60, "graded") == -1.0  # graded only means something for concise
