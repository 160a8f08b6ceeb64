"""The OpenClaw provider block that fits the model behind the proxy (`clawproxy openclaw-config`).

OpenClaw believes the provider block as written and never reads ``/v1/models``. Before each call it
estimates the prompt as ``ceil(chars * 1.25 / 4)`` over the message text and the JSON of the tool
schemas (about 18% above SmolLM2's real token count) and sends ``max_completion_tokens =
min(maxTokens, contextWindow - estimate - 1)``, never below 1. A ``contextWindow`` above the
server's real limit makes the server answer 400, which OpenClaw takes for a context overflow and
cannot recover from. So the block carries the server's real context length, and a prompt profile
whose first request leaves room for a useful answer (docs/openclaw-wire.md §1.4 has the
measurements).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawproxy.store.lifecycle import LEARN_HEADER

OPENCLAW_MIN_CONTEXT = 4000  # OpenClaw refuses to run a model with a smaller context window
PROVIDER_ID = "clawproxy"


@dataclass(frozen=True)
class Profile:
    """An OpenClaw prompt profile: the settings that shape its prompt, and what its prompt costs."""

    name: str
    help: str
    settings: dict[str, Any]
    model_compat: dict[str, Any]
    # OpenClaw's own estimate of its first request (tokens), by context window: the prompt grows a
    # little with the window. Measured with `bench/openclaw_prompts.py` on openclaw 2026.9.6.
    estimate: tuple[tuple[int, int], ...]

    def estimated_prompt(self, context_window: int) -> int:
        """OpenClaw's estimate of this profile's first request at ``context_window``."""
        est = self.estimate[0][1]
        for ctx, tokens in self.estimate:
            if context_window >= ctx:
                est = tokens
        return est


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "default",
            "OpenClaw as it ships: every tool behind tool search, skills, workspace files.",
            {},
            {},
            ((0, 9_126), (32_768, 10_036), (131_072, 11_210)),
        ),
        Profile(
            "lean",
            "Files and shell only (read, write, edit, exec), no skills, no injected workspace "
            "files, no memory plugin.",
            {
                "tools": {"allow": ["read", "write", "edit", "exec"], "toolSearch": False},
                "agents": {"defaults": {"skills": [], "contextInjection": "never"}},
                "plugins": {"slots": {"memory": "none"}},
            },
            {},
            ((0, 3_421),),
        ),
        Profile(
            "chat",
            "No tools at all: OpenClaw's system prompt and the conversation only.",
            {
                "agents": {"defaults": {"skills": [], "contextInjection": "never"}},
                "plugins": {"slots": {"memory": "none"}},
            },
            {"supportsTools": False},
            ((0, 2_298),),
        ),
    )
}
RICHEST_FIRST = ("default", "lean", "chat")


@dataclass
class Plan:
    """What `openclaw-config` chose, and why."""

    profile: Profile
    context_window: int
    max_tokens: int
    reasons: list[str]
    warnings: list[str]


def default_max_tokens(context_window: int) -> int:
    """An answer cap that grows with the context: 512 at 8k, 2048 at 32k, at most 8192."""
    return max(256, min(8192, context_window // 16))


def plan(context_window: int, max_tokens: int | None = None, profile: str | None = None,
         model: str | None = None) -> Plan:
    """Choose the richest profile whose first request leaves room for an answer and a conversation.

    A profile fits when its estimated first request plus ``max_tokens`` fits the window and takes at
    most half of it, so a few turns fit before OpenClaw compacts (at 75% of the window). A named
    model (``clawproxy/catalog.py``) caps the choice at the richest profile it is measured to work with.
    """
    from clawproxy.catalog import lookup

    named = lookup(model) if model else None
    cap = named.openclaw_profile if named else None
    answer = max_tokens or default_max_tokens(context_window)
    reasons: list[str] = []
    warnings: list[str] = []
    if context_window < OPENCLAW_MIN_CONTEXT:
        warnings.append(
            f"the model's context ({context_window} tokens) is below OpenClaw's minimum "
            f"({OPENCLAW_MIN_CONTEXT}): OpenClaw will refuse it. Serve a longer context "
            "(engine.max_model_len / engine.rope_scaling, or vllm serve --max-model-len).")
    if profile is not None:
        chosen = PROFILES[profile]
        reasons.append(f"profile {profile!r} as asked (--profile)")
    else:
        chosen = PROFILES[RICHEST_FIRST[-1]]
        for name in RICHEST_FIRST:
            p = PROFILES[name]
            if cap is not None and RICHEST_FIRST.index(name) < RICHEST_FIRST.index(cap):
                reasons.append(f"not {name!r}: {model} is measured to work with {cap!r} at most "
                               "(`clawproxy models list`)")
                continue
            est = p.estimated_prompt(context_window)
            if est + answer + 1 <= context_window and est <= context_window // 2:
                chosen = p
                break
            reasons.append(f"not {name!r}: its first request is ~{est} tokens by OpenClaw's count")
        reasons.append(f"profile {chosen.name!r}: {chosen.help}")
    est = chosen.estimated_prompt(context_window)
    room = context_window - est - 1
    if room < answer:
        warnings.append(
            f"profile {chosen.name!r} leaves ~{max(room, 0)} tokens for an answer in a "
            f"{context_window}-token context, fewer than maxTokens={answer}: answers will be cut "
            "short. Serve a longer context or choose a leaner --profile.")
    if room < 256:
        warnings.append("OpenClaw's prompt leaves almost no room for an answer with this model.")
    return Plan(chosen, context_window, answer, reasons, warnings)


def deep_merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overlay`` merged in; nested dicts merge, everything else is replaced."""
    out = copy.deepcopy(base)
    for k, v in overlay.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def provider_block(base_url: str, model_id: str, api_key: str, p: Plan,
                   sampling: dict[str, float] | None = None, learn: bool = True) -> dict[str, Any]:
    """The openclaw.json fragment that routes OpenClaw through the proxy with plan ``p``;
    ``learn=False``: its conversations are recorded but never judged or trained on."""
    ref = f"{PROVIDER_ID}/{model_id}"
    model_defaults: dict[str, Any] = {"model": {"primary": ref}}
    if sampling:
        model_defaults["models"] = {ref: {"params": dict(sampling)}}
    block: dict[str, Any] = {
        "agents": {"defaults": model_defaults},
        "models": {
            "mode": "merge",
            "providers": {
                PROVIDER_ID: {
                    "baseUrl": base_url,
                    "apiKey": api_key,
                    "api": "openai-completions",
                    # the proxy's own read timeout: on a CPU the first token of a long prompt takes minutes
                    "timeoutSeconds": 1800,
                    **({} if learn else {"headers": {LEARN_HEADER: "off"}}),
                    "models": [{
                        "id": model_id,
                        "name": f"{model_id} via clawproxy",
                        "reasoning": False,
                        "input": ["text"],
                        "contextWindow": p.context_window,
                        "maxTokens": p.max_tokens,
                        # session_id / x-session-affinity headers: exact session identity.
                        "compat": {"sendSessionAffinityHeaders": True, **p.profile.model_compat},
                    }],
                }
            },
        },
    }
    return deep_merge(block, p.profile.settings)


