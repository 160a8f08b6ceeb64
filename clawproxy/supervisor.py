"""`clawproxy start`: the proxy in this process, the engine, judge and trainer as supervised children.

Each child is a real process with its own log under ``<data_dir>/logs/`` (appended, never wiped). A
child that dies is restarted with exponential backoff; while the embedded engine is down the proxy
answers a JSON 503 at once instead of hanging. Children get SIGTERM when the supervisor stops and,
through ``PR_SET_PDEATHSIG``, also when it is killed outright, so nothing is orphaned. The proxy's
recorder is drained on shutdown (the aiohttp cleanup context), so no recorded turn is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from clawproxy.config import Config
from clawproxy.errors import ConfigError

log = logging.getLogger("clawproxy")

BACKOFF_MAX_S = 30.0
ENGINE_TOKEN_ENV = "CLAWPROXY_ENGINE_CONTROL_TOKEN"  # read by `python -m clawproxy.engine`
STOP_GRACE_S = 10.0


def _die_with_parent() -> None:
    """Runs in the child before exec: ask the kernel for SIGTERM when the supervisor dies."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    os.setpgrp()  # own process group: a terminal's Ctrl-C reaches the supervisor only


class Child:
    """One supervised process: started, watched, restarted with backoff, stopped on shutdown."""

    def __init__(self, name: str, argv: list[str], log_path: Path, health_url: str | None = None,
                 env: dict[str, str] | None = None):
        self.name = name
        self.argv = argv
        self.env = env  # None: inherit ours
        self.log_path = log_path
        self.health_url = health_url
        self.proc: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()
        self.restarts = 0
        self._stopping = False
        self._task: asyncio.Task | None = None

    def is_ready(self) -> bool:
        return self.ready.is_set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"child:{self.name}")

    async def _run(self) -> None:
        backoff = 1.0
        while not self._stopping:
            started = time.monotonic()
            with open(self.log_path, "ab", buffering=0) as logf:
                logf.write(f"\n==== {time.strftime('%F %T')} starting {self.name}: {' '.join(self.argv)}\n".encode())
                self.proc = await asyncio.create_subprocess_exec(
                    *self.argv, stdout=logf, stderr=logf, stdin=asyncio.subprocess.DEVNULL,
                    preexec_fn=_die_with_parent, env=self.env,
                )
            log.info("%s started (pid %d), log: %s", self.name, self.proc.pid, self.log_path)
            probe = asyncio.create_task(self._probe(), name=f"probe:{self.name}")
            try:
                code = await self.proc.wait()
            finally:
                probe.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await probe
                self.ready.clear()
            if self._stopping:
                return
            if time.monotonic() - started > 60:
                backoff = 1.0
            self.restarts += 1
            log.warning("%s exited with code %s; restarting in %.0f s (see %s)",
                        self.name, code, backoff, self.log_path)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _probe(self) -> None:
        if self.health_url is None:
            self.ready.set()
            return
        while True:
            ok = await asyncio.to_thread(_http_ok, self.health_url)
            if ok:
                self.ready.set()
                return
            await asyncio.sleep(0.5)

    async def stop(self) -> None:
        self._stopping = True
        proc = self.proc
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
            except TimeoutError:
                log.warning("%s did not stop in %.0f s; killing it", self.name, STOP_GRACE_S)
                proc.kill()
                await proc.wait()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


# Readiness probes go straight to the child: urlopen would send even 127.0.0.1 through
# $http_proxy unless $no_proxy lists it, and the engine would never count as ready.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http_ok(url: str) -> bool:
    try:
        with _OPENER.open(url, timeout=2) as r:
            return r.status == 200
    except Exception:
        return False


def _setup_logging(data_dir: Path) -> None:
    (data_dir / "logs").mkdir(parents=True, exist_ok=True, mode=0o700)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    if not any(getattr(h, "_clawproxy", False) for h in root.handlers):
        for h in (logging.StreamHandler(sys.stderr), logging.FileHandler(data_dir / "logs" / "clawproxy.log")):
            h.setFormatter(fmt)
            h._clawproxy = True  # type: ignore[attr-defined]
            root.addHandler(h)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _write_run_config(cfg: Config) -> Path:
    """The effective config (file + flags) for the children, so they all see the same settings."""
    import yaml

    path = cfg.data_path / "run-config.yaml"
    path.write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
    os.chmod(path, 0o600)
    return path


