"""The load generator's CPU cost per request as a count of instructions, which a busy
machine does not change: two versions of the client can be compared on any machine.

A minimal streaming server (bench/client_capacity.py's, but every answer in one write,
so that every request is read the same way) runs in its own process; a client process
under valgrind's callgrind sends streamed requests through ``servesweep.bench.client``'s
``send`` in a closed loop (``--through workload``: through ``run_workload``, the whole
level with its metrics), once with a few requests and once with ``--requests`` more:
the difference of the two instruction counts divided by ``--requests`` is the client's
cost per request (interpreter start, imports and the session are left out).

    .venv/bin/python bench/client_instructions.py
    .venv/bin/python bench/client_instructions.py --compare-src /tmp/old/src   # A/B

``--compare-src`` names another checkout's ``src`` folder (e.g. from ``git archive REV
src | tar -x -C /tmp/old``); both are measured, alternately, with the same settings.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
_WARM = 20
"""Requests of the short run (connections opened, code paths warm)."""


def _serve(port: int) -> None:
    sys.path.insert(0, str(HERE))
    import client_capacity as cc

    class OneWrite(cc._Server):
        def _stream(self, continuous: bool) -> None:
            frames = cc._CONT if continuous else cc._PLAIN
            self.t.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
                + cc._frame(cc._ROLE)
                + b"".join(frames)
                + cc._TAIL
            )

    async def main() -> None:
        cc._build_frames(16)
        server = await asyncio.get_running_loop().create_server(OneWrite, "127.0.0.1", port)
        print("ready", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def _workload(port: int, concurrency: int, n: int) -> None:
    from servesweep.bench.load import run_workload_sync
    from servesweep.bench.target import Target
    from servesweep.spec.schema import workload_spec

    target = Target(base_url=f"http://127.0.0.1:{port}", model="m", metrics_path=None)
    spec = workload_spec(name="w", concurrency=[concurrency], requests=n, max_tokens=16)
    (result,) = run_workload_sync(target, spec)
    if result.metrics["completed"] != n:
        raise SystemExit(f"requests failed: {result.info.get('error_examples')}")


def _client(port: int, concurrency: int, n: int) -> None:
    sys.path.insert(0, str(HERE))
    import client_capacity as cc

    from servesweep.bench import client

    url = f"http://127.0.0.1:{port}/v1/chat/completions"

    async def main() -> None:
        left = n
        async with client.make_session(600) as session:

            async def slot() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    r = await client.send(session, url, cc.BODY, dict(cc.HEADERS), left)
                    if not r.ok:
                        raise SystemExit(f"request failed: {r.error}: {r.message}")

            await asyncio.gather(*(slot() for _ in range(concurrency)))

    asyncio.run(main())


def _instructions(src: Path, through: str, port: int, concurrency: int, n: int) -> int:
    env = {**os.environ, "PYTHONPATH": str(src)}
    argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    argv += [sys.executable, __file__, f"--{through}", str(port), str(concurrency), str(n)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=3600)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"the client under callgrind failed:\n{done.stderr[-3000:]}")
    return int(found.group(1))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("--send", "--workload"):
        child = _client if sys.argv[1] == "--send" else _workload
        child(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        _serve(int(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--compare-src", type=Path, help="another checkout's src folder")
    ap.add_argument(
        "--through",
        choices=("send", "workload"),
        default="send",
        help="one request at a time through send(), or whole levels through run_workload",
    )
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    srcs = {"this checkout": SRC}
    if args.compare_src is not None:
        srcs[f"{args.compare_src}"] = args.compare_src.resolve()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise SystemExit("the server did not start")
        rows: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.rounds):
            for c in (int(x) for x in args.concurrency.split(",")):
                for name, src in srcs.items():
                    short = _instructions(src, args.through, port, c, _WARM)
                    long = _instructions(src, args.through, port, c, _WARM + args.requests)
                    per = (long - short) / args.requests
                    rows.setdefault((name, c), []).append(per)
                    print(f"  {name} c={c}: {per:,.0f} instructions/request", file=sys.stderr)
    finally:
        server.kill()
        server.wait(timeout=10)
    print(
        f"\nclient instructions per streamed request (16 chunks) through {args.through}, "
        f"{args.requests} requests:\n"
    )
    print("| client | concurrency | instructions per request |")
    print("|---|---|---|")
    for (name, c), values in rows.items():
        shown = ", ".join(f"{v / 1e6:.3f} M" for v in values)
        print(f"| {name} | {c} | {shown} |")


if __name__ == "__main__":
    main()
