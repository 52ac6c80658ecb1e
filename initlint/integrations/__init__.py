"""Training-loop integrations: audit the model on its first real training batch.

* :class:`initlint.integrations.lightning.InitlintCallback`, a Lightning ``Callback``;
* :class:`initlint.integrations.huggingface.InitlintTrainerCallback`, a ``transformers.TrainerCallback``.

Each audits the model once, before the first optimizer step and without changing it, logs
the findings through the framework's logger, and stops the run with
:class:`InitlintFailure` when a finding at or above ``fail_on`` is present (``fail_on=None``
only warns). The frameworks are imported only by their own module.
"""
from ._core import InitlintFailure

__all__ = ["InitlintFailure"]
