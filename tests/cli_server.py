"""Run ``python -m initlint ...`` for the tests without paying for ``import torch`` each time.

A fresh interpreter spends about 1.5 s importing torch before the command line does anything.
``run_initlint`` keeps one server process per test session that has imported torch and initlint
and nothing else, and forks it for each command: the child changes into the requested folder,
takes the requested environment and argument list, sends fds 0, 1 and 2 to /dev/null and two
files, runs the command line and ends with its exit code. Each command still runs in a process
of its own, which starts as a fresh ``python -m initlint`` would at the point where the command
line begins.

What a fork cannot reproduce falls back to a real ``python -m initlint``: an environment whose
``PYTHON*`` variables differ from the server's (they act when the interpreter starts), stdin
input, and ``fresh=True`` (tests of start-up itself, such as which modules get imported). No
POSIX ``fork`` (Windows): always a real process.
"""
from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Mapping, Optional

_SERVER: Dict[str, subprocess.Popen] = {}


def run_initlint(args: List[str], cwd: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
            timeout: float = 300, fresh: bool = False, input: Optional[str] = None) -> subprocess.CompletedProcess:
    """``subprocess.run([python, "-m", "initlint", *args], capture_output=True, text=True, ...)``, forked when it can be."""
    env = dict(os.environ if env is None else env)
    cwd = os.path.abspath(cwd or os.getcwd())
    command = [sys.executable, "-m", "initlint", *args]
    if fresh or input is not None or not hasattr(os, "fork") or _startup_differs(env):
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, input=input)
    with tempfile.TemporaryDirectory() as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        code = _ask({"args": list(args), "cwd": cwd, "env": env, "stdout": out, "stderr": err}, timeout)
        with open(out, encoding="utf-8", errors="replace") as fh_out, \
                open(err, encoding="utf-8", errors="replace") as fh_err:
            return subprocess.CompletedProcess(command, code, fh_out.read(), fh_err.read())


def _startup_differs(env: Mapping[str, str]) -> bool:
    keys = {k for k in (*env, *os.environ) if k.startswith("PYTHON")}
    return any(env.get(k) != os.environ.get(k) for k in keys)


def _server() -> subprocess.Popen:
    server = _SERVER.get("process")
    if server is None or server.poll() is not None:
        server = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, bufsize=1)
        _SERVER["process"] = server
        atexit.register(_stop, server)
    return server


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


def _ask(request: dict, timeout: float) -> int:
    server = _server()
    server.stdin.write(json.dumps(dict(request, timeout=timeout)) + "\n")
    server.stdin.flush()
    reply = server.stdout.readline()
    if not reply:
        raise RuntimeError("the CLI server ended without answering")
    answer = json.loads(reply)
    if answer.get("timed_out"):
        raise subprocess.TimeoutExpired(["initlint", *request["args"]], timeout)
    return answer["returncode"]


# ------------------------------------------------------------------ the server process
def _child(request: dict) -> None:
    """In the forked child: become ``python -m initlint ARGS`` run in ``cwd`` with ``env``; never returns."""
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                                (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            opened = os.open(path, flags)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdin = open(0, encoding="utf-8", closefd=False)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
        sys.argv = ["initlint", *request["args"]]
        sys.path[0] = os.getcwd()  # as `python -m` puts the working folder first
        from initlint.cli import main

        try:
            main(prog_name="initlint")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
    except BaseException:  # what an uncaught exception does to a real interpreter
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _serve() -> None:
    import signal
    import time

    import torch  # noqa: F401  the import each forked command no longer pays for
    import initlint.api  # noqa: F401
    import initlint.cli  # noqa: F401

    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)
        deadline = time.monotonic() + request["timeout"]
        timed_out = False
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                timed_out = True
                break
            time.sleep(0.005)
        reply = {"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
