"""Does the served model answer OpenClaw's questions under vLLM's bare defaults and under the
publisher's sampling defaults (``clawproxy/catalog.py``: ``NamedModel.sampling``)?

OpenClaw sends no temperature, top_p or top_k, so the engine's defaults decide how an answer is
sampled. This takes the system prompt of the first main turn recorded in a clawproxy data dir (one
`openclaw agent --local -m "hi"` through the proxy makes one), asks each fixed question under it ``n``
times per setting, and counts the answers that name the right word, those with a ``MEDIA:`` line
(OpenClaw turns it into an attachment), and those that leave the user nothing once OpenClaw strips
its reply tags and MEDIA: lines.

    .venv/bin/python bench/sampling_defaults.py --data-dir DATA --engine-url http://127.0.0.1:8100 \\
        --model qwen2.5-coder-1.5b --n 10

Figures: bench/results/sampling-defaults.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
from pathlib import Path

from _env import ROOT  # noqa: F401  (sets up the environment)

from clawproxy import catalog
from clawproxy.httpjson import request_json

QUESTIONS = (  # general knowledge, one right word each; not from any judge or simulator set
    ("What is the capital of France?", "paris"),
    ("Which planet is the largest in our solar system?", "jupiter"),
    ("What is the chemical symbol for gold? Answer in one short sentence.", "au"),
    ("How many legs does a spider have?", "eight|8"),
    ("Who wrote Romeo and Juliet?", "shakespeare"),
    ("What gas do plants take in from the air to make sugar?", "carbon dioxide|co2|co₂"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", required=True, help="A clawproxy data dir holding one OpenClaw turn.")
    p.add_argument("--engine-url", required=True, help="The vLLM serving --model.")
    p.add_argument("--model", default="qwen2.5-coder-1.5b", help="Served name; its catalog entry gives the defaults.")
    p.add_argument("--n", type=int, default=10, help="Answers per question and setting.")
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--out", default=None, help="Write every answer as JSON here.")
    return p.parse_args(argv)


def system_prompt(data_dir: str) -> list[dict]:
    db = sqlite3.connect(Path(data_dir) / "clawproxy.db")
    row = db.execute("SELECT request_messages FROM turns WHERE kind='main' ORDER BY id LIMIT 1").fetchone()
    if row is None:
        raise SystemExit(f"{data_dir} holds no main turn: send one OpenClaw message through the proxy first")
    return [m for m in json.loads(row[0]) if m["role"] in ("system", "developer")]


def left_for_user(text: str) -> str:
    """What OpenClaw shows of an answer: reply tags ([[reply_to_current]]) and MEDIA: lines removed."""
    text = re.sub(r"\[\[[^\]]*\]\]", "", text)
    return "\n".join(line for line in text.splitlines() if not line.strip().startswith("MEDIA:")).strip()


def ask(url: str, body: dict) -> list[str]:
    out = request_json("POST", url.rstrip("/") + "/v1/chat/completions", body, timeout=1800)
    return [c["message"]["content"] or "" for c in out["choices"]]


def main() -> None:
    a = parse_args()
    prefix = system_prompt(a.data_dir)
    publisher = dict(catalog.get(a.model).sampling)
    # vLLM's own defaults with no generation_config.json: what the served model did before
    settings = {"bare (T=1, top_p=1, no top_k, no penalty)":
                {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0},
                f"publisher {publisher}": publisher}
    results = {}
    for label, params in settings.items():
        rows = []
        for question, right in QUESTIONS:
            body = {"model": a.model, "messages": [*prefix, {"role": "user", "content": question}],
                    "n": a.n, "max_tokens": a.max_tokens, **params}
            for text in ask(a.engine_url, body):
                low = text.lower()
                rows.append({"question": question, "text": text,
                             "right": any(w in low for w in right.split("|")),
                             "media": any(line.strip().startswith("MEDIA:") for line in text.splitlines()),
                             "empty": not left_for_user(text)})
        results[label] = rows
        total = len(rows)
        print(f"{label}: right {sum(r['right'] for r in rows)}/{total}, "
              f"MEDIA {sum(r['media'] for r in rows)}/{total}, "
              f"nothing left for the user {sum(r['empty'] for r in rows)}/{total}",
              flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
