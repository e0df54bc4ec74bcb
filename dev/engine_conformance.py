"""Check servesweep's engine presets against an installed engine (dev/engine-conformance.sh).

    .venv/bin/python dev/engine_conformance.py --engine sglang --python VENV/bin/python \
        [--json OUT.json] [--docs docs/engines.md]

With the engine's own code, in its own Python:

- flags: every flag the preset can emit (its fixed flags and default args, each
  documented speculative-decoding param, every param of the examples and the README
  for that engine) is parsed by the engine's real argument parser
  (servesweep/servers/engine_probe.py);
- metrics: every Prometheus name the preset reads is defined in the installed
  package's sources;
- fatal patterns: each alternative of each fatal log pattern is looked up, as the
  literal text it needs, in the installed sources (the engine's environment: its
  packages, their compiled libraries, the standard library); a pattern none of whose
  alternatives is found matches nothing the engine prints.

Exit 1 when a flag is rejected, a metric is missing or a pattern matches nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from servesweep.servers.engine_check import run_probe
from servesweep.servers.engine_patterns import FatalPattern
from servesweep.servers.engines import build_launch, get_preset, program_of
from servesweep.spec.schema import ServerSpec

try:
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # Python 3.10
    import sre_parse  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
MARK_START = "<!-- conformance:start -->"
MARK_END = "<!-- conformance:end -->"

# A value for each documented param (the preset's spec_params and common knobs).
SAMPLES: dict[str, dict[str, Any]] = {
    "vllm": {
        "speculative_config.method": "eagle3",
        "speculative_config.model": "/models/draft",
        "speculative_config.num_speculative_tokens": 4,
        "speculative_config.draft_tensor_parallel_size": 1,
        "speculative_config.prompt_lookup_max": 4,
        "speculative_config.prompt_lookup_min": 2,
        "tensor-parallel-size": 2,
        "max-num-seqs": 64,
        "max-model-len": 8192,
        "enable-prefix-caching": False,
        "compilation_config.cudagraph_capture_sizes": [1, 2, 4],
    },
    "sglang": {
        "speculative_algorithm": "EAGLE",
        "speculative_draft_model_path": "/models/draft",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 4,
        "speculative_num_draft_tokens": 8,
        "speculative_dflash_block_size": 8,
        "speculative_draft_window_size": 2048,
        "speculative_draft_sink_size": 4,
        "speculative_accept_threshold_single": 0.9,
        "speculative_accept_threshold_acc": 0.9,
        "speculative_attention_mode": "decode",
        "speculative_draft_attention_backend": "triton",
        "speculative_token_map": "/models/token_map.pt",
        "tp-size": 2,
        "mem-fraction-static": 0.85,
        "enable_metrics": False,
    },
    "llamacpp": {
        "n_threads": 2,
        "n_ctx": 1024,
        "flash_attn": True,
        "draft_model": "prompt-lookup-decoding",
        "draft_model_num_pred_tokens": 4,
    },
}


# Flags that exist only in builds the released package does not have: a rejection of
# one of these is a note, not a fault (the example says which build it needs).
UNRELEASED: dict[str, dict[str, str]] = {
    "sglang": {"--speculative-ddtree-budget": "SGLang builds with the DDTree algorithm"},
}


def _example_params(engine: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, params) of every example sweep file and the README for this engine."""
    sources: list[tuple[str, Any]] = []
    for path in sorted((REPO / "examples").glob("*.yaml")):
        sources.append((f"examples/{path.name}", yaml.safe_load(path.read_text())))
    readme = (REPO / "README.md").read_text()
    for block in re.findall(r"```yaml\n(.*?)```", readme, re.S):
        data = yaml.safe_load(block)
        if isinstance(data, dict):
            sources.append(("README.md", data))
    for where, spec in sources:
        server = (spec or {}).get("server") or {}
        if server.get("engine") != engine:
            continue
        params = spec.get("params") or {}
        configs = [dict(p) for p in params.get("points") or []]
        grid = params.get("grid") or {}
        if grid:
            configs.append({k: v[-1] for k, v in grid.items()})
        for config in configs or [{}]:
            yield where, {**(server.get("args") or {}), **config}


def flag_sets(engine: str) -> list[tuple[str, dict[str, Any]]]:
    sets: list[tuple[str, dict[str, Any]]] = [("fixed flags and default args", {})]
    sets += [(f"param {k}", {k: v}) for k, v in SAMPLES.get(engine, {}).items()]
    sets += list(_example_params(engine))
    return sets


