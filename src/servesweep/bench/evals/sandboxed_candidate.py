"""The candidate's side of a sandboxed run: load the answer's program, then call its
functions for the judge, one request at a time, and send back plain data.

Executed as a script by a fresh interpreter (``python -I -S -B -u``) in the
candidate's own sandbox; standard library only. Nothing here is trusted: the
program it loads can change any of it (patch builtins, walk frames, write on any
descriptor). That is harmless by design: the hidden tests, the expected values and
the verdict live in the judge, another process that treats every reply as hostile
data (see ``sandboxed_judge.py`` and ``wire.py``).

Inputs: ``argv[1]`` is the job file ``{"program", "requests_fd", "replies_fd",
"uid", "gid", "workdir", "limits"}``. Replies, one line each (``wire.send``):

* first ``{"hello": {"names": {name: "callable" | "data" | "module:NAME"}}}``, or
  ``{"load_error": ERROR}`` / ``{"exit": TEXT}`` when the program did not load;
* to ``{"call": name, "args": [...], "kwargs": {...}}``: ``{"ok": value,
  "changed": {index or name: value}}`` (arguments the call mutated),
  ``{"raised": ERROR}``, ``{"not_data": type}`` or ``{"exit": TEXT}``;
* to ``{"get": name}``: ``{"ok": value}`` or ``{"not_data": type}``;
* to ``{"getattr": [ref, name]}`` and ``{"setattr": [ref, name, value]}`` (an
  object of its own the tests hold as a reference): ``{"ok": value}`` or
  ``{"raised": ERROR}``. A call's target may be ``{"ref": n}`` too (a method).

``ERROR`` is ``{"type", "message", "errno", "where"}``.
"""

from __future__ import annotations

import builtins
import json
import os
import sys
import types
from typing import IO, Any

if __package__:  # imported as a module of servesweep (tests, type checks)
    import servesweep.bench.evals.wire as wire
    from servesweep.bench.evals.confine import confine
else:  # a script in the sandbox, next to wire.py and confine.py
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import wire  # type: ignore[import-not-found,no-redef]
    from confine import confine  # type: ignore[import-not-found,no-redef]

_MESSAGE_MAX = 2000
_NAMES_MAX = 10000


def _where(exc: BaseException, source: str) -> str:
    """`` (at candidate line 3: return x)`` for the innermost frame of the program."""
    line, tb = None, exc.__traceback__
    while tb is not None:  # (importing traceback costs a run ~10 ms)
        if tb.tb_frame.f_code.co_filename == "<candidate>":
            line = tb.tb_lineno
        tb = tb.tb_next
    lines = source.splitlines()
    text = lines[line - 1].strip() if line and line <= len(lines) else ""
    return f" (at candidate line {line}: {text})" if text else ""


def _error(exc: BaseException, source: str) -> dict[str, Any]:
    errno = getattr(exc, "errno", None)
    try:
        if isinstance(exc, OSError) and type(errno) is int and exc.strerror:
            # Rebuilt by the judge as OSError(errno, message), which adds "[Errno N]".
            message = exc.strerror + (f": {exc.filename!r}" if exc.filename else "")
        else:
            message = str(exc)
    except BaseException:
        message = ""
    return {
        "type": type(exc).__name__,
        "message": message[:_MESSAGE_MAX],
        "errno": errno if type(errno) is int else None,
        "where": _where(exc, source)[:_MESSAGE_MAX],
    }


def _exit_text(exc: SystemExit) -> str:
    return repr(exc.code)[:200]


def _kinds(namespace: dict[str, Any]) -> dict[str, str]:
    kinds: dict[str, str] = {}
    for name, value in list(namespace.items())[:_NAMES_MAX]:
        if not isinstance(name, str) or name.startswith("__"):
            continue
        if isinstance(value, types.ModuleType):
            kinds[name] = f"module:{value.__name__}"
        elif callable(value):
            kinds[name] = "callable"
        else:
            kinds[name] = "data"
    return kinds


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105  (contextlib costs every run an import)
            stream.flush()
        except BaseException:
            pass


