"""`clawproxy start`: the proxy in this process, the engine, judge and trainer as supervised children.

Each child is a real process with its own log under ``<data_dir>/logs/`` (appended, never wiped). A
child that dies is restarted with exponential backoff; while the engine is down the proxy answers a
JSON 503 at once instead of hanging. Children get SIGTERM when the supervisor stops and, through
``PR_SET_PDEATHSIG``, also when it is killed outright. Each child leads its own process group, and
what it leaves there when it exits (vLLM's engine core and workers) is killed, so nothing is
orphaned. The proxy's recorder is drained on shutdown (the aiohttp cleanup context), so no recorded
turn is lost. The judge and the trainer run niced (``BACKGROUND_NICE``): the user's request first.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import logging
import logging.handlers
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from io import TextIOWrapper
from pathlib import Path

from clawproxy.config import Config
from clawproxy.engine.client import TRANSIENT, EngineClient
from clawproxy.errors import ConfigError, EngineError, StoreError
from clawproxy.httpjson import answers_ok

log = logging.getLogger("clawproxy")

BACKOFF_MAX_S = 30.0
STOP_GRACE_S = 10.0
# the judge and the trainer run below the engine and the proxy: on a CPU they share with the engine,
# an equal-priority trainer cut llama.cpp's decoding from 6.0 to 1.1 tok/s (bench/results/i51)
BACKGROUND_NICE = 10


def _die_with_parent() -> None:
    """Runs in the child before exec: ask the kernel for SIGTERM when the supervisor dies."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    os.setpgrp()  # own process group: a terminal's Ctrl-C reaches the supervisor only


def _background(nice: int) -> Callable[[], None]:
    """``_die_with_parent``, then ``nice`` added to the child's niceness (0: as the supervisor's)."""
    def preexec() -> None:
        _die_with_parent()
        if nice:
            with contextlib.suppress(OSError):
                os.nice(nice)
    return preexec


class Child:
    """One supervised process: started, watched, restarted with backoff, stopped on shutdown."""

    def __init__(self, name: str, argv: list[str], log_path: Path, health_url: str | None = None,
                 nice: int = 0):
        self.name = name
        self.nice = nice
        self.argv = argv
        self.log_path = log_path
        self.health_url = health_url
        self.proc: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()
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
            logf = subprocess.DEVNULL
            try:
                logf = _open_child_log(self.log_path)
                os.write(logf, f"\n==== {time.strftime('%F %T')} starting {self.name}: {' '.join(self.argv)}\n".encode())
            except OSError as e:
                log.warning("cannot write %s (%s); %s runs without a log", self.log_path, e, self.name)
            try:
                self.proc = await asyncio.create_subprocess_exec(
                    *self.argv, stdout=logf, stderr=logf, stdin=asyncio.subprocess.DEVNULL,
                    preexec_fn=_background(self.nice),
                )
            finally:
                if isinstance(logf, int) and logf >= 0:
                    os.close(logf)
            log.info("%s started (pid %d), log: %s", self.name, self.proc.pid, self.log_path)
            probe = asyncio.create_task(self._probe(), name=f"probe:{self.name}")
            try:
                code = await self.proc.wait()
                _kill_group(self.proc.pid)
            finally:
                probe.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await probe
                self.ready.clear()
            if self._stopping:
                return
            if time.monotonic() - started > 60:
                backoff = 1.0
            log.warning("%s exited with code %s; restarting in %.0f s (see %s)",
                        self.name, code, backoff, self.log_path)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _probe(self) -> None:
        if self.health_url is None:
            self.ready.set()
            return
        while True:
            ok = await asyncio.to_thread(answers_ok, self.health_url)
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
                log.warning("%s did not stop in %.0f s; killing its process group", self.name, STOP_GRACE_S)
                _kill_group(proc.pid)  # the child and what it started at once: none outlives the other
                await proc.wait()
            _kill_group(proc.pid)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def _kill_group(pgid: int) -> None:
    """Kill what a child that has exited left in its process group: vLLM's engine core and workers
    outlive a killed API server (PDEATHSIG reaches the child alone), holding the model's memory."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


LOG_MAX_BYTES = 10 * 1024 * 1024
LOG_BACKUPS = 5


def _open_child_log(path: Path) -> int:
    """A child's log, 0600 (turns and errors show up in it), rotated at start once past the size."""
    with contextlib.suppress(OSError):
        if path.stat().st_size > LOG_MAX_BYTES:
            for i in range(LOG_BACKUPS - 1, 0, -1):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(f"{path}.{i}", f"{path}.{i + 1}")
            os.replace(path, f"{path}.1")
    return _open_log_fd(str(path))


class _PrivateRotatingHandler(logging.handlers.RotatingFileHandler):
    def _open(self) -> TextIOWrapper:
        """The log file, created 0600 (the base class would create it with the umask's mode)."""
        return os.fdopen(_open_log_fd(self.baseFilename), "a", encoding=self.encoding or "utf-8",
                         errors="backslashreplace")


def _open_log_fd(path: str) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def _setup_logging(cfg: Config) -> None:
    """stderr plus ``logs/clawproxy.log`` (0600, rotated), both with secrets redacted; a data dir
    that cannot hold the log leaves stderr alone, with a warning, rather than stop the proxy."""
    from clawproxy.proxy.redact import RedactingFilter, Redactor

    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if any(getattr(h, "_clawproxy", False) for h in root.handlers):
        return
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    problem = None
    try:
        (cfg.data_path / "logs").mkdir(parents=True, exist_ok=True, mode=0o700)
        handlers.append(_PrivateRotatingHandler(cfg.data_path / "logs" / "clawproxy.log",
                                                maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS))
    except OSError as e:
        problem = e
    redact = RedactingFilter(Redactor(cfg.proxy.redact_patterns)) if cfg.proxy.redact_secrets else None
    for h in handlers:
        h.setFormatter(fmt)
        if redact is not None:
            h.addFilter(redact)
        h._clawproxy = True  # type: ignore[attr-defined]
        root.addHandler(h)
    if problem is not None:
        log.warning("cannot write logs under %s (%s); logging to stderr only", cfg.data_path, problem)