def check_flags(engine: str, python: str) -> dict[str, Any]:
    preset = get_preset(engine)
    spec = ServerSpec(engine=engine, model="/models/m", port=8000)  # type: ignore[arg-type]
    prefix = len(program_of(spec))
    sets = flag_sets(engine)
    argvs = [build_launch(spec, params)[0][prefix:] for _, params in sets]
    request = {"dist": preset.dist, "module": preset.module, "parser": preset.parser}
    # no GPU here: vLLM infers its platform while building the parser; say "cpu"
    env = {"VLLM_TARGET_DEVICE": "cpu"} if engine == "vllm" else None
    answer = run_probe([python], {**request, "argvs": argvs}, timeout=900, env=env)
    if answer.error or answer.data.get("parser_error"):
        return {"error": answer.error or answer.data["parser_error"], "data": dict(answer.data)}
    rejected, unreleased = [], []
    for (where, _), argv, err in zip(sets, argvs, answer.data["parse"], strict=True):
        if not err:
            continue
        build = next((b for f, b in UNRELEASED.get(engine, {}).items() if f in err), None)
        entry = {"where": where, "argv": argv, "error": err, "build": build}
        (unreleased if build else rejected).append(entry)
    return {
        "version": answer.data.get("version"),
        "paths": answer.data.get("paths"),
        "checked": len(argvs),
        "rejected": rejected,
        "unreleased": unreleased,
    }


def _clean(run: str) -> str | None:
    run = re.sub(r"^\w*Error: ", "", run).strip()  # Python adds "XError: " itself
    return run if len(run) >= 5 else None


def _needs(items: Any) -> list[list[str]]:
    """What a parsed regex needs: groups of texts, each group satisfied by any one of
    them (a literal run is a group of one; a group's alternation is one group)."""
    groups: list[list[str]] = []
    current: list[str] = []

    def flush() -> None:
        text = _clean("".join(current))
        if text:
            groups.append([text])
        current.clear()

    for op, arg in items:
        name = str(op)
        if name == "LITERAL":
            current.append(chr(arg))
            continue
        flush()
        if name == "SUBPATTERN":
            inner = list(arg[-1])
            if len(inner) == 1 and str(inner[0][0]) == "BRANCH":
                options = []
                for branch in inner[0][1][1]:
                    sub = _needs(branch)
                    options += [max(g, key=len) for g in sub[:1]]
                if options:
                    groups.append(options)
            else:
                groups += _needs(inner)
    flush()
    return groups


def _alternatives(pattern: FatalPattern) -> list[str]:
    parsed = sre_parse.parse(pattern.pattern.pattern)
    items = list(parsed)
    if len(items) == 1 and str(items[0][0]) == "BRANCH":
        text = pattern.pattern.pattern
        depth, start, parts = 0, 0, []
        for i, ch in enumerate(text):  # split on top-level |
            if ch == "(" and (i == 0 or text[i - 1] != "\\"):
                depth += 1
            elif ch == ")" and text[i - 1] != "\\":
                depth -= 1
            elif ch == "|" and depth == 0 and text[i - 1] != "\\":
                parts.append(text[start:i])
                start = i + 1
        parts.append(text[start:])
        return parts
    return [pattern.pattern.pattern]


def _splits(text: str) -> list[tuple[str, str]]:
    """A message written as two adjacent string literals ("... on startup "
    "is less than ...") is in the source only in two parts: every split at a space."""
    out = []
    for i, ch in enumerate(text):
        if ch == " " and i >= 8 and len(text) - i >= 8:
            out.append((text[:i].rstrip(), text[i:].lstrip()))
    return out


def _present(text: str, found: set[str]) -> bool:
    return text in found or any(a in found and b in found for a, b in _splits(text))


def _grep(fragments: set[str], roots: list[str]) -> set[str]:
    """Which fragments occur in the files under roots (.py sources and compiled libraries)."""
    if not fragments:
        return set()
    found: set[str] = set()
    pattern_file = Path("/tmp") / f"conformance-fragments-{id(fragments)}.txt"
    pattern_file.write_text("\n".join(sorted(fragments)) + "\n")
    try:
        for root in roots:
            done = subprocess.run(
                [
                    "grep",
                    "-rFaoh",
                    "--include=*.py",
                    "--include=*.so",
                    "--include=*.so.*",
                    "-f",
                    str(pattern_file),
                    root,
                ],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=900,
                check=False,
            )
            found |= set(done.stdout.splitlines()) & fragments
    finally:
        pattern_file.unlink(missing_ok=True)
    return found


