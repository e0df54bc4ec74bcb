"""Helpers for launchers that drive an external manager (systemctl, docker).

``run_tool`` runs one command of the manager with a time limit and turns every way it
can fail into :class:`~servesweep.errors.LaunchError`. ``LogCopier`` copies an
instance's log from the manager (``journalctl -f``, ``docker logs -f``) into the
trial's log file, so the readiness gate can follow a plain file whatever the launcher.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from servesweep.errors import LaunchError
from servesweep.servers.logs import log_marker, write_header

__all__ = ["LogCopier", "run_tool"]

_DETAIL = 400
# Runs the follower until its stdin closes: at ``finish``, or when servesweep itself
# exits however it ends, so no follower outlives the process that needs it. The
# follower's children get SIGTERM first: a wrapper such as nsenter (the systemd
# sandbox's journalctl) then reaps its child and exits by itself; killing the wrapper
# first would leave the child a zombie that no init reaps. After 2 s (at once when it
# has no children): SIGTERM to the follower itself.
_WATCHDOG = """
"$@" & f=$!
read -r _ || true
i=20
for c in $(cat /proc/"$f"/task/*/children 2>/dev/null); do kill "$c" 2>/dev/null; i=0; done
while [ "$i" -lt 20 ]; do
    case "$(sed 's/.*) //' /proc/"$f"/stat 2>/dev/null)" in [RSD]*) ;; *) break ;; esac
    sleep 0.1
    i=$((i + 1))
done
kill "$f" 2>/dev/null
wait "$f"
exit 0
"""


def run_tool(
    argv: Sequence[str],
    *,
    timeout: float = 30.0,
    check: bool = True,
    what: str = "",
    merge_stderr: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` and return its result; LaunchError when it cannot run, times out
    or (with ``check``) exits non-zero, naming the command and its stderr.
    ``merge_stderr`` sends stderr into stdout, in the order it was written."""
    cmd = shlex.join(argv)
    label = f"{what}: " if what else ""
    try:
        done = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError as exc:
        raise LaunchError(
            f"{label}command not found: {argv[0]!r} (check PATH or the spec)"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise LaunchError(f"{label}`{cmd}` did not finish within {timeout:g}s") from exc
    except OSError as exc:
        raise LaunchError(f"{label}cannot run `{cmd}`: {exc}") from exc
    if check and done.returncode != 0:
        detail = ((done.stderr or "").strip() or done.stdout.strip())[-_DETAIL:]
        raise LaunchError(f"{label}`{cmd}` exited with {done.returncode}: {detail}")
    return done


class LogCopier:
    """Copies one instance's log into the trial's log file while it runs.

    ``start`` appends the header line (``=== servesweep instance TAG starting ...``,
    the marker the log watcher skips to) and runs ``follow_argv`` with its output
    appended to the file, under a shell watchdog that ends it when servesweep's end
    of its stdin pipe closes. ``finish`` ends the follower and appends whatever it had not
    copied yet, read once with ``dump`` (the same lines, from the beginning: a command, or
    a function of the time limit that returns them and whether it read them all, and
    raises LaunchError when it cannot), so the file ends complete even when the follower
    lagged.
    """

    def __init__(
        self,
        log_path: Path,
        tag: str,
        follow_argv: Sequence[str],
        dump: Sequence[str] | Callable[[float], tuple[str, bool]],
    ) -> None:
        self.log_path = log_path
        self.tag = tag
        self.follow_argv = list(follow_argv)
        self.dump = dump if callable(dump) else list(dump)
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, argv_for_header: Sequence[str]) -> None:
        write_header(self.log_path, self.tag, argv_for_header)
        try:
            with open(self.log_path, "ab") as out:
                self._proc = subprocess.Popen(
                    ["sh", "-c", _WATCHDOG, "servesweep-log-copy", *self.follow_argv],
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    close_fds=True,
                )
        except OSError as exc:
            raise LaunchError(
                f"cannot copy the server log with `{shlex.join(self.follow_argv)}`: {exc}"
            ) from exc

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def finish(self, timeout: float = 10.0) -> bool:
        """Stop following and append the lines the follower missed (best effort);
        returns whether the complete log could be read."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()  # the watchdog ends the follower
            try:
                proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=2.0)
        try:
            full, complete = self._dump(timeout)
        except LaunchError:
            return False
        copied = self._copied_text()
        if full.startswith(copied):
            rest = full[len(copied) :]
        else:
            # The follower wrote something else (interleaved or cut): append by lines.
            have = copied.count("\n")
            rest = "".join(full.splitlines(keepends=True)[have:])
        if rest:
            with contextlib.suppress(OSError), open(self.log_path, "a", encoding="utf-8") as fh:
                fh.write(rest)
        return complete

    def _dump(self, timeout: float) -> tuple[str, bool]:
        if callable(self.dump):
            return self.dump(timeout)
        done = run_tool(self.dump, timeout=timeout, check=False, merge_stderr=True)
        return done.stdout, done.returncode == 0

    def _copied_text(self) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        marker = log_marker(self.tag).encode()
        at = data.rfind(marker)
        if at < 0:
            return ""
        end = data.find(b"\n", at)
        return "" if end < 0 else data[end + 1 :].decode(errors="replace")
