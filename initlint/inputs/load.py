"""Stage 1, load: resolve a target to model instances and build probe inputs."""
from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from ..capture import nested
from ..errors import LoadError, NoModelsError, NoProbeInputError
from ..probe import draw
from .hf import first_consumer, transformers_inputs
from .usercode import TimedOut, time_limit, user_code, user_frame

DEFAULT_BATCH = 16
DEFAULT_SPATIAL = 32


@dataclass
class Candidate:
    """A model to audit: a display name and a way to build it."""

    name: str
    build: Any
    """A zero-argument callable returning an ``nn.Module``, or the module itself."""
    origin: str = ""
    implicit: bool = False
    """Found by scanning a file (not named by the user): skipped, not an error, when it needs arguments."""

    def required_args(self) -> List[str]:
        """Constructor arguments without defaults (empty for instances and no-argument factories)."""
        obj = self.build
        if isinstance(obj, nn.Module):
            return []
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError):
            return []
        return [p.name for p in sig.parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]

    def instantiate(self) -> nn.Module:
        """The module, built if needed; raises :class:`LoadError` with a clear reason."""
        obj = self.build
        if isinstance(obj, nn.Module):
            return obj
        required = self.required_args()
        if required:
            raise LoadError(f"{self.name} needs constructor arguments ({', '.join(required)}); "
                            f"expose a factory function with no arguments and pass FILE.py:FACTORY")

        try:
            with user_code(f"constructing {self.name}"):
                model = obj()
        except LoadError:
            raise
        except Exception as exc:
            raise LoadError(f"constructing {self.name} raised {type(exc).__name__}: {exc}{user_frame(exc)}") from None
        if not isinstance(model, nn.Module):
            raise LoadError(f"{self.name} returned {type(model).__name__}, not an nn.Module")
        return model


def resolve(target: str, timeout: Optional[float] = None) -> List[Candidate]:
    """``file.py``, ``file.py:NAME`` or ``package.module:NAME`` -> candidates.

    ``timeout``: seconds the import may run (None or 0: no limit).
    """
    path, _, name = target.partition(":") if not os.path.exists(target) else (target, "", "")
    if path.endswith(".py") or os.path.sep in path or os.path.exists(path):
        module = import_file(path, timeout)
    else:
        module = _import_module(path, timeout)
    if name:
        if not hasattr(module, name):
            raise LoadError(f"{path} defines no '{name}'")
        return [Candidate(name, getattr(module, name), target)]
    found = [Candidate(n, obj, f"{path}:{n}", implicit=True) for n, obj in vars(module).items()
             if isinstance(obj, type) and issubclass(obj, nn.Module) and obj.__module__ == module.__name__
             and not n.startswith("_")]  # a private class is a helper, not a model to audit
    if not found:
        raise NoModelsError(f"{path} defines no nn.Module subclass; name a factory with {path}:NAME")
    return found


def unbuildable_error(path: str, candidates: List["Candidate"]) -> LoadError:
    """The error for a file none of whose models can be built without arguments."""
    if len(candidates) == 1:
        only = candidates[0]
        return LoadError(f"{only.name} needs constructor arguments ({', '.join(only.required_args())}); "
                         f"expose a factory function with no arguments and pass {path}:FACTORY")
    names = ", ".join(f"{c.name}({', '.join(c.required_args())})" for c in candidates)
    return LoadError(f"no nn.Module subclass in {path} can be built without arguments ({names}); "
                     f"expose a factory function with no arguments and pass {path}:FACTORY")


def _import_module(name: str, timeout: Optional[float]) -> Any:

    try:
        with user_code(f"importing {name}"), time_limit(timeout):
            return importlib.import_module(name)
    except TimedOut:
        raise _timed_out(name, timeout) from None
    except ImportError as exc:
        raise LoadError(f"cannot import module '{name}': {exc}") from None
    except SyntaxError as exc:
        raise LoadError(f"syntax error in {exc.filename}:{exc.lineno}: {exc.msg}") from None
    except LoadError:
        raise
    except Exception as exc:
        raise LoadError(f"importing {name} raised {type(exc).__name__}: {exc}{user_frame(exc)}") from None


