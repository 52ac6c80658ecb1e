"""Everything of a model and of the process that an audit must leave as it found it, as comparable values."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn as nn

try:
    import numpy  # noqa: F401 - not a dependency of initlint: the dev extra brings it
    _NUMPY = True
except ImportError:
    _NUMPY = False


def bits(t: Optional[torch.Tensor]) -> Any:
    """A tensor's exact bytes, dtype, device, layout and shape (NaN-safe, unlike ``torch.equal``)."""
    if t is None:
        return None
    if t.device.type == "meta":
        return (t.dtype, t.device, t.layout)
    if t.is_nested:
        return (t.dtype, t.layout, [bits(part) for part in t.detach().unbind()])
    if t.layout != torch.strided:  # sparse: compare the dense values
        return (t.dtype, t.layout, tuple(t.shape), bits(t.detach().to_dense()))
    # a copy: numpy() on the tensor's own storage would make it non-resizable (QAT observers resize theirs)
    flat = (t.detach().int_repr() if t.is_quantized else t.detach()).reshape(-1).cpu().clone()
    if flat.is_complex():
        flat = torch.view_as_real(flat)
    raw = flat.view(torch.uint8)
    data = bytes(raw.numpy()) if _NUMPY else bytes(raw.reshape(-1).tolist())  # the same bytes, slower without NumPy
    return (t.dtype, t.device, tuple(t.shape), tuple(t.stride()), data)


def version(t: torch.Tensor) -> Optional[int]:
    try:
        return t._version
    except RuntimeError:  # inference tensors
        return None


def tensor_state(t: torch.Tensor) -> Tuple[Any, ...]:
    """Object, bits, version counter, autograd flags and ``.grad`` of one tensor."""
    grad = t.grad if t.is_leaf else None
    return (id(t), type(t).__name__, bits(t), version(t), t.requires_grad, t.is_leaf,
            None if grad is None else (id(grad), bits(grad), version(grad)))


def value_state(value: Any, depth: int = 0) -> Any:
    """A value by identity; a tensor by :func:`tensor_state`; containers by identity and content."""
    if isinstance(value, torch.Tensor):
        return ("tensor",) + tensor_state(value)
    if depth < 2 and isinstance(value, dict):
        return ("dict", id(value), [(repr(k), value_state(v, depth + 1)) for k, v in value.items()])
    if depth < 2 and isinstance(value, (list, tuple)):
        return (type(value).__name__, id(value), [value_state(v, depth + 1) for v in value])
    if depth < 2 and isinstance(value, set):
        return ("set", id(value), sorted(id(v) for v in value))
    return ("object", id(value), type(value).__name__)


def process_state() -> Dict[str, Any]:
    """Process-wide state a forward can change."""
    import random

    from torch.nn.utils import parametrize

    try:
        import numpy
        np_state = numpy.random.get_state()
        numpy_rng: Any = (np_state[0], np_state[1].tobytes()) + tuple(np_state[2:])
    except ImportError:  # not a dependency: without NumPy there is no NumPy generator to change
        numpy_rng = None
    return {
        "torch_rng": bits(torch.get_rng_state()),
        "python_rng": random.getstate(),
        "numpy_rng": numpy_rng,
        "grad_mode": torch.is_grad_enabled(),
        "inference_mode": torch.is_inference_mode_enabled(),
        "default_dtype": torch.get_default_dtype(),
        "default_device": torch.get_default_device(),
        "deterministic": (torch.are_deterministic_algorithms_enabled(),
                          torch.is_deterministic_algorithms_warn_only_enabled()),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "anomaly": torch.is_anomaly_enabled(),
        "threads": torch.get_num_threads(),
        "parametrize_cache": (parametrize._cache_enabled, dict(parametrize._cache)),
    }


def deep_state(model: nn.Module, inputs: Any = None) -> Dict[str, Any]:
    """Every attribute of every module (the class, ``training``, the parameter, buffer, module
    and hook dicts, plain values and containers), every tensor in full, the inputs, the process."""
    return {
        "modules": [(path, id(m), type(m).__name__, [(k, value_state(v)) for k, v in vars(m).items()])
                    for path, m in model.named_modules()],
        "inputs": value_state(inputs),
        **process_state(),
    }
