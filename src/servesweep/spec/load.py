"""Load a sweep file: read it, parse the YAML, validate it, check it.

Every mistake is one :class:`~servesweep.errors.ConfigError` whose ``str()`` is a
single line naming the file, the line where it is known, and the key::

    sweep.yaml:7: server.timeouts.release: not a duration: '5 minutes' (use seconds or e.g.
    '30s', '5m', '1h30m')

(wrapped here; the message itself is one line).

Every path written in a sweep file is relative to the sweep file (a sweep given as
text: to the current directory), in every command: :func:`resolve_path` makes it
absolute once, when the file is loaded, for each field of :data:`PATH_FIELDS`, so the
spec every other layer reads holds absolute paths. A path computed later from the
sweep file goes through :meth:`LoadedSweep.resolve`.

Pydantic's and PyYAML's exceptions never leave this module.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from servesweep.errors import ConfigError
from servesweep.spec.check import check_spec
from servesweep.spec.schema import EvalWorkload, SweepSpec, WorkloadSpec
from servesweep.spec.schema_search import UNION_TAGS
from servesweep.spec.source import read_yaml

__all__ = [
    "MAX_FILE_BYTES",
    "PATH_FIELDS",
    "LoadedSweep",
    "load_sweep",
    "load_sweep_text",
    "resolve_path",
]

MAX_FILE_BYTES = 4 * 2**20

PATH_FIELDS: tuple[str, ...] = (
    "store",
    "server.fake_gpu_dir",
    "server.log_dir",
    "server.model_config",
    "server.systemd.unit_dir",
    "server.commands.pid_file",
    "workloads.N.dataset",
    "workloads.N.eval.suite",
)
"""The keys of a sweep file that hold paths (``dataset`` and ``suite`` when they name
a file, not ``builtin:...`` or ``synthetic``). ``model``, ``executable``, ``command``
and ``args`` go to the engine as written."""


@dataclass(frozen=True)
class LoadedSweep:
    """A validated sweep file and where it came from."""

    spec: SweepSpec
    path: Path | None
    text: str
    spec_hash: str
    """sha256 (hex) of the text."""
    lines: Mapping[str, int]
    """Dotted key path (``server.timeouts.release``, ``workloads.0.name``) -> 1-based line."""
    base_dir: Path
    """The absolute folder relative paths of this sweep start from: the sweep file's
    folder (for a sweep given as text: the current directory when it was loaded)."""

    @property
    def name(self) -> str:
        return str(self.path) if self.path is not None else "<string>"

    def resolve(self, value: str | os.PathLike[str]) -> Path:
        """A path as the sweep file means it: absolute, ``~`` expanded, a relative path
        taken from the sweep file's folder."""
        return Path(resolve_path(os.fspath(value), self.base_dir))

    def line_of(self, key: str) -> int | None:
        """The line of a key, or of the closest enclosing key that is written."""
        return _line_of(self.lines, key)

    def error(self, message: str, key: str | None = None) -> ConfigError:
        """A ConfigError about this file (for checks made by other layers)."""
        line = self.line_of(key) if key else None
        return _single_line(ConfigError(message, file=self.name, line=line, key=key))


def _line_of(lines: Mapping[str, int], key: str | None) -> int | None:
    parts = key.split(".") if key else []
    while parts:
        line = lines.get(".".join(parts))
        if line is not None:
            return line
        parts.pop()
    return None


def _one_line(text: str | None) -> str | None:
    """Control characters (a newline in a quoted YAML key, a path) written as escapes."""
    if text is None:
        return None
    return "".join(
        ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii")
        for ch in text
    )


def _single_line(exc: ConfigError) -> ConfigError:
    return ConfigError(
        _one_line(exc.message) or "",
        file=_one_line(exc.file),
        line=exc.line,
        key=_one_line(exc.key),
    )


def load_sweep(path: str | Path) -> LoadedSweep:
    """Read and validate a sweep file; raises ConfigError (one line) on any mistake."""
    try:
        return _load_file(Path(path))
    except ConfigError as exc:
        raise _single_line(exc) from None


def load_sweep_text(text: str, name: str = "<string>") -> LoadedSweep:
    """Validate sweep-file text; ``name`` is what errors call the file."""
    try:
        return _load(text, name, None)
    except ConfigError as exc:
        raise _single_line(exc) from None


def _load_file(path: Path) -> LoadedSweep:
    name = str(path)
    try:
        if path.is_dir():
            raise ConfigError("is a directory, not a sweep file", file=name)
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(
                f"file is {size} bytes; a sweep file is at most {MAX_FILE_BYTES}", file=name
            )
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError("file not found", file=name) from None
    except PermissionError:
        raise ConfigError("permission denied: cannot read the file", file=name) from None
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror or exc}", file=name) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"not UTF-8 text (byte 0x{raw[exc.start]:02x}); save the file as UTF-8",
            file=name,
            line=line,
        ) from None
    return _load(text, name, path)


