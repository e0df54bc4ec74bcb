"""The simulated engine's process lifecycle: allocate, load, listen, serve, shut down.

Each step appends a ground-truth line (``--truth``) with the wall-clock time at
which it really happened, so benchmarks can tell servesweep's own overhead from
the simulated load and release times.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import traceback
from typing import TextIO

from aiohttp import web

from servesweep.fakegpu import FakeGpuDir, FakeGpuError, FakeOutOfMemory, Holder, append_truth
from servesweep.fakegpu.units import format_bytes
from servesweep.sim.config import SimConfig
from servesweep.sim.engine import Engine
from servesweep.sim.oracle import Oracle
from servesweep.sim.server import SimServer, State

__all__ = ["SimProcess"]

_LOAD_STEPS = 10
_FAIL_STEP = 4  # --crash-at-load / --hang-at-load strike at 40%


def _write(stream: TextIO, text: str) -> None:
    """Log ``text``; a closed log pipe (its reader died) must not kill the engine."""
    with contextlib.suppress(OSError, ValueError):
        stream.write(text)
        stream.flush()


def log(message: str) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    _write(sys.stdout, f"INFO {stamp} [sim] {message}\n")


def uvicorn(message: str, level: str = "INFO") -> None:
    _write(sys.stderr, f"{level + ':':<9} {message}\n")


def print_traceback(exc: BaseException, final_line: str) -> None:
    """A real Python traceback of ``exc`` whose last line is ``final_line``."""
    lines = ["Traceback (most recent call last):\n", *traceback.format_tb(exc.__traceback__)]
    _write(sys.stderr, "".join(lines) + final_line + "\n")


def _exec_time() -> float | None:
    """When the kernel started this process (10 ms resolution), before Python's start-up."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return btime + ticks / os.sysconf("SC_CLK_TCK")


