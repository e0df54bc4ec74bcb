"""Read YAML text into plain data plus a map of where each key is written.

The YAML is composed into its node tree first, so every key path
(``server.timeouts.release``, ``workloads.0.name``) gets its 1-based line, and
duplicate keys are found before any value is built. Timestamps stay strings
(``2024-01-01`` is not a date here), only safe tags are accepted, and alias bombs
or recursive aliases are refused before anything walks the data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from servesweep.errors import ConfigError

__all__ = ["MAX_NODES", "YamlSource", "read_yaml"]

MAX_NODES = 200_000
"""A sweep file with more values than this (aliases expanded) is refused."""

_MERGE_TAG = "tag:yaml.org,2002:merge"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"


class _Loader(yaml.SafeLoader):
    """SafeLoader that keeps timestamps as strings."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _refuse_tag(loader: yaml.SafeLoader, node: Node) -> Any:
    tag = str(node.tag).replace("tag:yaml.org,2002:", "!!")
    raise yaml.constructor.ConstructorError(
        None, None, f"could not determine a constructor for the tag {tag}", node.start_mark
    )


# only plain values, lists and mappings: no sets, bytes or ordered pairs
for _tag in ("set", "binary", "omap", "pairs"):
    _Loader.add_constructor(f"tag:yaml.org,2002:{_tag}", _refuse_tag)


@dataclass(frozen=True)
class YamlSource:
    data: Any
    lines: Mapping[str, int]
    """Dotted key path -> 1-based line; ``""`` is the document."""


def _yaml_message(exc: yaml.YAMLError) -> tuple[str, int | None]:
    line: int | None = None
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        if mark is not None:
            line = mark.line + 1
        problem = exc.problem or ""
        if problem.startswith("could not determine a constructor for the tag"):
            tag = problem.rsplit(" ", 1)[-1].replace("tag:yaml.org,2002:", "!!").strip("'")
            return f"YAML tag '{tag}' is not allowed (only plain values, lists and mappings)", line
        parts = [p for p in (exc.context, problem) if p]
        text = ", ".join(parts) or "invalid YAML"
        context = exc.context_mark
        if context is not None and mark is not None and context.line != mark.line:
            text += f" (it starts on line {context.line + 1})"
    elif isinstance(exc, yaml.reader.ReaderError):
        text = f"unreadable character {chr(exc.character)!r} at position {exc.position}"
    else:
        text = str(exc).splitlines()[0] if str(exc) else "invalid YAML"
    text = " ".join(text.split())
    if "'\\t'" in text or "\\t" in text:
        text += " (indent YAML with spaces, not tabs)"
    return f"YAML syntax error: {text}", line


class _Walker:
    """Walks the node tree: lines of key paths, duplicate keys, size and cycles."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lines: dict[str, int] = {}
        self._sizes: dict[int, int] = {}
        self._active: set[int] = set()
        self._walked: set[int] = set()

    def size(self, node: Node) -> int:
        ident = id(node)
        if ident in self._sizes:
            return self._sizes[ident]
        if ident in self._active:
            raise ConfigError(
                "recursive YAML alias (a value that contains itself)",
                file=self.name,
                line=node.start_mark.line + 1,
            )
        self._active.add(ident)
        total = 1
        if isinstance(node, SequenceNode):
            total += sum(self.size(child) for child in node.value)
        elif isinstance(node, MappingNode):
            total += sum(self.size(k) + self.size(v) for k, v in node.value)
        self._active.discard(ident)
        self._sizes[ident] = total
        if total > MAX_NODES:
            raise ConfigError(
                f"the YAML holds more than {MAX_NODES} values (aliases expanded); "
                "a sweep file should be much smaller",
                file=self.name,
                line=node.start_mark.line + 1,
            )
        return total

    def walk(self, node: Node, path: str) -> None:
        if id(node) in self._walked:
            return  # an alias: its lines are where the anchor is written
        self._walked.add(id(node))
        if isinstance(node, SequenceNode):
            for index, child in enumerate(node.value):
                child_path = f"{path}.{index}" if path else str(index)
                self.lines.setdefault(child_path, child.start_mark.line + 1)
                self.walk(child, child_path)
        elif isinstance(node, MappingNode):
            seen: dict[str, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE_TAG or not isinstance(key_node, ScalarNode):
                    continue
                key = str(key_node.value)
                line = key_node.start_mark.line + 1
                child_path = f"{path}.{key}" if path else key
                if key in seen:
                    raise ConfigError(
                        f"duplicate key (first written on line {seen[key]})",
                        file=self.name,
                        line=line,
                        key=child_path,
                    )
                seen[key] = line
                self.lines.setdefault(child_path, line)
                self.walk(value_node, child_path)


def read_yaml(text: str, name: str) -> YamlSource:
    """Parse YAML text; every problem is a one-line ConfigError naming ``name``."""
    loader = _Loader(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError as exc:
            message, line = _yaml_message(exc)
            raise ConfigError(message, file=name, line=line) from None
        except RecursionError:
            raise ConfigError("the YAML is nested too deeply", file=name) from None
        if node is None:
            raise ConfigError("the sweep file is empty", file=name)
        walker = _Walker(name)
        try:
            walker.size(node)
            walker.lines[""] = node.start_mark.line + 1
            walker.walk(node, "")
            data = loader.construct_document(node)
        except yaml.YAMLError as exc:
            message, line = _yaml_message(exc)
            raise ConfigError(message, file=name, line=line) from None
        except RecursionError:
            raise ConfigError("the YAML is nested too deeply", file=name) from None
    finally:
        loader.dispose()
    return YamlSource(data=data, lines=walker.lines)
