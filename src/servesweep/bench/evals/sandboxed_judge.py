"""The judge of a sandboxed run: run the hidden tests against the candidate's
process and write the verdict.

Executed as a script by a fresh interpreter (``python -I -S -B``) in a sandbox of
its own; standard library only. The candidate never runs here: the tests call a
stand-in (:class:`Remote`) that sends the call's arguments to the candidate's
process and gets back plain data (``wire.decode``), so the values the tests compare
are builtin values whose ``__eq__`` is Python's own, and neither the tests, the
expected values nor this verdict are in the candidate's reach.

The test code runs in a namespace of its own: the task's prompt (when it is
Python: the signature, helpers such as HumanEval's ``poly`` and imports), then,
for names the tests use that neither the prompt nor the builtins define, the
candidate's own functions (as stand-ins), data and modules (imported here).

Inputs: ``argv[1]`` is the job file ``{"test", "prompt", "entry_point",
"requests_fd", "replies_fd", "verdict_fd", "uid", "gid", "workdir", "limits"}``.
Output: one line on ``verdict_fd``, ``{"status", "message"}``, where status is
``pass``, ``fail``, ``crash``, ``resource_limit`` or ``gone`` (the candidate's
process ended or stopped answering; servesweep tells why from its exit status).
"""

from __future__ import annotations

import builtins
import errno as errnos
import json
import os
import sys
import types
from typing import IO, Any, NoReturn

if __package__:  # imported as a module of servesweep (tests, type checks)
    import servesweep.bench.evals.wire as wire
    from servesweep.bench.evals.confine import confine
else:  # a script in the sandbox, next to wire.py and confine.py
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import wire  # type: ignore[import-not-found,no-redef]
    from confine import confine  # type: ignore[import-not-found,no-redef]

_LIMIT_ERRNOS = {
    errnos.EAGAIN, errnos.EMFILE, errnos.ENFILE, errnos.EFBIG, errnos.ENOSPC, errnos.ENOMEM,
}  # fmt: skip
_MESSAGE_MAX = 2000
_WHERE = "_servesweep_where"


class CandidateGone(BaseException):
    """The candidate's process ended, closed its channel or broke the protocol.
    A BaseException: a test's ``except Exception`` cannot swallow it."""


class CandidateExited(BaseException):
    """The program called ``sys.exit`` (or raised ``SystemExit``)."""


class AnswerNotData(BaseException):
    """The answer returned something that is not plain data."""


class Remote:
    """Stands for a function (or class) of the candidate: a call sends the
    arguments to its process and returns the plain value it answered."""

    def __init__(self, link: Link, name: str) -> None:
        self._link = link
        self.__name__ = name

    def __repr__(self) -> str:
        return f"<the answer's {self.__name__}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._link.call(self.__name__, self.__name__, args, kwargs)


