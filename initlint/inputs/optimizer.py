"""``--optimizer "AdamW(lr=3e-4, weight_decay=0.1)"``: an optimizer named on the command line.

The text is parsed with :mod:`ast` and its arguments read with :func:`ast.literal_eval`, so a spec
never runs code. Parsing needs no torch (a refused spec answers before torch is imported); the class
is looked up when the optimizer is built. Two forms:

- ``Name(kw=literal, ...)``: a class of ``torch.optim`` (``SGD(lr=0.1, momentum=0.9)``; ``Adam`` alone
  takes the class's defaults);
- ``package.module:Name(...)``: any importable optimizer class (``bitsandbytes.optim:AdamW8bit(lr=1e-3)``).
"""
from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Tuple

from ..errors import UsageError

_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_FORMS = "write it as Name(lr=1e-3, ...) for a torch.optim class, or package.module:Name(...)"


@dataclass(frozen=True)
class OptimizerSpec:
    """A parsed spec: the class's module and name, and its literal arguments."""

    module: str
    name: str
    args: Tuple[Any, ...] = ()
    kwargs: Dict[str, Any] = field(default_factory=dict)
    text: str = ""

    def optimizer_class(self) -> type:
        """The class the spec names; :class:`UsageError` when it is missing or not an optimizer."""
        import torch

        try:
            module = importlib.import_module(self.module)
        except Exception as exc:  # the user's package may fail in any way while importing
            raise UsageError(f"--optimizer '{self.text}': cannot import {self.module} "
                             f"({type(exc).__name__}: {exc})") from None
        cls = getattr(module, self.name, None)
        if cls is None:
            hint = " (torch.optim has " + ", ".join(sorted(_torch_optimizers())) + ")" \
                if self.module == "torch.optim" else ""
            raise UsageError(f"--optimizer '{self.text}': {self.module} has no optimizer named {self.name}{hint}")
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            raise UsageError(f"--optimizer '{self.text}': {self.module}.{self.name} is not a torch.optim.Optimizer "
                             f"subclass")
        return cls

    def build(self, params: Iterable[Any]) -> Any:
        """The optimizer over ``params`` (parameters or param-group dicts)."""
        cls = self.optimizer_class()
        try:
            return cls(params, *self.args, **self.kwargs)
        except Exception as exc:  # a bad keyword or value: the class's own words
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"--optimizer '{self.text}': {self.module}.{self.name} refused its arguments: "
                             f"{first}") from None

    def __call__(self, model: Any) -> Any:
        """The optimizer over every parameter of ``model`` (the form ``audit(optimizer=...)`` accepts)."""
        return self.build(model.parameters())

    def __str__(self) -> str:
        return self.text


def parse_optimizer(text: str) -> OptimizerSpec:
    """Parse ``text`` into an :class:`OptimizerSpec`; :class:`UsageError` (one sentence) when it is not one."""
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"--optimizer is empty; {_FORMS}")
    text = text.strip()
    module, sep, call = text.rpartition(":")
    if sep and not _MODULE.fullmatch(module.strip()):
        raise UsageError(f"--optimizer '{text}': '{module}' is not a module path; {_FORMS}")
    try:
        node = ast.parse(call.strip(), mode="eval").body
    except SyntaxError:
        raise UsageError(f"--optimizer '{text}' is not valid syntax; {_FORMS}") from None
    if isinstance(node, ast.Name):
        name, args, kwargs = node.id, (), {}
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        name = node.func.id
        args = tuple(_literal(text, a, f"argument {i + 1}") for i, a in enumerate(node.args))
        kwargs = {}
        for kw in node.keywords:
            if kw.arg is None:
                raise UsageError(f"--optimizer '{text}': ** arguments are not accepted; name each keyword")
            kwargs[kw.arg] = _literal(text, kw.value, kw.arg)
    else:
        raise UsageError(f"--optimizer '{text}' is not a class name with arguments; {_FORMS}")
    return OptimizerSpec(module=module.strip() if sep else "torch.optim", name=name, args=args, kwargs=kwargs,
                         text=text)


def _literal(text: str, node: ast.AST, what: str) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise UsageError(f"--optimizer '{text}': {what} must be a literal (a number, string, tuple, True/False/None), "
                         f"got '{ast.unparse(node)}'") from None


def _torch_optimizers() -> Iterable[str]:
    import torch

    return (n for n, v in vars(torch.optim).items()
            if isinstance(v, type) and issubclass(v, torch.optim.Optimizer) and v is not torch.optim.Optimizer)
