"""Re-read recorded answers with today's tool-call scanner: how many text answers that looked like a
malformed call (``agent_tasks.malformed``) now parse as calls, and how many ordinary answers would
turn into calls (they must not).

Only answers that stopped and were offered tools count: a cut-off answer cannot hold a whole call.

    .venv/bin/python bench/reparse_calls.py /tmp/clawproxy-agent-learn-*/data
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from _env import ROOT  # noqa: F401  (this checkout's code first)

from clawproxy.engine.toolcalls import ToolCallScanner
from clawproxy.simulate.agent_tasks import malformed, offered_tools
from clawproxy.store import Store


def reparse(db: Path) -> tuple[Counter, list[dict]]:
    counts, changed = Counter({"text answers": 0, "malformed": 0, "malformed, now calls": 0, "ordinary, now calls": 0}), []
    store = Store.reader(db)
    try:
        last = 0
        while page := store.turns_page(None, last, 200):
            last = page[-1]["id"]
            for t in page:
                tools = offered_tools(t)
                if t["kind"] != "main" or not tools or t["finish_reason"] != "stop" or t["response_tool_calls"]:
                    continue
                counts["text answers"] += 1
                why = malformed(t)
                counts["malformed"] += bool(why)
                calls = ToolCallScanner(tools).finish(t["response_text"] or "").calls
                if calls:
                    counts["malformed, now calls" if why else "ordinary, now calls"] += 1
                    changed.append({"turn_id": t["id"], "was": why, "calls": [c.name for c in calls],
                                    "text": (t["response_text"] or "")[:120]})
    finally:
        store.close()
    return counts, changed


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data_dirs", nargs="+", type=Path, help="clawproxy data dirs (each holds clawproxy.db)")
    args = ap.parse_args(argv)
    total: Counter = Counter()
    for d in args.data_dirs:
        counts, changed = reparse(d / "clawproxy.db")
        total.update(counts)
        print(json.dumps({"data_dir": str(d), **counts}))
        for c in changed:
            print("  " + json.dumps(c, ensure_ascii=False))
    print(json.dumps({"total": dict(total)}))


if __name__ == "__main__":
    main()
