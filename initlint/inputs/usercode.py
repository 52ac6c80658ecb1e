"""How ``initlint check`` runs a user's file: the safeguards around importing, building and auditing it.

- Each target is imported with its own folder first on ``sys.path``, and the modules it
  imported from that folder are dropped from ``sys.modules`` once it is audited, so the next
  target's same-named ``helpers.py`` is its own.
- The user's stdout goes to stderr, so a ``print`` in a model file never mixes with the report.
- ``sys.exit()`` and ``os._exit()`` in the user's code become one sentence saying so.
- An import that runs longer than a limit is stopped.
- The RNGs are seeded before each import and each build, so a run gives the same numbers every time.
"""
from __future__ import annotations

import contextlib
import io
import os
import random
import signal
import sys
import threading
import time
import traceback
from typing import Any, Iterator, Optional, Set

from ..errors import LoadError
from ..capture.locate import shown_path


class TimedOut(BaseException):
    """Raised into the main thread when an import passes its time limit.

    A ``BaseException``, like ``KeyboardInterrupt``, so ``except Exception`` in the user's
    code does not swallow it.
    """


class _OsExit(BaseException):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global RNG (when installed) and torch on every device."""
    import torch

    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2 ** 32)  # NumPy takes 32-bit seeds only
    torch.manual_seed(seed)


@contextlib.contextmanager
def user_code(what: str) -> Iterator[None]:
    """Run a user's code; its ``sys.exit(N)`` or ``os._exit(N)`` becomes a :class:`LoadError` naming ``what``."""
    real_exit, pid = os._exit, os.getpid()

    def reported_exit(code: int) -> None:
        if os.getpid() != pid:  # a forked child must still end the way it asked
            real_exit(code)
        raise _OsExit(code)

    os._exit = reported_exit
    try:
        yield
    except SystemExit as exc:
        code = "" if exc.code is None else repr(exc.code)
        raise LoadError(f"{what} called sys.exit({code}){user_frame(exc)}") from None
    except _OsExit as exc:
        raise LoadError(f"{what} called os._exit({exc.code}){user_frame(exc)}") from None
    finally:
        os._exit = real_exit