def build_children(cfg: Config, run_config: Path) -> tuple[Child | None, list[Child]]:
    """The engine (None with --upstream) and the workers, as argv lists."""
    py, logs, data = sys.executable, cfg.data_path / "logs", str(cfg.data_path)
    engine = None
    if cfg.proxy.upstream is None:
        e = cfg.engine
        argv = [py, "-m", "clawproxy.engine", "--model", e.model, "--host", e.host,
                "--port", str(e.port), "--data-dir", data, "--dtype", e.dtype, "--device", e.device,
                "--max-batch-size", str(e.max_batch_size),
                "--default-max-tokens", str(e.default_max_tokens),
                "--prefill-chunk-tokens", str(e.prefill_chunk_tokens),
                "--prefix-cache-mb", str(e.prefix_cache_mb)]
        if e.max_model_len is not None:
            argv += ["--max-model-len", str(e.max_model_len)]
        if e.rope_scaling:
            argv += ["--rope-scaling", json.dumps(e.rope_scaling)]
        if e.served_model_name:
            argv += ["--served-model-name", e.served_model_name]
        env = None
        if e.control_token:  # not on the command line, which every local user can read
            env = {**os.environ, ENGINE_TOKEN_ENV: e.control_token}
        engine = Child("engine", argv, logs / "engine.log", f"http://{e.host}:{e.port}/health", env)
    cli = [py, "-m", "clawproxy.cli"]
    workers = []
    if cfg.judge.enabled:
        workers.append(Child("judge", [*cli, "judge", "run", "--follow", "--config", str(run_config),
                                       "--data-dir", data], logs / "judge.log"))
    if cfg.trainer.enabled:
        workers.append(Child("trainer", [*cli, "train", "--follow", "--config", str(run_config),
                                         "--data-dir", data, "--engine-url", engine_url(cfg)],
                             logs / "trainer.log"))
    return engine, workers


def engine_url(cfg: Config) -> str:
    if cfg.proxy.upstream is not None:
        return cfg.proxy.upstream
    return f"http://{cfg.engine.host}:{cfg.engine.port}"


def _check_port_free(host: str, port: int) -> None:
    """Refuse to start the engine on a taken port: the proxy would talk to whatever holds it
    (often an engine left over from an earlier run) and the new engine would restart forever."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise ConfigError(f"the engine port {host}:{port} is taken ({e.strerror}); stop what holds "
                          "it or pick another with --engine-port.") from e


def run(cfg: Config) -> None:
    from clawproxy import aio

    aio.run(_main(cfg))


async def _main(cfg: Config) -> None:
    from aiohttp import web

    from clawproxy.proxy.app import create_app
    from clawproxy.store import Store

    data = cfg.data_path
    try:
        data.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(data, 0o700)
        _setup_logging(data)
        Store(cfg.db_path).close()  # create/migrate up front: a broken store is a clear startup error
        run_config = _write_run_config(cfg)
    except OSError as e:
        raise ConfigError(f"cannot use the data dir {data} ({e.strerror or e}); pass a writable "
                          "directory with --data-dir.") from e

    engine, workers = build_children(cfg, run_config)
    if engine is not None:
        _check_port_free(cfg.engine.host, cfg.engine.port)
    proxy_cfg = dataclasses.replace(cfg, proxy=dataclasses.replace(cfg.proxy, upstream=engine_url(cfg)))
    ready: Callable[[], bool] | None = engine.is_ready if engine else None

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    children = [c for c in (engine, *workers) if c is not None]
    runner = web.AppRunner(
        create_app(proxy_cfg, upstream_ready=ready), handle_signals=False, shutdown_timeout=15.0
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, cfg.proxy.host, cfg.proxy.port)
        try:
            await site.start()
        except OSError as e:
            raise ConfigError(f"cannot listen on {cfg.proxy.host}:{cfg.proxy.port} ({e.strerror}); "
                              "is another clawproxy running? Pick another port with --port.") from e
        if engine is not None:
            engine.start()
        url = f"http://{cfg.proxy.host}:{cfg.proxy.port}/v1"
        log.info("proxy listening on %s -> %s (data: %s)", url, engine_url(cfg), data)
        if engine is not None:
            waiter = asyncio.create_task(engine.ready.wait(), name="wait:engine-ready")
            stopper = asyncio.create_task(stop.wait(), name="wait:stop")
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            for t in (waiter, stopper):
                t.cancel()
        for w in workers:
            w.start()
        if not stop.is_set():
            print(
                f"\nclawproxy is ready. Give OpenClaw this baseUrl: {url}\n"
                f"  config snippet: clawproxy openclaw-config --port {cfg.proxy.port}\n"
                f"  what was collected: clawproxy sessions --data-dir {data}\n"
                "  stop: Ctrl-C\n",
                flush=True,
            )
        await stop.wait()
        log.info("shutting down")
    finally:
        # Stop taking requests and let in-flight ones finish while the engine still serves;
        # the app's cleanup drains the recorder into the store. Then stop the children.
        await runner.cleanup()
        for c in reversed(children):
            await c.stop()
        log.info("stopped")