def _timed_out(what: str, timeout: Optional[float]) -> LoadError:
    return LoadError(f"importing {what} did not finish within {timeout:g} s (an endless loop or a long computation "
                     f"at import time?); raise the limit with --import-timeout or import-timeout in "
                     f"[tool.initlint] (0: no limit)")


def import_file(path: str, timeout: Optional[float] = None) -> Any:
    """Import a user's Python file as a fresh module, with clear errors.

    ``sys.exit()`` at import and an import running past ``timeout`` seconds are load errors too.
    """

    if not os.path.exists(path):
        raise LoadError(f"{path}: no such file")
    if os.path.isdir(path):
        raise LoadError(f"{path} is a directory; name a Python file")
    if not path.endswith(".py"):
        raise LoadError(f"{path} is not a Python file (.py)")
    try:
        with open(path, "rb") as fh:
            ast.parse(fh.read(), filename=path)
    except SyntaxError as exc:
        raise LoadError(f"syntax error in {path}:{exc.lineno}: {exc.msg}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise LoadError(f"{path} is not readable Python source: {exc}") from None
    except OSError as exc:
        raise LoadError(f"cannot read {path}: {exc.strerror}") from None
    abspath = os.path.abspath(path)
    # a stable name (not hash(), which changes per process): the same file is the same module in every run
    mod_name = "_initlint_target_" + hashlib.sha1(abspath.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    spec = importlib.util.spec_from_file_location(mod_name, abspath)
    if spec is None or spec.loader is None:
        raise LoadError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    directory = os.path.dirname(abspath)
    added = directory not in sys.path
    if added:
        sys.path.insert(0, directory)
    loaded = False
    try:
        with user_code(f"importing {path}"), time_limit(timeout):
            spec.loader.exec_module(module)
        loaded = True
    except TimedOut:
        raise _timed_out(path, timeout) from None
    except LoadError:
        raise
    except Exception as exc:
        raise LoadError(f"importing {path} raised {type(exc).__name__}: {exc}{_frame_in(exc, abspath)}") from None
    finally:
        if not loaded:
            sys.modules.pop(mod_name, None)
        if added:
            sys.path.remove(directory)
    return module


def _frame_in(exc: BaseException, abspath: str) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) == abspath]
    return f" (line {frames[-1].lineno})" if frames else ""


# ----------------------------------------------------------------------------- inputs
def parse_shape(text: str) -> Tuple[int, ...]:
    """``8,3,32,32``, ``8x3x32x32`` or ``(8,3,32,32)`` -> ``(8, 3, 32, 32)``: see :func:`initlint.inputs.config.parse_shape`
    (raises :class:`UsageError`, a :class:`LoadError`)."""
    from .config import parse_shape as parse

    return parse(text)


def normalise_inputs(example: Any) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """A tensor, a tuple/list of positional inputs or a mapping of keyword inputs -> (args, kwargs).

    Only a plain tuple or list is a list of inputs: a named tuple (``PackedSequence``) is one input."""
    if example is None:
        return (), {}
    if isinstance(example, Mapping):
        return (), dict(example)
    if type(example) in (tuple, list):
        return tuple(example), {}
    return (example,), {}


def move_inputs(obj: Any, device: torch.device) -> Any:
    """Copy every tensor of a nested input structure to ``device``, keeping container types
    (a ``PackedSequence`` moves whole, its ``batch_sizes`` staying on the CPU)."""
    return nested.map_tensors(lambda t: t.to(device), obj)