def _write_run_config(cfg: Config, path: Path | None = None) -> Path:
    """The effective config (file + flags) that every child starts from, so they all see the same
    settings. Owner-only: it may hold control tokens, which stay off command lines (`ps` shows them)."""
    import yaml

    path = path or cfg.data_path / "run-config.yaml"
    data = {**dataclasses.asdict(cfg), "data_dir": str(cfg.data_path)}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o600)  # an older file keeps its mode through O_TRUNC
        yaml.safe_dump(data, f, sort_keys=False)
    return path


def build_children(cfg: Config, run_config: Path) -> tuple[Child | None, list[Child]]:
    """The engine (None with --upstream) and the workers, each started from ``run_config``."""
    py, logs, config = sys.executable, cfg.data_path / "logs", ["--config", str(run_config)]
    engine = None
    if cfg.proxy.upstream is None:
        if cfg.engine.port == 0:
            raise ConfigError("engine.port 0 (any free port) works only for `python -m clawproxy.engine` "
                              "alone; give `clawproxy start` a fixed port with --engine-port.")
        engine = Child("engine", [py, "-m", "clawproxy.engine", *config], logs / "engine.log",
                       f"{cfg.engine_url}/health")
    cli = [py, "-m", "clawproxy.cli"]
    workers = []
    if cfg.judge.enabled:
        workers.append(Child("judge", [*cli, "judge", "run", "--follow", *config], logs / "judge.log",
                             nice=BACKGROUND_NICE))
    if cfg.trainer.enabled:
        workers.append(Child("trainer", [*cli, "train", "--follow", *config, "--engine-url", cfg.engine_url],
                             logs / "trainer.log", nice=BACKGROUND_NICE))
    return engine, workers


class TrainerUnavailable(ConfigError):
    """The attached server answers but cannot take weights (not vLLM, or vLLM without its control routes)."""


def check_attached_vllm(cfg: Config) -> None:
    """Say at startup, in one line, when the attached server cannot do what the trainer will ask
    (not vLLM; its version, dev mode, runtime LoRA routes): ``TrainerUnavailable``, which `start`
    turns into a warning and no trainer; nothing listening yet is a ConfigError."""
    client = EngineClient(cfg.proxy.upstream or "", kind=cfg.engine.kind, token=cfg.engine.control_token, timeout=10)
    try:
        client.check(lora=cfg.trainer.finetune == "lora")
    except EngineError as e:
        if e.status in TRANSIENT:
            raise ConfigError(f"{e.message}; start vLLM first (configs/gpu-1.yaml) and wait until "
                              f"{client.base_url}/health answers.") from None
        raise TrainerUnavailable(e.message) from None


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

    from clawproxy.proxy.app import create_app, server_options
    from clawproxy.store import Store

    data = cfg.data_path
    try:
        data.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(data, 0o700)
    except OSError as e:
        if not data.is_dir():
            raise ConfigError(f"cannot use the data dir {data} ({e.strerror or e}); pass a "
                              "writable directory with --data-dir.") from e
    _setup_logging(cfg)
    # A full disk or a read-only data dir must not stop the serving: the recorder spools, counts
    # what it loses and shows it in /clawproxy/health; it resumes once the store works again.
    try:
        Store(cfg.db_path).close()  # create/migrate up front
    except StoreError as e:
        log.warning("RECORDING IS DEGRADED: %s. Serving anyway; /clawproxy/health counts what is "
                    "lost. Free space or fix the permissions of %s.", e.message, data)
    try:
        run_config = _write_run_config(cfg)
    except OSError as e:
        import tempfile

        log.warning("cannot write %s (%s); the workers get their config from a temp file",
                    data / "run-config.yaml", e)
        fd, tmp = tempfile.mkstemp(prefix="clawproxy-run-config-", suffix=".yaml")
        os.close(fd)
        run_config = _write_run_config(cfg, Path(tmp))

    if cfg.engine.spec.checks_control_plane and cfg.proxy.upstream is not None and cfg.trainer.enabled:
        try:  # only the trainer needs vLLM's control plane: any OpenAI-compatible server is recorded and judged
            await asyncio.to_thread(check_attached_vllm, cfg)
        except TrainerUnavailable as e:
            log.warning("the trainer is off: %s. Recording and judging run; --no-train (trainer.enabled: "
                        "false) silences this.", e)
            cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, enabled=False))
    engine, workers = build_children(cfg, run_config)
    if engine is not None:
        _check_port_free(cfg.engine.host, cfg.engine.port)
    proxy_cfg = dataclasses.replace(cfg, proxy=dataclasses.replace(cfg.proxy, upstream=cfg.engine_url))
    ready: Callable[[], bool] | None = engine.is_ready if engine else None

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    children = [c for c in (engine, *workers) if c is not None]
    runner = web.AppRunner(
        create_app(proxy_cfg, upstream_ready=ready), handle_signals=False, shutdown_timeout=15.0,
        **server_options(proxy_cfg),
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
        log.info("proxy listening on %s -> %s (data: %s)", url, cfg.engine_url, data)
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