class Answerer:
    """Answers the judge's requests from the program's namespace. Objects of the
    program's own that the tests make (by calling one of its classes) stay here
    and cross as references."""

    def __init__(self, namespace: dict[str, Any], source: str) -> None:
        self.namespace = namespace
        self.source = source
        self.refs: list[Any] = []
        self.numbers: dict[int, int] = {}

    def keep(self, value: Any) -> dict[str, Any]:
        number = self.numbers.get(id(value))
        if number is None:
            number = self.numbers[id(value)] = len(self.refs)
            self.refs.append(value)  # alive, so its id is not reused
        return {"T": "ref", "v": number}

    def ref(self, number: int) -> Any:
        if not 0 <= number < len(self.refs):
            raise wire.NotData(f"no object {number}")
        return self.refs[number]

    def reply(self, message: dict[str, Any]) -> dict[str, Any] | None:
        try:
            if "call" in message:
                return self._call(message)
            if "get" in message:
                return self._value(self.namespace.get(str(message["get"])), refs=False)
            if "getattr" in message:
                number, name = message["getattr"]
                return self._value(getattr(self.ref(number), str(name)), refs=True)
            if "setattr" in message:
                number, name, data = message["setattr"]
                setattr(self.ref(number), str(name), wire.decode(data, self.ref))
                return {"ok": None}
        except SystemExit as exc:
            return {"exit": _exit_text(exc)}
        except BaseException as exc:
            return {"raised": _error(exc, self.source)}
        return None

    def _value(self, value: Any, refs: bool) -> dict[str, Any]:
        try:
            return {"ok": wire.encode(value, self.keep if refs else None)}
        except wire.NotData as exc:
            return {"not_data": str(exc)[:200]}

    def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        target = message["call"]
        function = self.ref(target["ref"]) if type(target) is dict else self.namespace.get(target)
        raw_args, raw_kwargs = message["args"], message["kwargs"]
        args = [wire.decode(a, self.ref) for a in raw_args]
        kwargs = {str(k): wire.decode(v, self.ref) for k, v in raw_kwargs.items()}
        if not callable(function):
            raise TypeError(f"{target!r} is not callable")
        result = function(*args, **kwargs)
        # An object of its own only from one of its classes (or a method of such an
        # object): a function's answer must be plain data.
        reply = self._value(result, refs=type(target) is dict or isinstance(function, type))
        changed: dict[str, Any] = {}
        for key, before, after in [
            *((str(i), raw_args[i], args[i]) for i in range(len(args))),
            *((k, raw_kwargs[k], kwargs[k]) for k in kwargs),
        ]:
            try:
                now = wire.encode(after)
            except wire.NotData:
                continue
            if now != before:
                changed[key] = now
        return {**reply, "changed": changed}


def serve(requests: IO[bytes], replies: IO[bytes], namespace: dict[str, Any], source: str) -> None:
    answerer = Answerer(namespace, source)
    while True:
        try:
            message = wire.receive(requests)
        except wire.ProtocolError:
            return
        if message is None:
            return
        reply = answerer.reply(message)
        if reply is None:
            return
        _flush()
        wire.send(replies, reply)


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        job: dict[str, Any] = json.load(f)
    requests = os.fdopen(int(job["requests_fd"]), "rb")
    replies = os.fdopen(int(job["replies_fd"]), "wb")
    confine(job)
    source = str(job["program"])
    del job
    run(source, requests, replies)
    _flush()
    os._exit(0)


def run(source: str, requests: IO[bytes], replies: IO[bytes]) -> None:
    """Load the program, greet, answer calls until the judge is done."""
    # Not "__main__": an answer's `if __name__ == "__main__":` demo block must not run.
    namespace: dict[str, Any] = {"__name__": "candidate", "__builtins__": builtins}
    try:
        exec(compile(source, "<candidate>", "exec"), namespace)
    except SystemExit as exc:
        hello: dict[str, Any] = {"exit": _exit_text(exc)}
    except BaseException as exc:
        hello = {"load_error": _error(exc, source)}
    else:
        hello = {"hello": {"names": _kinds(namespace)}}
    _flush()
    wire.send(replies, hello)
    if "hello" in hello:
        serve(requests, replies, namespace, source)


if __name__ == "__main__":
    main()
