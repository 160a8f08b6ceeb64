"""``python -m clawproxy.proxy --upstream URL [--port P] [--data-dir D]``: the proxy alone.

Used by tests (SIGKILL durability) and the benchmark to run the proxy as a real process; users run
``clawproxy start --upstream URL``, which serves the same ``create_app``.
"""

from __future__ import annotations

import argparse
import logging

import yaml

from clawproxy.config import load_config
from clawproxy.proxy.app import run_proxy
from clawproxy.proxy.redact import RedactingFilter, Redactor


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m clawproxy.proxy", description=__doc__)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--host", default=None)
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--config", default=None)
    ap.add_argument("--no-record-tokens", action="store_true")
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="any config key, e.g. --set proxy.body_timeout_s=2 (value read as YAML)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=a.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = load_config(a.config, {
        "data_dir": a.data_dir, "proxy.upstream": a.upstream, "proxy.host": a.host,
        "proxy.port": a.port, "proxy.record_tokens": False if a.no_record_tokens else None,
        **{k: yaml.safe_load(v) for k, _, v in (x.partition("=") for x in a.set)},
    })
    if cfg.proxy.redact_secrets:
        redact = RedactingFilter(Redactor(cfg.proxy.redact_patterns))
        for h in logging.getLogger().handlers:
            h.addFilter(redact)
    run_proxy(cfg)


if __name__ == "__main__":
    main()