def check_patterns_and_metrics(engine: str, paths: Mapping[str, Any]) -> dict[str, Any]:
    preset = get_preset(engine)
    roots = [str(paths["purelib"]), str(paths["stdlib"])]
    needs: dict[tuple[str, str], list[list[str]]] = {}
    for pattern in preset.fatal_patterns:
        for alt in _alternatives(pattern):
            needs[(pattern.reason, alt)] = _needs(sre_parse.parse(alt))
    metric_names = {
        name: [name, name.removesuffix("_total")] for name in preset.spec_decode_counters.values()
    }
    fragments = {f for groups in needs.values() for g in groups for f in g}
    fragments |= {part for text in list(fragments) for split in _splits(text) for part in split}
    fragments |= {f for forms in metric_names.values() for f in forms}
    found = _grep(fragments, roots)
    patterns: dict[str, dict[str, Any]] = {}
    for (reason, alt), groups in needs.items():
        entry = patterns.setdefault(reason, {"found": [], "missing": []})
        ok = bool(groups) and all(any(_present(t, found) for t in g) for g in groups)
        entry["found" if ok else "missing"].append(alt)
    metrics = {name: any(f in found for f in forms) for name, forms in metric_names.items()}
    return {
        "patterns": patterns,
        "dead_patterns": sorted(r for r, e in patterns.items() if not e["found"]),
        "metrics": metrics,
        "missing_metrics": sorted(n for n, ok in metrics.items() if not ok),
    }


def update_docs(docs: Path, engine: str, row: str) -> None:
    text = docs.read_text()
    if MARK_START not in text:
        text += (
            "\n## Checked against the installed engines (`dev/engine-conformance.sh`)\n\n"
            f"{MARK_START}\n| engine | version | flag sets parsed | rejected | metrics missing "
            f"| patterns matching nothing | checked |\n|---|---|---|---|---|---|---|\n{MARK_END}\n"
        )
    head, rest = text.split(MARK_START, 1)
    table, tail = rest.split(MARK_END, 1)
    lines = [ln for ln in table.strip("\n").splitlines() if not ln.startswith(f"| {engine} |")]
    lines.append(row)
    docs.write_text(f"{head}{MARK_START}\n" + "\n".join(lines) + f"\n{MARK_END}{tail}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", required=True, choices=["vllm", "sglang", "llamacpp"])
    ap.add_argument("--python", required=True, help="the engine's Python")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--docs", type=Path)
    args = ap.parse_args()
    result: dict[str, Any] = {"engine": args.engine, "flags": check_flags(args.engine, args.python)}
    flags = result["flags"]
    if "error" in flags:
        print(f"{args.engine}: cannot check flags: {flags['error']}", file=sys.stderr)
        return 1
    result |= check_patterns_and_metrics(args.engine, flags["paths"])
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    bad = 0
    for r in flags["rejected"]:
        bad += 1
        print(f"{args.engine}: {r['where']}: rejected: {r['error']}")
    for r in flags["unreleased"]:
        print(f"{args.engine}: note: {r['where']}: {r['error']} (only in {r['build']})")
    for name in result["missing_metrics"]:
        bad += 1
        print(f"{args.engine}: metric {name} is not in the installed sources")
    for reason in result["dead_patterns"]:
        bad += 1
        print(f"{args.engine}: fatal pattern {reason!r} matches no message the engine has")
    for reason, entry in result["patterns"].items():
        for alt in entry["missing"]:
            print(f"{args.engine}: note: pattern {reason!r} alternative not found: {alt}")
    version = flags["version"]
    print(
        f"{args.engine} {version}: {flags['checked']} flag sets, {len(flags['rejected'])} "
        f"rejected; {len(result['metrics'])} metrics, {len(result['missing_metrics'])} missing; "
        f"{len(result['patterns'])} fatal patterns, {len(result['dead_patterns'])} matching nothing"
    )
    if args.docs:
        from datetime import date

        row = (
            f"| {args.engine} | {version} | {flags['checked']} | {len(flags['rejected'])} | "
            f"{', '.join(result['missing_metrics']) or '—'} | "
            f"{', '.join(result['dead_patterns']) or '—'} | {date.today().isoformat()} |"
        )
        update_docs(args.docs, args.engine, row)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
