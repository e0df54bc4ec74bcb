"""A probe that runs inside an engine's own Python, not servesweep's.

``python engine_probe.py < request.json`` prints one JSON object. It uses the
standard library and the engine's own code only (servesweep need not be installed
in the engine's environment), so :mod:`servesweep.servers.engine_check` runs this
file by path with the interpreter of ``server.executable``.

Request: ``{"dist": "sglang", "module": "sglang.launch_server", "parser": "sglang",
"argvs": [["--model-path", "m", ...], ...]}``; every key is optional.

Answer: ``version`` (the distribution's version, or null), ``importable`` (the
module is found without running it), ``error`` (why not), ``parse`` (for each argv:
null when the engine's real argument parser accepts it, else its error message),
``parser_error`` (the parser itself could not be built), ``paths`` (where the
engine's package and the standard library live, for source checks).

Parsers: ``vllm`` (``vllm serve``'s argparse, built by ``make_arg_parser``),
``sglang`` (``ServerArgs.add_cli_args``), ``llamacpp`` (llama-cpp-python's
pydantic-generated argparse), ``sim`` (the simulated engine's argparse). Only the
parser's modules are imported: no model, no GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import importlib.util
import io
import json
import sys
import sysconfig
from collections.abc import Callable
from typing import Any

ParserFactory = Callable[[], argparse.ArgumentParser]


def _vllm_parser() -> argparse.ArgumentParser:
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older releases
        from vllm.utils import FlexibleArgumentParser
    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:  # before vLLM moved it (0.1x)
        from vllm.entrypoints.openai.cli_args import make_arg_parser

    parser: argparse.ArgumentParser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    if not any(a.dest == "model_tag" for a in parser._actions):
        parser.add_argument("model_tag", nargs="?")  # `vllm serve` adds it
    return parser


def _sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return parser


def _llamacpp_parser() -> argparse.ArgumentParser:
    from llama_cpp.server.cli import add_args_from_model
    from llama_cpp.server.settings import Settings

    parser = argparse.ArgumentParser(prog="llama_cpp.server")
    add_args_from_model(parser, Settings)
    parser.add_argument("--config_file", type=str)
    return parser


def _sim_parser() -> argparse.ArgumentParser:
    from servesweep.sim.config import build_parser

    return build_parser()


PARSERS: dict[str, ParserFactory] = {
    "vllm": _vllm_parser,
    "sglang": _sglang_parser,
    "llamacpp": _llamacpp_parser,
    "sim": _sim_parser,
}


def parse_error(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """None when ``parser`` accepts ``argv``; else the parser's own message."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            if exc.code in (0, None):
                return None
            lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
            return lines[-1] if lines else f"exit {exc.code}"
        except Exception as exc:  # a type= converter that raises its own error
            return f"{type(exc).__name__}: {exc}"
    return None


def _version(dist: str) -> str | None:
    for name in (dist, dist.replace("_", "-"), dist.replace("-", "_")):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(name)
    return None


def _package_paths(module: str) -> list[str]:
    with contextlib.suppress(Exception):
        spec = importlib.util.find_spec(module.split(".")[0])
        if spec is not None and spec.submodule_search_locations:
            return list(spec.submodule_search_locations)
    return []


def answer(request: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"python": sys.executable}
    dist = request.get("dist")
    if dist:
        out["version"] = _version(str(dist))
    module = request.get("module")
    if module:
        try:
            found = importlib.util.find_spec(str(module)) is not None
        except Exception as exc:  # the parent package failed to import
            found = False
            out["error"] = f"{type(exc).__name__}: {exc}"
        out["importable"] = found
        if not found and "error" not in out:
            out["error"] = f"No module named {module!r} in {sys.executable}"
        out["paths"] = {
            "package": _package_paths(str(module)),
            "stdlib": sysconfig.get_paths()["stdlib"],
            "purelib": sysconfig.get_paths()["purelib"],
        }
    kind = request.get("parser")
    argvs = request.get("argvs") or []
    if kind and argvs:
        try:
            parser = PARSERS[str(kind)]()
        except Exception as exc:
            out["parser_error"] = f"{type(exc).__name__}: {exc}"
        else:
            out["parse"] = [parse_error(parser, [str(a) for a in argv]) for argv in argvs]
    return out


def main() -> None:
    request = json.loads(sys.stdin.read() or "{}")
    sys.stdout.write(json.dumps(answer(request)) + "\n")


if __name__ == "__main__":
    main()
