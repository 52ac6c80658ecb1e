"""A Hugging Face ``TrainerCallback`` that audits the model on the first training batch.

::

    from transformers import Trainer
    from initlint.integrations.huggingface import InitlintTrainerCallback

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[InitlintTrainerCallback()])
    trainer.train()

``Trainer`` gives callbacks no batch, so at ``on_train_begin`` the callback puts a forward
pre-hook on the model: the first forward call in training mode (the first real training
batch, before any optimizer step) is audited with exactly the inputs the ``Trainer`` passes,
less the label keys (``labels`` and the model's other label names, ``num_items_in_batch``),
then the hook removes itself and the forward goes on. The findings are logged through
``transformers``' logging; a finding at or above ``fail_on`` stops the run with
:class:`~initlint.integrations.InitlintFailure` (``fail_on=None`` only logs). A model that
cannot be audited is logged as a warning and training goes on; a resumed run is not audited, nor is a model
loaded from a checkpoint (``from_pretrained``: a fine-tuning run starts from trained weights, not an init).
With ``bf16=True`` or ``fp16=True`` in the ``TrainingArguments`` the audit gets ``precision=`` for it
(``fp16`` with ``grad_scaler=True``) unless the settings give one: the probe measures the model's own forward
(not the autocast wrapper Accelerate puts around it), then runs once more under autocast. The ``Trainer``'s
optimizer gets its first step audited (``optimizer=``) with every param group at the highest rate its scheduler
reaches within ``max_steps`` (a warm-up starts at 0) and the gradients clipped to ``max_grad_norm``, unless the
settings give an ``optimizer`` (``None``: no first step). Whichever optimizer is audited, its first step gets
``batches_per_step`` of ``gradient_accumulation_steps`` x the data-parallel ranks unless the settings give a number
for it: the batch audited is one of those the run's step averages. The hook runs outside ``torch.compile``
(``torch_compile=True`` compiles the frame that calls it).
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional, Tuple

from transformers import TrainerCallback
from transformers.utils import logging as hf_logging

from ._core import BatchAuditor, InitlintFailure, RunOptimizer, without_labels

__all__ = ["InitlintTrainerCallback", "InitlintFailure"]

log = hf_logging.get_logger("transformers.integrations.initlint")


class InitlintTrainerCallback(TrainerCallback):
    """Audit the model once, on the first training batch; stop on findings at or above ``fail_on``.

    ``inputs(args, kwargs)`` picks what to audit from the forward call's positional and
    keyword arguments (default: the keyword arguments less the labels, or the positional
    ones); other keywords are :func:`initlint.audit` settings (``select``, ``ignore``, ...).
    """

    def __init__(self, fail_on: Optional[str] = "warning", *,
                 inputs: Optional[Callable[[Tuple[Any, ...], Dict[str, Any]], Any]] = None, **settings: Any) -> None:
        self.auditor = BatchAuditor("InitlintTrainerCallback", fail_on, None, settings)
        self.inputs = inputs
        self._handle: Any = None
        self._labels: Tuple[str, ...] = ()
        self._precision: Optional[Tuple[str, bool]] = None
        self._optimizer: Any = None
        self._batches: Tuple[Any, ...] = ()
        self._lock = threading.Lock()

    @property
    def report(self) -> Any:
        """The :class:`~initlint.Report` of the audit, once it ran."""
        return self.auditor.report

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       lr_scheduler: Any = None, **kwargs: Any) -> None:
        if self.auditor.done or model is None:
            return
        if state.global_step > 0:  # resumed from a checkpoint: the model is no longer at its initialisation
            self.auditor.done = True
            return
        from transformers.utils import find_labels

        self._labels = tuple(args.label_names or find_labels(type(model)))
        self._precision = ("bf16", False) if getattr(args, "bf16", False) else \
            ("fp16", True) if getattr(args, "fp16", False) else None
        self._optimizer = (optimizer, lr_scheduler, state.max_steps, getattr(args, "max_grad_norm", None))
        self._batches = (getattr(args, "gradient_accumulation_steps", 1), data_parallel_size(args))
        # outside torch.compile: a compiled model (TrainingArguments(torch_compile=True)) runs its hooks in the frame
        # dynamo traces, and it would trace the audit too (a minute of recompilations for a two-layer GPT-2)
        import torch

        self._handle = model.register_forward_pre_hook(torch.compiler.disable(self._first_forward), with_kwargs=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._remove()

    def _remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _first_forward(self, module: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        import torch

        if not module.training or not torch.is_grad_enabled():
            return  # an evaluation or generation call, not a training batch
        with self._lock:
            if self.auditor.done:
                return
            self._remove()
            # Accelerate's mixed precision wraps the model's forward in autocast (and keeps the original as
            # `_original_forward`): the audit runs the forward itself, and the run's precision as precision=
            own = vars(module)
            wrapped = own.get("forward") if "_original_forward" in own and "forward" in own else None
            try:
                if wrapped is not None:
                    own["forward"] = own["_original_forward"]
                self.auditor.audit(module, self._example(args, kwargs), log, precision=self._precision,
                                   optimizer=self._run_optimizer, batches=self._batches)
            finally:
                if wrapped is not None:
                    own["forward"] = wrapped

    def _run_optimizer(self) -> RunOptimizer:
        optimizer, scheduler, steps, clip = self._optimizer or (None, None, None, None)
        return RunOptimizer(optimizer, [scheduler] if scheduler is not None else [], steps, clip_norm=clip)

    def _example(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """The keyword inputs less the labels (how ``Trainer`` calls models), else the positional ones."""
        if self.inputs is not None:
            return self.inputs(args, kwargs)
        if kwargs and not args:
            return without_labels(kwargs, self._labels)
        return args[0] if len(args) == 1 else args


def data_parallel_size(args: Any) -> Any:
    """The ranks that each step on a batch of their own: the processes over the tensor, context and sequence
    parallel sizes of the ``TrainingArguments``' parallelism config, as ``Trainer.get_total_train_batch_size``
    counts them (None where the arguments do not tell)."""
    try:
        ranks = int(args.world_size)
        config = getattr(args, "parallelism_config", None)
        for name in ("tp_size", "cp_size", "sp_size"):
            size = getattr(config, name, 1) if config is not None else 1
            ranks //= int(size) if isinstance(size, int) and size >= 1 else 1
        return ranks
    except Exception:  # noqa: BLE001 - arguments of a kind not foreseen: the first step is judged as one batch's
        return None
