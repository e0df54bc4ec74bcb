"""``servesweep wait-gpus``: the release gate for shell scripts (wait until no process
holds memory on the GPUs)."""

from __future__ import annotations

from servesweep.errors import ConfigError, TrialFailed
from servesweep.models import short_cmdline
from servesweep.servers.gpu import open_probe
from servesweep.servers.release import ReleasePolicy, wait_released
from servesweep.spec.schema import parse_duration, parse_size

__all__ = ["parse_gpu_list", "wait_gpus"]


def parse_gpu_list(text: str) -> list[int]:
    """``0-3,6`` -> ``[0, 1, 2, 3, 6]``."""
    gpus: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part:
                lo, hi = part.split("-", 1)
                if int(hi) < int(lo):
                    raise ValueError(part)
                gpus.extend(range(int(lo), int(hi) + 1))
            else:
                gpus.append(int(part))
    except ValueError:
        raise ConfigError(
            f"not a GPU list: {text!r} (use e.g. 0-7 or 0,1,2)", key="--gpus"
        ) from None
    if not gpus or any(g < 0 for g in gpus):
        raise ConfigError(f"not a GPU list: {text!r} (use e.g. 0-7 or 0,1,2)", key="--gpus")
    return sorted(set(gpus))


def _parse(kind: str, value: str, flag: str) -> float:
    try:
        return parse_size(value) if kind == "size" else parse_duration(value)
    except ValueError as exc:
        raise ConfigError(str(exc), key=flag) from None


def wait_gpus(
    gpus: str,
    tolerance: str,
    timeout: str,
    settle: str,
    backend: str = "auto",
    fake_dir: str | None = None,
) -> tuple[bool, str]:
    """Wait until no process holds memory on the GPUs and used memory is within the
    tolerance of zero; returns (free, message naming the holders if not). Raises
    ``NoGpuDriverError`` when no backend can see the GPUs (never "free" unchecked)."""
    indexes = parse_gpu_list(gpus)
    if backend == "none":
        raise ConfigError("--backend none checks no GPU: use auto, nvml or fake", key="--backend")
    probe = open_probe(backend, fake_dir, gpus=indexes)
    try:
        result = wait_released(
            probe,
            indexes,
            {g: 0 for g in indexes},
            ReleasePolicy(
                tolerance=int(_parse("size", tolerance, "--tolerance")),
                settle=_parse("duration", settle, "--settle"),
                timeout=_parse("duration", timeout, "--timeout"),
            ),
            old_pids=set(),
        )
    except TrialFailed as failure:
        return False, f"GPUs {gpus} not free: {failure.evidence.message}" + "".join(
            f"\n  {h.describe()}  {short_cmdline(h.cmdline)}" for h in failure.evidence.gpu_holders
        )
    finally:
        probe.close()
    return True, f"GPUs {gpus} free after {result.seconds:.2f}s"