def render(block: dict[str, Any], p: Plan, source: str) -> str:
    """The block as JSON5 with a header comment that says what was chosen and why."""
    lines = [f"// clawproxy: context {p.context_window} tokens ({source}), maxTokens {p.max_tokens}"]
    lines += [f"// {r}" for r in p.reasons]
    lines += [f"// WARNING: {w}" for w in p.warnings]
    lines.append("// merge into ~/.openclaw/openclaw.json (or run with --write)")
    return "\n".join(lines) + "\n" + json.dumps(block, indent=2) + "\n"


def openclaw_config_path() -> Path:
    """Where OpenClaw reads its config: $OPENCLAW_CONFIG_PATH, else ~/.openclaw/openclaw.json."""
    if os.environ.get("OPENCLAW_CONFIG_PATH"):
        return Path(os.environ["OPENCLAW_CONFIG_PATH"]).expanduser()
    state = os.environ.get("OPENCLAW_STATE_DIR")
    if state:
        return Path(state).expanduser() / "openclaw.json"
    return Path("~/.openclaw/openclaw.json").expanduser()


def write_config(block: dict[str, Any], path: Path) -> Path | None:
    """Merge ``block`` into the OpenClaw config at ``path``; returns the backup's path (if any).

    The existing file is JSON5 (comments allowed); comments do not survive the rewrite, so the
    original is kept beside it as ``openclaw.json.bak-<time>``. Our provider entry is replaced whole.
    """
    import json5

    from clawproxy.errors import ConfigError

    current: dict[str, Any] = {}
    backup = None
    if path.exists():
        try:
            current = json5.loads(path.read_text(encoding="utf-8")) or {}
        except ValueError as e:
            raise ConfigError(f"{path} is not valid JSON5 ({e}); fix it or move it away, then "
                              "run again.") from None
        if not isinstance(current, dict):
            raise ConfigError(f"{path} does not hold a JSON object; fix it or move it away.")
        backup = path.with_name(f"{path.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}")
        shutil.copy2(path, backup)
        providers = ((current.get("models") or {}).get("providers") or {})
        providers.pop(PROVIDER_ID, None)
    merged = deep_merge(current, block)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(merged, indent=2) + "\n", encoding="utf-8")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return backup
