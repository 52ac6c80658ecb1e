"""Errors and exit codes shared by every stage: the one module both the API and the CLI import.

Every error here carries one sentence for the user; the CLI prints it after ``initlint: error:``
and exits with :data:`EXIT_ERROR`.
"""
from __future__ import annotations

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
"""``initlint check``: no finding at or above ``--fail-on``; some; a usage or load error."""
EXIT_INTERRUPTED = 130
"""Stopped by Ctrl-C (128 + SIGINT, as shells report it)."""


class LoadError(Exception):
    """A target cannot be loaded or probed; the message is one sentence for the user."""


class NoModelsError(LoadError):
    """An imported file defines no public ``nn.Module`` subclass."""


class NoProbeInputError(LoadError):
    """No probe input can be inferred for the model (and none was given)."""


class UsageError(LoadError):
    """Bad arguments to :func:`initlint.audit` or the CLI (unknown device, rule code, option)."""


class UnsupportedTorch(ImportError):
    """The installed torch is older than initlint supports (:data:`initlint.compat.MIN_TORCH`)."""


class ConfigError(ValueError):
    """The configuration file cannot be used."""


class UnknownCode(ValueError):
    """A ``--select``/``--ignore``/``explain`` code matches no rule."""


def echo_error(message: str) -> None:
    """``initlint: error: MESSAGE`` on stderr, always one line (a user's value or exception may hold newlines)."""
    import click

    click.echo("initlint: error: " + " ".join(part.strip() for part in str(message).splitlines() if part.strip()),
               err=True)
