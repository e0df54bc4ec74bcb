"""Turn a model's answer into a program to test, or a text answer to check.

Code answers come in three shapes, all handled by :func:`extract_program`:

1. fenced blocks (```` ```python ```` or a bare ```` ``` ````): the block that
   defines the entry point wins, else the first Python-looking block;
2. bare code that defines the entry point;
3. a completion of the prompt: only the function body (what a completions
   endpoint returns after the prompt), which is appended to the prompt.

When the answer defines the entry point itself, what the prompt holds before the
function (imports, helper functions) is put in front, so an answer that only
repeats the function still finds ``List`` or a helper.
"""

from __future__ import annotations

import re

__all__ = ["extract_program", "fenced_blocks", "normalize_text", "strip_reasoning"]

_FENCE = re.compile(
    r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:^[ \t]*\1[ \t]*$|\Z)",
    re.DOTALL | re.MULTILINE,
)
_THINK = re.compile(r"<think(?:ing)?>.*?(?:</think(?:ing)?>|\Z)", re.DOTALL | re.IGNORECASE)
_PY_LANGS = {"", "python", "py", "python3", "py3"}


def strip_reasoning(text: str) -> str:
    """Drop ``<think>...</think>`` sections (an unclosed one runs to the end)."""
    return _THINK.sub("", text)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced block, in order; an unterminated last
    block (the answer hit ``max_tokens``) counts too."""
    return [(m.group(2).lower(), m.group(3)) for m in _FENCE.finditer(text)]


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def _prompt_preamble(prompt: str, entry_point: str) -> str:
    """What the prompt holds before the entry point's ``def`` (imports, helpers)."""
    match = re.search(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", prompt, re.MULTILINE)
    return prompt[: match.start()] if match else ""


def _as_body(code: str) -> str:
    """A completion of the prompt: keep the indented body, stop at the first line
    back at column 0 (the model went on with other code or prose); indent a body
    written flush left."""
    lines = code.splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    if lines and not lines[0][:1].isspace():
        lines = ["    " + ln if ln.strip() else ln for ln in lines]
    body = []
    for ln in lines:
        if ln.strip() and not ln[:1].isspace():
            break
        body.append(ln)
    return "\n".join(body) + "\n"


_CODE_START = re.compile(r"^(?:def |async def |class |import |from |@)")


def _trim_prose(text: str, entry_point: str) -> str:
    """Bare code amid prose: from the first line that starts code, to the longest
    end that still compiles."""
    if not _defines(text, entry_point) or _compiles(text):
        return text
    lines = text.splitlines()
    first = next((i for i, ln in enumerate(lines) if _CODE_START.match(ln)), 0)
    lines = lines[first:]
    for end in range(len(lines), 0, -1):
        code = "\n".join(lines[:end]) + "\n"
        if _defines(code, entry_point) and _compiles(code):
            return code
    return text


def _compiles(code: str) -> bool:
    try:
        compile(code, "<answer>", "exec")
    except (SyntaxError, ValueError):
        return False
    return True


def extract_program(answer: str, prompt: str, entry_point: str) -> str | None:
    """The program to run for a coding task's answer, or None when there is no code."""
    text = strip_reasoning(answer)
    blocks = [code for lang, code in fenced_blocks(text) if lang in _PY_LANGS]
    if blocks:
        defining = [code for code in blocks if _defines(code, entry_point)]
        code = defining[0] if defining else blocks[0]
    else:
        code = _trim_prose(text, entry_point)
    if not code.strip():
        return None
    if _defines(code, entry_point):
        preamble = _prompt_preamble(prompt, entry_point)
        return f"{preamble}\n{code}" if preamble.strip() else code
    body = _as_body(code)
    if not body.strip():
        return None
    prefix = prompt if prompt.endswith("\n") else prompt + "\n"
    return prefix + body


_WS = re.compile(r"\s+")
_WRAP = "\"'`*_ "


def normalize_text(text: str) -> str:
    """Strip reasoning, whitespace, wrapping quotes/markup and a trailing period;
    collapse inner whitespace; casefold."""
    out = _WS.sub(" ", strip_reasoning(text)).strip()
    for _ in range(3):
        out = out.strip(_WRAP).rstrip(".!").strip(_WRAP)
    return out.casefold()