@contextlib.contextmanager
def time_limit(seconds: Optional[float]) -> Iterator[None]:
    """Raise :class:`TimedOut` in the body after ``seconds`` (None or 0: no limit).

    SIGALRM on POSIX, re-armed every second in case the user's code catches the first one;
    elsewhere a timer thread interrupts the main thread. Off the main thread no limit applies:
    only the main thread can be interrupted.
    """
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return
    if hasattr(signal, "setitimer"):
        with _alarm(seconds):
            yield
        return
    with _interrupting_timer(seconds):
        yield


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    def on_alarm(signum: int, frame: object) -> None:
        raise TimedOut()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _interrupting_timer(seconds: float) -> Iterator[None]:
    """A timer thread that interrupts the main thread, whatever SIGINT's disposition.

    ``_thread.interrupt_main`` only runs a Python-level SIGINT handler, and a process started
    in the background by a non-interactive shell inherits SIGINT ignored. So the body runs
    under a SIGINT handler of ours: it raises :class:`TimedOut` once the timer has fired, and
    otherwise does what the previous disposition did (ignored stays ignored, the default
    raises ``KeyboardInterrupt``). The previous handler is restored in ``finally``.
    """
    import _thread

    fired = threading.Event()
    previous = signal.getsignal(signal.SIGINT)

    def on_interrupt(signum: int, frame: object) -> None:
        if fired.is_set():
            raise TimedOut()
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt()

    def fire() -> None:
        fired.set()
        _thread.interrupt_main()

    signal.signal(signal.SIGINT, on_interrupt)
    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    except TimedOut:
        raise
    else:
        # the body ended: a timer that fired just now left an interrupt pending; let it arrive here,
        # while our handler is still installed, rather than after the previous one is back
        timer.cancel()
        timer.join()
        if fired.is_set():
            try:
                time.sleep(0.01)  # the pending interrupt runs at the next check of the main loop
            except TimedOut:
                pass
    finally:
        timer.cancel()
        # a handler installed from C reads as None: there is nothing of Python's to put back
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout, by Python or by C code, to stderr while the body runs."""
    saved_fd = _redirect_fd()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        for stream in (sys.stdout, sys.__stdout__, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()  # what the user wrote goes out before stdout is restored
        if saved_fd is not None:
            os.dup2(saved_fd, 1)
            os.close(saved_fd)


def _redirect_fd() -> Optional[int]:
    """Point file descriptor 1 at 2 when ``sys.stdout`` really is fd 1; return the saved fd."""
    try:
        if sys.stdout.fileno() != 1 or sys.stderr.fileno() != 2:
            return None
        sys.stdout.flush()
        saved = os.dup(1)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None  # a captured stream (tests, notebooks): the Python-level redirect is enough
    os.dup2(2, 1)
    return saved


@contextlib.contextmanager
def own_folder(path: Optional[str]) -> Iterator[None]:
    """Import with ``path``'s folder first on ``sys.path``; then forget the modules imported from it.

    Only modules found through that folder, or through folders the target added to
    ``sys.path`` (``helpers`` for ``folder/helpers.py``, ``utils.x`` for ``folder/utils/``),
    that were not loaded before are removed, so the next target's folder supplies its own;
    ``sys.path`` is restored. The target's own module stays registered under its own name.
    """
    if not path or not os.path.isfile(path):
        yield
        return
    folder = os.path.dirname(os.path.abspath(path))
    before: Set[str] = set(sys.modules)
    saved_path = list(sys.path)
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        # folders the target put on sys.path itself (sys.path.append("../common")) count as its own too
        folders = [folder] + [os.path.abspath(p) for p in sys.path if p not in saved_path and isinstance(p, str)]
        sys.path[:] = saved_path
        for name in [n for n in sys.modules if n not in before and any(_found_in(n, f) for f in folders)]:
            del sys.modules[name]


def _found_in(name: str, folder: str) -> bool:
    """True for a module imported through ``folder`` on ``sys.path``."""
    top = name.split(".")[0]
    if not (os.path.isfile(os.path.join(folder, top + ".py")) or os.path.isdir(os.path.join(folder, top))):
        return False
    module = sys.modules.get(name)
    if module is None:  # a failed import's placeholder under a name from this folder
        return True
    file = getattr(module, "__file__", None)
    locations = getattr(getattr(module, "__spec__", None), "submodule_search_locations", None)
    paths = [file] if file else list(locations or [])
    return any(os.path.abspath(p).startswith(folder + os.sep) for p in paths)


OPTIMIZER_HOOK = "initlint_optimizer"
"""A target file may define ``initlint_optimizer(model)`` returning the optimizer the model trains with."""


def target_hook(origin: str, name: str = OPTIMIZER_HOOK) -> Optional[Any]:
    """The function ``name`` of the module a candidate came from (``file.py:Model`` or ``package.module:Model``),
    when that module defines one; the module is the one the loader imported for it."""
    import hashlib

    from .config import target_file

    path = target_file(origin)
    if path.endswith(".py") or os.path.exists(path):
        abspath = os.path.abspath(path)
        module = sys.modules.get("_initlint_target_" + hashlib.sha1(abspath.encode("utf-8", "surrogatepass"))
                                 .hexdigest()[:16])
    else:
        module = sys.modules.get(path)
    hook = getattr(module, name, None) if module is not None else None
    return hook if callable(hook) else None


def user_frame(exc: BaseException) -> str:
    """`` (at FILE:LINE)`` of the innermost frame outside initlint and torch, or ``""``."""
    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the initlint package
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not os.path.abspath(f.filename).startswith(own)
              and os.sep + "torch" + os.sep not in f.filename and not f.filename.startswith("<frozen")]
    return f" (at {shown_path(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