def _load(text: str, name: str, path: Path | None) -> LoadedSweep:
    source = read_yaml(text.lstrip("\ufeff"), name)
    lines = types.MappingProxyType(dict(source.lines))
    data = source.data
    if not isinstance(data, dict):
        raise ConfigError(
            f"the top level must be a mapping (name:, server:, params:, workloads:...), "
            f"got {_kind(data)}",
            file=name,
            line=lines.get(""),
        )
    # top-level keys starting with "x-" hold YAML anchors for reuse; they are not settings
    data = {k: v for k, v in data.items() if not (isinstance(k, str) and k.startswith("x-"))}
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise _translate(exc, data, name, lines) from None
    try:
        check_spec(spec)
    except ConfigError as exc:
        raise ConfigError(
            exc.message, file=name, line=_line_of(lines, exc.key), key=exc.key
        ) from None
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    base = path.absolute().parent if path is not None else Path.cwd()
    return LoadedSweep(
        spec=_resolve_paths(spec, base),
        path=path,
        text=text,
        spec_hash=digest,
        lines=lines,
        base_dir=base,
    )


def resolve_path(value: str, base: Path) -> str:
    """``value`` (a path written in a sweep file) made absolute: ``~`` expanded, a
    relative path taken from ``base``, the sweep file's folder."""
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else base / path)


def _names_a_file(value: str) -> bool:
    """A dataset or suite that is a file, not a builtin set or ``synthetic``."""
    return not value.startswith("builtin:") and value != "synthetic"


def _resolve_workload(workload: WorkloadSpec, base: Path) -> WorkloadSpec:
    update: dict[str, Any] = {}
    if _names_a_file(workload.dataset):
        update["dataset"] = resolve_path(workload.dataset, base)
    if isinstance(workload, EvalWorkload) and _names_a_file(workload.eval.suite):
        suite = resolve_path(workload.eval.suite, base)
        update["eval"] = workload.eval.model_copy(update={"suite": suite})
    return workload.model_copy(update=update) if update else workload


def _resolve_paths(spec: SweepSpec, base: Path) -> SweepSpec:
    """The spec with every field of :data:`PATH_FIELDS` absolute."""
    server = spec.server
    on_server: dict[str, Any] = {}
    for field in ("fake_gpu_dir", "log_dir", "model_config_file"):
        value = getattr(server, field)
        if value:
            on_server[field] = resolve_path(value, base)
    if server.systemd is not None:
        unit_dir = resolve_path(server.systemd.unit_dir, base)
        on_server["systemd"] = server.systemd.model_copy(update={"unit_dir": unit_dir})
    if server.commands is not None and server.commands.pid_file:
        pid_file = resolve_path(server.commands.pid_file, base)
        on_server["commands"] = server.commands.model_copy(update={"pid_file": pid_file})
    update: dict[str, Any] = {
        "server": server.model_copy(update=on_server),
        "workloads": [_resolve_workload(w, base) for w in spec.workloads],
    }
    if spec.store:
        update["store"] = resolve_path(spec.store, base)
    return spec.model_copy(update=update)


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"a boolean ({value!r})"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"a string ({_short(value)})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---- pydantic errors -> one line ------------------------------------------------


def _existing_prefix(data: Any, loc: Sequence[int | str]) -> list[int | str]:
    """The longest prefix of ``loc`` that names something present in ``data``."""
    out: list[int | str] = []
    node = data
    for part in loc:
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if not (in_dict or in_list):
            break
        node = node[part]
        out.append(part)
    return out


def _unwrap(tp: Any) -> Any:
    origin = get_origin(tp)
    if origin is Annotated:
        return _unwrap(get_args(tp)[0])
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return _unwrap(args[0]) if len(args) == 1 else tp
    return tp


def _member_for(tp: Any, part: int | str) -> Any:
    """The member of a union (a list or a range, one objective or a list) that ``part``
    can index: a model for a key, a list for an index."""
    if get_origin(tp) not in (Union, types.UnionType):
        return tp
    for member in get_args(tp):
        member = _unwrap(member)
        is_model = isinstance(member, type) and issubclass(member, BaseModel)
        if (isinstance(part, str) and is_model) or (
            isinstance(part, int) and get_origin(member) is list
        ):
            return member
    return tp