def check_finite(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
    """Refuse user inputs holding NaN/Inf: the probe would measure them, not the model."""
    stored = [v for t in nested.tensors((args, kwargs)) if (v := _stored_values(t)) is not None]
    if stored and not bool(torch.stack([torch.isfinite(v).all() for v in stored]).all()):
        raise LoadError("the example inputs contain NaN or Inf; give finite inputs")


def _stored_values(t: torch.Tensor) -> Optional[torch.Tensor]:
    """The values a floating-point or complex tensor holds, whatever its layout (None if there are none)."""
    if t.device.type == "meta" or t.is_quantized or not (t.is_floating_point() or t.is_complex()):
        return None
    if t.is_nested:
        parts = [p.reshape(-1) for p in t.unbind()]
        return torch.cat(parts) if parts else None
    if t.layout == torch.sparse_coo:
        return t._values()
    if t.layout != torch.strided:
        return t.values()  # compressed sparse layouts
    return t


def shaped_inputs(shapes: Sequence[Tuple[int, ...]], model: nn.Module, seed: int,
                  device: Optional[torch.device] = None) -> Tuple[Any, ...]:
    """Random probe tensors of the given shapes (token ids if the model starts with an embedding), drawn
    on ``device`` (the host when None) from its generator."""
    gen = _generator(seed, device)
    first = first_consumer(model)
    out = []
    for shape in shapes:
        if isinstance(first, nn.Embedding) and len(out) == 0:
            out.append(torch.randint(0, first.num_embeddings, shape, generator=gen, device=gen.device))
        else:
            out.append(torch.randn(shape, generator=gen, device=gen.device, dtype=_float_dtype(model)))
    return tuple(out)


def _generator(seed: int, device: Optional[torch.device]) -> torch.Generator:
    """The inputs' generator: on ``device`` where it has one (the same stream as before on the host)."""
    gen = draw.generator(device, seed) if device is not None else None
    return gen if gen is not None else torch.Generator().manual_seed(seed)


def infer_inputs(model: nn.Module, batch: int, seed: int,
                 device: Optional[torch.device] = None) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """Build a probe batch from the first layer that consumes the input, drawn on ``device`` (the host when
    None) from its generator, or raise LoadError."""
    gen = _generator(seed, device)
    dtype = _float_dtype(model)
    hf = transformers_inputs(model, batch, gen, dtype)
    if hf is not None:
        return (), hf
    first = first_consumer(model)
    name = type(model).__name__
    if first is None:
        raise NoProbeInputError(f"cannot infer a probe input for {name}: it has no Linear, Conv or Embedding layer to read "
                        f"the input shape from; pass --input-shape (e.g. 16,3,32,32) or example_inputs")
    if isinstance(first, nn.Linear):
        return (torch.randn(batch, first.in_features, generator=gen, device=gen.device, dtype=dtype),), {}
    if isinstance(first, nn.modules.conv._ConvNd):
        dims = len(first.kernel_size)
        shape = (batch, first.in_channels, *([DEFAULT_SPATIAL] * dims))
        return (torch.randn(*shape, generator=gen, device=gen.device, dtype=dtype),), {}
    if isinstance(first, nn.Embedding):
        return (torch.randint(0, first.num_embeddings, (batch, DEFAULT_SPATIAL), generator=gen,
                              device=gen.device),), {}
    if isinstance(first, nn.RNNBase):
        shape = (batch, 8, first.input_size) if first.batch_first else (8, batch, first.input_size)
        return (torch.randn(*shape, generator=gen, device=gen.device, dtype=dtype),), {}
    if isinstance(first, (nn.MultiheadAttention,)):
        shape = (batch, 8, first.embed_dim) if first.batch_first else (8, batch, first.embed_dim)
        x = torch.randn(*shape, generator=gen, device=gen.device, dtype=dtype)
        return (x, x, x), {}
    if isinstance(first, nn.TransformerEncoderLayer):
        width = first.linear1.in_features
        shape = (batch, 8, width) if first.self_attn.batch_first else (8, batch, width)
        return (torch.randn(*shape, generator=gen, device=gen.device, dtype=dtype),), {}
    raise NoProbeInputError(f"cannot infer a probe input for {name} (first layer {type(first).__name__}); "
                    f"pass --input-shape or example_inputs")



def _float_dtype(model: nn.Module) -> torch.dtype:
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.get_default_dtype()