class SimProcess:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.pid = os.getpid()
        self.instance = f"{self.pid}-{time.time_ns()}"
        self.engine = Engine(cfg, Oracle.from_files(cfg.oracle, cfg.seed, cfg.correct_rate))
        if cfg.truth:
            self.engine.on_trace = lambda trace: self.truth("generation", **trace.fields())
        self.server = SimServer(self.engine, self.instance, on_generation=self._on_generation)
        self.runner: web.AppRunner | None = None
        self.holder: Holder | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self.stop = asyncio.Event()
        self._util_task: asyncio.Task[None] | None = None

    def truth(self, event: str, **fields: object) -> None:
        append_truth(self.cfg.truth, event, instance=self.instance, **fields)

    # -- entry point -----------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._on_sigterm)
        loop.add_signal_handler(signal.SIGINT, self.stop.set)
        self.truth("process_start", argv=sys.argv[1:], exec_t=_exec_time())
        cfg = self.cfg
        log(f"servesweep simulated engine, pid {self.pid}, instance {self.instance}")
        log(
            f"model={cfg.model!r} gpus={list(cfg.gpus)} "
            f"mem_per_gpu={format_bytes(cfg.mem_per_gpu)} "
            f"budget={cfg.budget} topk={cfg.topk} window={cfg.window} seed={cfg.seed}"
        )
        code = await self._start()
        if code is not None:
            self._release_gpus()
            self.truth("exit", code=code)
            return code
        return await self._shutdown()

    def _on_sigterm(self) -> None:
        if self.cfg.ignore_sigterm:
            log("received SIGTERM; ignoring it (--ignore-sigterm)")
            return
        self.stop.set()

    async def _wait_stop(self, seconds: float | None) -> bool:
        """Sleep ``seconds`` (forever when None); True when asked to stop meanwhile."""
        try:
            await asyncio.wait_for(self.stop.wait(), seconds)
        except asyncio.TimeoutError:
            return False
        return True

    async def _start(self) -> int | None:
        """Allocate, load and listen; an exit code when the process must end early."""
        if self.cfg.models_before_ready and not await self._bind():
            return 1
        if self.cfg.fake_gpus and not await self._allocate():
            return 1
        code = await self._load()
        if code is not None or self.stop.is_set():
            return code
        if self.runner is None and not await self._bind():
            return 1
        self.server.state = State.READY
        uvicorn("Application startup complete.")
        self.truth("ready")
        if self.holder is not None:
            # Keep a reference: the loop holds tasks only weakly.
            self._util_task = asyncio.get_running_loop().create_task(self._report_utilization())
        await self.stop.wait()
        return None

    # -- GPUs -----------------------------------------------------------------

    async def _allocate(self) -> bool:
        cfg = self.cfg
        assert cfg.fake_gpus is not None
        if not cfg.gpus:
            self._crash(RuntimeError("No CUDA GPUs are available"))
            return False
        memory = dict.fromkeys(cfg.gpus, cfg.mem_per_gpu)
        if cfg.orphan_worker:
            return await self._start_worker()
        try:
            self.holder = FakeGpuDir(cfg.fake_gpus).allocate(
                memory, release_delay_s=cfg.release_delay, truth=cfg.truth, name="sim"
            )
        except FakeOutOfMemory as exc:
            print_traceback(exc, f"torch.OutOfMemoryError: {exc}")
            return False
        except FakeGpuError as exc:
            print_traceback(exc, f"RuntimeError: {exc}")
            return False
        self.holder.start_heartbeat()
        self.truth("memory_allocated", gpus=list(cfg.gpus), bytes_per_gpu=cfg.mem_per_gpu)
        return True

    async def _start_worker(self) -> bool:
        cfg = self.cfg
        assert cfg.fake_gpus is not None
        argv = [
            sys.executable,
            "-m",
            "servesweep.sim.worker",
            cfg.fake_gpus,
            "--gpus",
            ",".join(map(str, cfg.gpus)),
            "--mem",
            str(cfg.mem_per_gpu),
            "--release-delay",
            str(cfg.release_delay),
        ]
        if cfg.truth:
            argv += ["--truth", cfg.truth]
        self.worker = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True
        )
        assert self.worker.stdout is not None
        line = await asyncio.get_running_loop().run_in_executor(None, self.worker.stdout.readline)
        self.worker.stdout.close()
        answer = line.decode(errors="replace").strip()
        if answer != "ok":
            self.worker.wait()
            self.worker = None
            return False  # the worker printed its traceback on our shared stderr
        log(f"worker process {self.worker.pid} holds the GPU memory (own session)")
        self.truth(
            "memory_allocated",
            gpus=list(cfg.gpus),
            bytes_per_gpu=cfg.mem_per_gpu,
            holder_pid=self.worker.pid,
        )
        return True

    async def _report_utilization(self) -> None:
        while self.holder is not None and not self.stop.is_set():
            self.holder.set_utilization(100.0 if self.engine.running else 0.0)
            await asyncio.sleep(0.1)

    def _release_gpus(self) -> None:
        if self.worker is not None:
            with contextlib.suppress(ProcessLookupError):
                self.worker.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.worker.wait(timeout=5)
            self.worker = None
        if self.holder is not None:
            self.holder.release()
            self.holder = None

    # -- load -----------------------------------------------------------------

    async def _load(self) -> int | None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        step = self.cfg.load_time / _LOAD_STEPS
        for done in range(_LOAD_STEPS + 1):
            if done == _FAIL_STEP and self.cfg.crash_at_load:
                self._crash(RuntimeError("simulated crash while loading weights (--crash-at-load)"))
                return 1
            if done == _FAIL_STEP and self.cfg.hang_at_load:
                log("Loading weights: waiting for a peer shard... (--hang-at-load)")
                await self._wait_stop(None)
                return None
            elapsed = loop.time() - start
            left = max(self.cfg.load_time - elapsed, 0.0)
            log(
                f"Loading weights: {100 * done // _LOAD_STEPS:3d}% Completed | "
                f"{done}/{_LOAD_STEPS} [{elapsed:05.2f}s<{left:05.2f}s]"
            )
            if done < _LOAD_STEPS:
                deadline = start + (done + 1) * step
                if await self._wait_stop(max(deadline - loop.time(), 0.0)):
                    log("received a stop signal while loading")
                    return None
        log(f"Loading weights took {loop.time() - start:.2f} seconds")
        return None

    def _crash(self, exc: Exception) -> None:
        try:
            raise exc
        except Exception as raised:  # a real traceback with real frames
            print_traceback(raised, f"{type(raised).__name__}: {raised}")

    # -- listen ---------------------------------------------------------------

    async def _bind(self) -> bool:
        cfg = self.cfg
        runner = web.AppRunner(
            self.server.app(), access_log=None, handle_signals=False, shutdown_timeout=1.0
        )
        await runner.setup()
        site = web.TCPSite(
            runner, cfg.host, cfg.port, backlog=1024, reuse_port=cfg.reuse_port or None
        )
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            uvicorn(
                f"[Errno {exc.errno}] error while attempting to bind on address "
                f"({cfg.host!r}, {cfg.port}): {(exc.strerror or str(exc)).lower()}",
                "ERROR",
            )
            return False
        self.runner = runner
        port = runner.addresses[0][1] if runner.addresses else cfg.port
        self.truth("listening", host=cfg.host, port=port)
        uvicorn(f"Started server process [{self.pid}]")
        uvicorn("Waiting for application startup.")
        uvicorn(f"Uvicorn running on http://{cfg.host}:{port} (Press CTRL+C to quit)")
        return True

    # -- shut down ------------------------------------------------------------

    async def _shutdown(self) -> int:
        self.truth("shutdown_begin")
        uvicorn("Shutting down")
        self.server.state = State.SHUTTING_DOWN
        if self.runner is not None and self.cfg.shutdown_delay > 0:
            log(f"draining for {self.cfg.shutdown_delay:g}s before exit (--shutdown-delay)")
            await asyncio.sleep(self.cfg.shutdown_delay)
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        uvicorn("Application shutdown complete.")
        uvicorn(f"Finished server process [{self.pid}]")
        self._release_gpus()
        self.truth("exit", code=0)
        return 0

    # -- crash after N requests -------------------------------------------------

    def _on_generation(self, index: int) -> None:
        limit = self.cfg.crash_after
        if limit is None or index < limit:
            return
        try:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        except RuntimeError as exc:
            print_traceback(exc, f"RuntimeError: {exc}")
        _write(sys.stdout, f"ERROR: engine core died after {limit} requests (--crash-after)\n")
        if self.worker is not None:
            with contextlib.suppress(ProcessLookupError):
                self.worker.terminate()
        if self.holder is not None:
            self.holder.release()
        self.truth("exit", code=1, crash=True)
        os._exit(1)