def _model_at(loc: Sequence[int | str]) -> type[BaseModel] | None:
    tp: Any = SweepSpec
    for part in loc:
        tp = _member_for(_unwrap(tp), part)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(str(part))
            if field is None:
                return None
            tp = field.annotation
        elif get_origin(tp) in (list, dict):
            tp = get_args(tp)[-1]
        else:
            return None
    tp = _member_for(_unwrap(tp), "")
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _unknown_key(key: str, parent: Sequence[int | str]) -> str:
    model = _model_at(parent)
    if model is None:
        return "unknown key"
    fields = list(model.model_fields)
    close = difflib.get_close_matches(key.replace("-", "_"), fields, n=1, cutoff=0.6)
    if close:
        return f"unknown key {key!r} (did you mean {close[0]!r}?)"
    for name, info in model.model_fields.items():
        child = _unwrap(info.annotation)
        if isinstance(child, type) and issubclass(child, BaseModel) and key in child.model_fields:
            return f"unknown key {key!r} (it belongs under '{name}')"
    return f"unknown key {key!r} (known keys: {', '.join(fields)})"


_TYPE_WORDS = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list ([a, b] or one '- item' per line)",
    "dict_type": "a mapping (key: value)",
    "model_type": "a mapping (key: value)",
    "model_attributes_type": "a mapping (key: value)",
}
_BOUNDS = {
    "greater_than": ">",
    "greater_than_equal": ">=",
    "less_than": "<",
    "less_than_equal": "<=",
}


def _message(error: ErrorDetails, key: str, parent: Sequence[int | str]) -> str:
    kind = error["type"]
    value = error.get("input")
    ctx = error.get("ctx") or {}
    if kind == "missing":
        return "missing required key"
    if kind == "extra_forbidden":
        return _unknown_key(key.rsplit(".", 1)[-1], parent)
    if kind in _TYPE_WORDS and value is None:
        return f"has no value (expected {_TYPE_WORDS[kind]})"
    if kind in _TYPE_WORDS:
        return f"expected {_TYPE_WORDS[kind]}, got {_kind(value)}"
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()), "?")
        return f"out of range: {_short(value)} (must be {_BOUNDS[kind]} {bound})"
    if kind == "literal_error":
        return f"{_short(value)} is not one of {ctx.get('expected', '?')}"
    if kind == "too_short" and ctx.get("min_length") == 1:
        return "must not be empty"
    if kind == "string_pattern_mismatch" and key.endswith("name"):
        return (
            f"not a valid name: {_short(value)} (use letters, digits, '_' and '-', "
            "starting with a letter or '_')"
        )
    if kind in ("value_error", "assertion_error"):
        message = str(error["msg"])
        for prefix in ("Value error, ", "Assertion failed, "):
            message = message.removeprefix(prefix)
        return message
    return f"{error['msg']} (got {_short(value)})"


def _explained_missing(
    found: Mapping[str, list[tuple[ErrorDetails, list[int | str]]]],
) -> int:
    """Missing keys that an unknown key beside them probably misspells."""
    unknown = {
        (tuple(path[:-1]), str(path[-1]))
        for errors in found.values()
        for error, path in errors[:1]
        if error["type"] == "extra_forbidden" and path
    }
    count = 0
    for errors in found.values():
        error, path = errors[0]
        if error["type"] != "missing" or not path:
            continue
        parent, name = tuple(path[:-1]), str(path[-1])
        typos = [u for p, u in unknown if p == parent]
        if difflib.get_close_matches(name, typos, n=1, cutoff=0.6):
            count += 1
    return count


def _translate(exc: ValidationError, data: Any, name: str, lines: Mapping[str, int]) -> ConfigError:
    found: dict[str, list[tuple[ErrorDetails, list[int | str]]]] = {}
    for error in exc.errors(include_url=False):
        loc = [part for part in error["loc"] if part not in UNION_TAGS]
        path = loc if error["type"] == "missing" else _existing_prefix(data, loc)
        key = ".".join(str(p) for p in path)
        found.setdefault(key, []).append((error, path))
    # the first problem in file order; a missing key last (an unknown key is
    # usually its misspelling and says more)
    order = sorted(
        found,
        key=lambda k: (
            _line_of(lines, k) is None,
            _line_of(lines, k) or 0,
            found[k][0][0]["type"] == "missing",
        ),
    )
    key = order[0]
    error, path = found[key][0]
    errors = found[key]
    if len(errors) > 1 and len(error["loc"]) > len(path):
        # one value failed every member of a union (a param value of an odd type)
        message = f"unsupported value: {_kind(error.get('input'))}"
    else:
        message = _message(error, key, path[:-1])
    more = len(found) - 1 - _explained_missing(found)
    if more > 0:
        message += f" (and {more} more problem{'s' if more > 1 else ''})"
    return ConfigError(message, file=name, line=_line_of(lines, key), key=key or None)