class RemoteObject:
    """Stands for an object of the answer's own that stays in its process (MBPP's
    ``Node(1)``): attributes are read and set there, methods called there. Equal
    only to itself: never taken for a value."""

    __slots__ = ("_link", "_number")

    def __init__(self, link: Link, number: int) -> None:
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_number", number)

    def __repr__(self) -> str:
        return f"<an object of the answer's, #{self._number}>"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._link.attribute(self._number, name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._link.set_attribute(self._number, name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._link.call({"ref": self._number}, repr(self), args, kwargs)


class Link:
    """The two pipes to the candidate's process."""

    def __init__(self, requests: IO[bytes], replies: IO[bytes]) -> None:
        self._requests = requests
        self._replies = replies
        self._objects: dict[int, RemoteObject] = {}

    def receive(self) -> dict[str, Any]:
        try:
            message = wire.receive(self._replies)
        except wire.ProtocolError as exc:
            raise CandidateGone(f"it sent something that is not a reply ({exc})") from None
        if message is None:
            raise CandidateGone("it ended before answering")
        return message

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            wire.send(self._requests, message)
        except OSError:
            raise CandidateGone("it ended before answering") from None
        return self.receive()

    def _object(self, number: int) -> RemoteObject:
        if number not in self._objects:
            self._objects[number] = RemoteObject(self, number)
        return self._objects[number]

    def _encode(self, value: Any, what: str) -> Any:
        def ours(item: Any) -> Any:
            if isinstance(item, RemoteObject) and item._link is self:
                return {"T": "ref", "v": item._number}
            raise wire.NotData(f"a value of type {type(item).__name__}")

        try:
            return wire.encode(value, ours)
        except wire.NotData as exc:
            raise TypeError(f"the test passes {exc} to {what}, which is not plain data") from None

    def _value(self, what: str, reply: dict[str, Any]) -> Any:
        if "ok" not in reply:
            raise _failure(what, reply)
        try:
            return wire.decode(reply["ok"], self._object)
        except wire.NotData as exc:
            raise AnswerNotData(f"{what} returned {exc}") from None

    def call(
        self, target: str | dict[str, int], what: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        message = {
            "call": target,
            "args": [self._encode(a, f"{what}()") for a in args],
            "kwargs": {str(k): self._encode(v, f"{what}()") for k, v in kwargs.items()},
        }
        reply = self.request(message)
        value = self._value(f"{what}()", reply)
        _write_back(args, kwargs, reply.get("changed"))
        return value

    def get(self, name: str) -> Any:
        return self._value(name, self.request({"get": name}))

    def attribute(self, number: int, name: str) -> Any:
        return self._value(f".{name}", self.request({"getattr": [number, name]}))

    def set_attribute(self, number: int, name: str, value: Any) -> None:
        data = self._encode(value, f".{name}")
        self._value(f".{name}", self.request({"setattr": [number, name, data]}))


def _failure(what: str, reply: dict[str, Any]) -> BaseException:
    if "raised" in reply and type(reply["raised"]) is dict:
        return _rebuilt(reply["raised"])
    if "not_data" in reply:
        text = str(reply["not_data"])[:200]
        return AnswerNotData(
            f"{what} returned {text}, which is not plain data ({wire.PLAIN_TYPES})"
        )
    if "exit" in reply:
        return CandidateExited(str(reply["exit"])[:200])
    return CandidateGone(f"it sent something that is not a reply to {what}")


def _rebuilt(error: dict[str, Any]) -> BaseException:
    """The candidate's exception as a builtin exception of the same name (so a test
    expecting ``ValueError`` still catches it), else a plain ``Exception``."""
    name = str(error.get("type", "Exception"))[:100]
    message = str(error.get("message", ""))[:_MESSAGE_MAX]
    code = error.get("errno")
    kind = getattr(builtins, name, None)
    exc: BaseException
    try:
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            raise TypeError
        if issubclass(kind, OSError) and type(code) is int:
            exc = kind(code, message)
        else:
            exc = kind(message)
    except Exception:
        exc = Exception(f"{name}: {message}")
    setattr(exc, _WHERE, str(error.get("where", ""))[:_MESSAGE_MAX])
    return exc


def _write_back(args: tuple[Any, ...], kwargs: dict[str, Any], changed: Any) -> None:
    """Mutate the test's arguments as the call mutated the candidate's copies."""
    if type(changed) is not dict:
        return
    for key, data in changed.items():
        target: Any = args[int(key)] if key.isdigit() and int(key) < len(args) else kwargs.get(key)
        try:
            new = wire.decode(data)
        except wire.NotData:
            continue
        if type(target) is list and type(new) is list:
            target[:] = new
        elif (type(target), type(new)) in ((dict, dict), (set, set)):
            target.clear()
            target.update(new)
        elif type(target) is bytearray and type(new) is bytearray:
            target[:] = new


def _names(code: types.CodeType) -> set[str]:
    found = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _names(const)
    return found


def _where(exc: BaseException, test: str) -> str:
    """Where it happened: in the candidate (as it reported), else the innermost
    line of the tests."""
    reported = getattr(exc, _WHERE, None)
    if isinstance(reported, str):
        return reported
    line, tb = None, exc.__traceback__
    while tb is not None:  # (importing traceback costs a run ~10 ms)
        if tb.tb_frame.f_code.co_filename == "<test>":
            line = tb.tb_lineno
        tb = tb.tb_next
    lines = test.splitlines()
    text = lines[line - 1].strip() if line and line <= len(lines) else ""
    return f" (at test line {line}: {text})" if text else ""


def _classify(exc: BaseException, test: str, limits: dict[str, int]) -> dict[str, str]:
    if isinstance(exc, CandidateGone):
        return {"status": "gone", "message": str(exc)}
    if isinstance(exc, CandidateExited):
        return {"status": "crash", "message": f"exited with {exc} before the tests finished"}
    if isinstance(exc, AnswerNotData):
        return {"status": "fail", "message": f"{exc}"}
    text = f"{type(exc).__name__}: {exc}".rstrip(": ")
    where = _where(exc, test)
    if isinstance(exc, MemoryError):
        mib = limits.get("memory_bytes", 0) // 2**20
        return {"status": "resource_limit", "message": f"out of memory (limit {mib} MiB){where}"}
    if isinstance(exc, OSError) and exc.errno in _LIMIT_ERRNOS:
        return {"status": "resource_limit", "message": f"{text}{where}"}
    return {"status": "fail", "message": f"{text}{where}"}


def _namespace(job: dict[str, Any], kinds: dict[str, str], link: Link) -> dict[str, Any]:
    entry = str(job["entry_point"])
    namespace: dict[str, Any] = {"__name__": "judge", "__builtins__": builtins}
    prompt: dict[str, Any] = {"__name__": "prompt", "__builtins__": builtins}
    try:
        exec(compile(str(job.get("prompt") or ""), "<prompt>", "exec"), prompt)
    except BaseException:
        prompt = {}  # not Python (an MBPP text), or it needs what is not here
    namespace.update((k, v) for k, v in prompt.items() if not k.startswith("__") and k != entry)
    for name in sorted(_names(compile(str(job["test"]), "<test>", "exec"))):
        kind = kinds.get(name, "")
        if name in namespace or hasattr(builtins, name) or not kind:
            continue
        if kind == "callable":
            namespace[name] = Remote(link, name)
        elif kind == "data":
            try:
                namespace[name] = link.get(name)
            except AnswerNotData:
                continue
        elif kind.startswith("module:"):
            try:
                namespace[name] = __import__(kind[len("module:") :], fromlist=["_"])
            except Exception:
                continue
    namespace[entry] = Remote(link, entry)
    return namespace


def judge(job: dict[str, Any], link: Link) -> dict[str, str]:
    test, limits, entry = str(job["test"]), job["limits"], str(job["entry_point"])
    try:
        hello = link.receive()
        if "exit" in hello:
            raise CandidateExited(str(hello["exit"])[:200])
        if "load_error" in hello and type(hello["load_error"]) is dict:
            raise _rebuilt(hello["load_error"])
        kinds = hello.get("hello", {}).get("names") if type(hello.get("hello")) is dict else None
        if type(kinds) is not dict:
            raise CandidateGone("it sent something that is not a greeting")
        kinds = {str(k): str(v) for k, v in kinds.items()}
        if kinds.get(entry) != "callable":
            return {"status": "fail", "message": f"the answer defines no function {entry!r}"}
        namespace = _namespace(job, kinds, link)
        exec(compile(test, "<test>", "exec"), namespace)
        check = namespace.get("check")
        if not callable(check):
            return {"status": "fail", "message": "the test code defines no check(candidate)"}
        check(namespace[entry])
    except BaseException as exc:
        return _classify(exc, test, limits)
    return {"status": "pass", "message": ""}


def main() -> NoReturn:
    with open(sys.argv[1], encoding="utf-8") as f:
        job: dict[str, Any] = json.load(f)
    link = Link(os.fdopen(int(job["requests_fd"]), "wb"), os.fdopen(int(job["replies_fd"]), "rb"))
    verdict_fd = int(job["verdict_fd"])
    confine(job)
    verdict = judge(job, link)
    verdict["message"] = verdict["message"][:_MESSAGE_MAX]
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105  (contextlib costs every run an import)
            stream.flush()
        except BaseException:
            pass
    try:
        os.write(verdict_fd, (json.dumps(verdict) + "\n").encode())
    finally:
        os._exit(0)


if __name__ == "__main__":
    main()
