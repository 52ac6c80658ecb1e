"""The op vocabulary: how calls and modules map to graph kinds, and what each kind means.

Both capture backends classify what they see through this module, so a ``F.relu``
call, a ``Tensor.relu_`` method and an ``nn.ReLU`` module all become kind ``relu``.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

# --------------------------------------------------------------------------- kinds
WEIGHT_KINDS = frozenset({"linear", "conv"})
"""Kinds whose weight scale IL001 judges (a weighted sum over a known fan-in)."""

NORM_KINDS = frozenset({"batch_norm", "instance_norm", "layer_norm", "group_norm", "rms_norm"})
CHANNEL_NORM_KINDS = frozenset({"batch_norm", "instance_norm"})
"""Norms that subtract a per-channel mean over every other axis (they cancel a per-channel bias)."""

PASS_KINDS = frozenset({"view", "dropout", "identity", "pool", "cat", "pad"})
"""Kinds that move or select values without changing their scale much."""

DYING_KINDS = frozenset({"relu", "relu6"})
"""Activations whose units can die (zero output and zero gradient for every input)."""


@dataclass(frozen=True)
class Activation:
    """What the rules need to know about an elementwise nonlinearity."""

    band: Callable[[Dict[str, Any]], Tuple[float, float]]
    """Acceptable gain range ``(lo, hi)``; the ideal weight std is ``gain / sqrt(fan_in)``."""
    bounds: Optional[Tuple[float, float]] = None
    """Output range of a bounded (saturating) activation."""
    init_name: str = "linear"
    """``nonlinearity`` argument of ``nn.init.kaiming_*`` / ``calculate_gain`` for the fix."""
    at_zero: float = 0.0
    """The output for an input of 0: a small input leaves sigmoid at 1/2 and softplus at ln 2, whatever
    its scale, so the scale of what such an activation outputs does not follow its input's scale down."""


def _fixed(lo: float, hi: Optional[float] = None) -> Callable[[Dict[str, Any]], Tuple[float, float]]:
    return lambda attrs: (lo, lo if hi is None else hi)


def _leaky(attrs: Dict[str, Any]) -> Tuple[float, float]:
    slope = float(attrs.get("negative_slope", 0.01))
    g = math.sqrt(2.0 / (1.0 + slope * slope))
    return (g, g)


def _numeric(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[Dict[str, Any]], Tuple[float, float]]:
    def band(attrs: Dict[str, Any]) -> Tuple[float, float]:
        g = numeric_gain(fn)
        return (g, g)

    return band


@lru_cache(maxsize=None)
def numeric_gain(fn: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """``1 / sqrt(E[phi(z)^2])`` for z ~ N(0, 1), by quadrature on [-10, 10].

    This is the gain that keeps the second moment of the activation's output equal
    to that of its input when the weights feeding it have std ``gain / sqrt(fan_in)``.
    For ReLU it gives sqrt(2), He's value; for GELU about 1.53 and for SiLU about 1.68.
    """
    z = torch.linspace(-10.0, 10.0, 20001, dtype=torch.float64)
    density = torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    second_moment = torch.trapezoid(fn(z) ** 2 * density, z).item()
    return 1.0 / math.sqrt(second_moment)


ACTIVATIONS: Dict[str, Activation] = {
    "relu": Activation(_fixed(math.sqrt(2.0)), init_name="relu"),
    "relu6": Activation(_fixed(math.sqrt(2.0)), init_name="relu"),
    "leaky_relu": Activation(_leaky, init_name="leaky_relu"),
    "prelu": Activation(_leaky, init_name="leaky_relu"),
    "rrelu": Activation(_leaky, init_name="leaky_relu"),
    # LeCun (gain 1) and PyTorch's 5/3 both keep deep tanh networks stable (seed 004).
    "tanh": Activation(_fixed(1.0, 5.0 / 3.0), bounds=(-1.0, 1.0), init_name="tanh"),
    "hardtanh": Activation(_fixed(1.0, 5.0 / 3.0), bounds=(-1.0, 1.0), init_name="tanh"),
    "softsign": Activation(_fixed(1.0, 5.0 / 3.0), bounds=(-1.0, 1.0), init_name="tanh"),
    # sigmoid: PyTorch's gain is 1; its slope at 0 is 1/4, so up to 4 is defensible.
    "sigmoid": Activation(_fixed(1.0, 4.0), bounds=(0.0, 1.0), init_name="sigmoid", at_zero=0.5),
    "hardsigmoid": Activation(_fixed(1.0, 4.0), bounds=(0.0, 1.0), init_name="sigmoid", at_zero=0.5),
    # SELU is self-normalising with LeCun normal (gain 1); PyTorch suggests 3/4.
    "selu": Activation(_fixed(0.75, 1.0), init_name="selu"),
    "gelu": Activation(_numeric(F.gelu)),
    "silu": Activation(_numeric(F.silu)),
    "mish": Activation(_numeric(F.mish)),
    "elu": Activation(_numeric(F.elu)),
    "celu": Activation(_numeric(F.celu)),
    "softplus": Activation(_numeric(F.softplus), at_zero=math.log(2.0)),
    "hardswish": Activation(_numeric(F.hardswish)),
    "identity": Activation(_fixed(1.0)),
}
IDENTITY = ACTIVATIONS["identity"]

# ----------------------------------------------------------------- call classification
_NAME_KINDS: Dict[str, str] = {}


def _names(kind: str, *names: str) -> None:
    for n in names:
        _NAME_KINDS[n] = kind


_names("linear", "linear", "addmm")
_names("matmul", "matmul", "mm", "bmm", "baddbmm", "einsum", "__matmul__", "__rmatmul__")
_names("conv", "conv1d", "conv2d", "conv3d", "_convolution", "convolution")
_names("conv_transpose", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
_names("embedding", "embedding", "embedding_bag")
for _act in ACTIVATIONS:
    _names(_act, _act)
_names("relu", "threshold")
_names("rrelu", "rrelu_with_noise")
_names("batch_norm", "batch_norm")
_names("instance_norm", "instance_norm")
_names("layer_norm", "layer_norm")
_names("group_norm", "group_norm")
_names("rms_norm", "rms_norm", "normalize")  # F.normalize: an L2 (or Lp) normalisation along an axis
_names("softmax", "softmax", "_softmax")
_names("log_softmax", "log_softmax", "_log_softmax")
_names("add", "add", "__add__", "__radd__", "__iadd__", "iadd", "sub", "__sub__", "__rsub__", "__isub__", "isub", "rsub")
_names("mul", "mul", "__mul__", "__rmul__", "__imul__", "imul")
_names("div", "div", "__truediv__", "__itruediv__", "truediv", "itruediv")
_names("dropout", "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
       "feature_dropout")
_names("view", "view", "reshape", "flatten", "permute", "transpose", "t", "contiguous", "unsqueeze", "squeeze",
       "expand", "expand_as", "getitem", "__getitem__", "chunk", "split", "unbind", "narrow", "select", "clone",
       "to", "float", "half", "double", "bfloat16", "type_as", "type", "view_as", "reshape_as", "movedim",
       "swapaxes", "unflatten", "repeat", "repeat_interleave", "tile", "detach", "cuda", "cpu", "contiguous", "T", "mT")
_names("cat", "cat", "concat", "concatenate", "stack", "hstack", "vstack")
_names("pad", "pad", "constant_pad_nd")
_names("pool", "max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "avg_pool3d",
       "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "adaptive_max_pool1d",
       "adaptive_max_pool2d", "adaptive_max_pool3d", "max_pool2d_with_indices", "lp_pool2d")
_names("attention", "scaled_dot_product_attention", "multi_head_attention_forward")
_names("rnn", "lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell")
_names("reduce", "mean", "sum", "amax", "max", "min", "norm", "std", "var", "logsumexp")
# uninitialised memory; ``Tensor.new(rows, cols)`` too (torch 2.4's ``nn.init.orthogonal_`` draws into one:
# its NaN-holding garbage was reported as the forward's first NaN when a model initialised in its forward)
_names("empty", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "new")

SOLVES = frozenset({"linalg_solve_triangular", "solve_triangular", "triangular_solve", "linalg_solve",
                    "cholesky_solve"})
"""Linear solves, ``A^-1 B``: like a matrix product, their output's scale is their inputs' scales combined
(a delta-rule linear attention solves a triangular system with its values on the right-hand side)."""


def is_product(op: Any) -> bool:
    """A matrix product of two signals, or a linear solve (:data:`SOLVES`): its output's scale is the
    product of its inputs' scales (a solve's, the right-hand side's over the matrix's)."""
    return len(op.inputs) >= 2 and not op.params and (
        op.kind == "matmul" or op.target.rsplit(".", 1)[-1] in SOLVES)


VIEW_SHAPE_ONLY = frozenset({"view", "reshape", "flatten", "unsqueeze", "squeeze", "contiguous", "clone", "to",
                             "float", "half", "double", "bfloat16", "type_as", "type", "view_as", "reshape_as",
                             "detach", "unflatten"})


def call_name(target: Any) -> str:
    """Bare name of a called function or method (``F.relu`` -> ``relu``)."""
    name = target if isinstance(target, str) else getattr(target, "__name__", None) or repr(target)
    return name


def kind_of_name(name: str) -> str:
    """Kind for a function or method name; in-place variants (``relu_``) share their kind."""
    if name in _NAME_KINDS:
        return _NAME_KINDS[name]
    if name.endswith("_") and not name.endswith("__") and name[:-1] in _NAME_KINDS:
        return _NAME_KINDS[name[:-1]]
    return "other"




def call_attrs(kind: str, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """Non-tensor facts of a call that rules use (slope, softmax dim, weight layout)."""
    attrs: Dict[str, Any] = {}
    if kind == "leaky_relu":
        slope = args[1] if len(args) > 1 and isinstance(args[1], (int, float)) else kwargs.get("negative_slope", 0.01)
        attrs["negative_slope"] = float(slope)
    elif kind in ("softmax", "log_softmax"):
        dim = args[1] if len(args) > 1 and isinstance(args[1], int) else kwargs.get("dim")
        attrs["dim"] = -1 if dim is None else int(dim)
    elif kind in ("view",) and name in ("transpose", "swapaxes"):
        dims = [a for a in args[1:] if isinstance(a, int)]
        if len(dims) == 2:
            attrs["transpose"] = tuple(dims)
    elif kind == "view" and name in ("permute",):
        dims = args[1:] if len(args) > 1 and isinstance(args[1], int) else (args[1] if len(args) > 1 else kwargs.get("dims"))
        if isinstance(dims, (list, tuple)):
            attrs["permute"] = tuple(int(d) for d in dims)
    elif kind == "view" and name in ("t", "T", "mT"):
        attrs["transpose"] = (-2, -1)
    if kind == "view" and name in VIEW_SHAPE_ONLY:
        attrs["shape_only"] = True
    eps = norm_eps(name, args, kwargs) if kind in NORM_KINDS else None
    if eps is not None:
        attrs["eps"] = eps
    attrs.update(scalar_attrs(kind, name, args, kwargs))
    return attrs


# ------------------------------------------------------------------ module classification
_MODULE_KINDS: Tuple[Tuple[type, str], ...] = (
    (nn.Linear, "linear"),
    (nn.Conv1d, "conv"), (nn.Conv2d, "conv"), (nn.Conv3d, "conv"),
    (nn.ConvTranspose1d, "conv_transpose"), (nn.ConvTranspose2d, "conv_transpose"),
    (nn.ConvTranspose3d, "conv_transpose"),
    (nn.Embedding, "embedding"), (nn.EmbeddingBag, "embedding"),
    (nn.ReLU, "relu"), (nn.ReLU6, "relu6"), (nn.LeakyReLU, "leaky_relu"), (nn.PReLU, "prelu"),
    (nn.RReLU, "rrelu"), (nn.ELU, "elu"), (nn.SELU, "selu"), (nn.CELU, "celu"), (nn.GELU, "gelu"),
    (nn.SiLU, "silu"), (nn.Mish, "mish"), (nn.Softplus, "softplus"), (nn.Tanh, "tanh"),
    (nn.Sigmoid, "sigmoid"), (nn.Hardtanh, "hardtanh"), (nn.Hardsigmoid, "hardsigmoid"),
    (nn.Hardswish, "hardswish"), (nn.Softsign, "softsign"),
    (nn.Softmax, "softmax"), (nn.LogSoftmax, "log_softmax"),
    (nn.modules.dropout._DropoutNd, "dropout"),
    (nn.modules.batchnorm._BatchNorm, "batch_norm"),
    (nn.modules.instancenorm._InstanceNorm, "instance_norm"),
    (nn.LayerNorm, "layer_norm"), (nn.GroupNorm, "group_norm"),
    (nn.Identity, "identity"), (nn.Flatten, "view"), (nn.Unflatten, "view"),
    (nn.modules.pooling._MaxPoolNd, "pool"), (nn.modules.pooling._AvgPoolNd, "pool"),
    (nn.modules.pooling._AdaptiveAvgPoolNd, "pool"), (nn.modules.pooling._AdaptiveMaxPoolNd, "pool"),
    (nn.RNNBase, "rnn"), (nn.MultiheadAttention, "attention"),
)
if hasattr(nn, "RMSNorm"):
    _MODULE_KINDS = _MODULE_KINDS + ((nn.RMSNorm, "rms_norm"),)

_NORM_CLASS = re.compile(r"(rms|layer|group|batch|instance)?_?norm(\d*d)?$", re.IGNORECASE)


_ACT_CLASS = (
    (re.compile(r"gelu", re.IGNORECASE), "gelu"),
    (re.compile(r"(silu|swish)$", re.IGNORECASE), "silu"),
    (re.compile(r"mish$", re.IGNORECASE), "mish"),
)


def module_kind(module: nn.Module) -> Optional[str]:
    """Kind of a module call, or None for containers and unknown modules."""
    for cls, kind in _MODULE_KINDS:
        if isinstance(module, cls):
            return kind
    return handwritten_kind(module)


def handwritten_kind(module: nn.Module) -> Optional[str]:
    """Recognise a hand-written normalisation or activation module by its class name.

    ``T5LayerNorm``/``LlamaRMSNorm`` compute a norm from several small ops, and GPT-2's
    ``NewGELUActivation`` a GELU from tanh and pow; the capture records such a module as one
    op of the kind it implements. Modules with weight matrices are never treated so.
    """
    cls = type(module)
    name = cls.__name__
    if cls.__module__.startswith("torch.nn") or any(p.dim() >= 2 for p in module.parameters(recurse=False)):
        return None
    if _NORM_CLASS.search(name) and not list(module.children()):
        lowered = name.lower()
        for word in ("batch", "group", "instance", "rms"):
            if word in lowered:
                return f"{word}_norm"
        return "layer_norm"
    if not any(True for _ in module.parameters()):
        for pattern, kind in _ACT_CLASS:
            if pattern.search(name):
                return kind
    return None


def module_attrs(kind: str, module: nn.Module) -> Dict[str, Any]:
    """Attributes of a module op (the module equivalent of :func:`call_attrs`)."""
    attrs: Dict[str, Any] = {}
    if kind == "leaky_relu":
        attrs["negative_slope"] = float(module.negative_slope)
    elif kind == "prelu":
        attrs["negative_slope"] = float(module.weight.detach().float().mean())
    elif kind == "rrelu":
        attrs["negative_slope"] = (module.lower + module.upper) / 2
    elif kind in ("softmax", "log_softmax"):
        attrs["dim"] = -1 if module.dim is None else int(module.dim)
    elif kind in NORM_KINDS:
        eps = getattr(module, "eps", None)
        eps = getattr(module, "variance_epsilon", None) if eps is None else eps
        if isinstance(eps, (int, float)) and not isinstance(eps, bool):
            attrs["eps"] = float(eps)
    if kind == "view":
        attrs["shape_only"] = True
    return attrs


_NORM_EPS = {"layer_norm": (4, 1e-5), "group_norm": (4, 1e-5), "batch_norm": (7, 1e-5), "instance_norm": (7, 1e-5),
             "rms_norm": (3, None)}
"""Functional norms: the position of ``eps`` and its default (``F.rms_norm``'s None is the dtype's epsilon)."""


def norm_eps(name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[float]:
    """The ``eps`` of a ``F.layer_norm``/``group_norm``/``batch_norm``/``instance_norm``/``rms_norm`` call."""
    if name not in _NORM_EPS:
        return None
    index, default = _NORM_EPS[name]
    eps = args[index] if len(args) > index else kwargs.get("eps", default)
    if eps is None:
        eps = torch.finfo(torch.float32).eps
    return float(eps) if isinstance(eps, (int, float)) and not isinstance(eps, bool) else None


def product_operands(name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Tuple[Any, Any]]:
    """``(x, w)`` of a call that multiplies ``x`` by the matrix ``w`` over ``x``'s last axis, adding at most a
    bias: ``F.linear(x, w, b)`` (by ``w.T``), ``addmm(b, x, w)`` with ``alpha`` 1, ``x @ w``, ``matmul``,
    ``mm``. The gradient of ``w`` is then the product of ``x`` and the output's gradient. None for other calls."""
    def arg(i: int, key: str) -> Any:
        return args[i] if len(args) > i else kwargs.get(key)

    if name == "linear":
        return arg(0, "input"), arg(1, "weight")
    if name == "addmm" and kwargs.get("alpha", 1) == 1:
        return arg(1, "mat1"), arg(2, "mat2")
    if name in ("matmul", "mm", "__matmul__"):
        return arg(0, "input"), arg(1, "mat2" if name == "mm" else "other")
    return None


def lookup_operands(name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Tuple[Any, Any, Optional[int]]]:
    """``(ids, w, padding_idx)`` of ``F.embedding(ids, w, padding_idx)`` without ``max_norm``,
    ``scale_grad_by_freq`` or ``sparse``: the gradient of ``w`` is then the output's gradient summed into
    the rows ``ids`` picked (none into ``padding_idx``). None for other calls."""
    def arg(i: int, key: str, default: Any = None) -> Any:
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name != "embedding":
        return None
    ids, w, padding = arg(0, "input"), arg(1, "weight"), arg(2, "padding_idx")
    if not (isinstance(ids, torch.Tensor) and isinstance(w, torch.Tensor)) or ids.is_floating_point() \
            or w.dim() != 2 or arg(3, "max_norm") is not None or arg(5, "scale_grad_by_freq", False) \
            or arg(6, "sparse", False) or not (padding is None or isinstance(padding, int)):
        return None
    if padding is not None and padding < 0:
        padding += int(w.shape[0])  # as F.embedding reads it
    return ids, w, padding


Conv = Tuple[Tuple[int, int], Tuple[int, int], Tuple[int, int], Tuple[int, int]]
"""A 2-D convolution's kernel size, stride, padding and dilation (``F.unfold``'s arguments)."""


def _pair(value: Any) -> Optional[Tuple[int, int]]:
    if isinstance(value, int) and not isinstance(value, bool):
        return value, value
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(type(v) is int for v in value):
        return int(value[0]), int(value[1])
    return None


def conv_operands(name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Tuple[Any, Any, Conv]]:
    """``(x, w, conv)`` of ``F.conv2d(x, w, b, stride, padding, dilation, groups=1)`` with zero padding given
    as numbers (or ``"valid"``): the gradient of ``w`` is then the product of ``F.unfold(x, ...)``'s columns and
    the output's gradient, one row per output position. None for other calls (grouped, ``padding="same"``)."""
    def arg(i: int, key: str, default: Any = None) -> Any:
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name != "conv2d":
        return None
    x, w = arg(0, "input"), arg(1, "weight")
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)) or w.dim() != 4 or x.dim() != 4 \
            or arg(6, "groups", 1) != 1:
        return None
    padding = arg(4, "padding", 0)
    stride, padding, dilation = _pair(arg(3, "stride", 1)), _pair(0 if padding == "valid" else padding), \
        _pair(arg(5, "dilation", 1))
    if stride is None or padding is None or dilation is None:
        return None
    return x, w, ((int(w.shape[2]), int(w.shape[3])), stride, padding, dilation)


def weight_operands(kind: str, name: str, args: Tuple[Any, ...],
                    kwargs: Dict[str, Any]) -> Optional[Tuple[Any, Any, bool, Optional[int], Optional[Conv]]]:
    """``(x, w, lookup, padding_idx, conv)`` of a weight product (:func:`product_operands`), for an
    ``embedding`` op a lookup (:func:`lookup_operands`), for a ``conv`` op a convolution
    (:func:`conv_operands`); None for other calls."""
    if kind == "embedding":
        found = lookup_operands(name, args, kwargs)
        return None if found is None else (found[0], found[1], True, found[2], None)
    if kind == "conv":
        conv = conv_operands(name, args, kwargs)
        return None if conv is None else (conv[0], conv[1], False, None, conv[2])
    pair = product_operands(name, args, kwargs)
    return None if pair is None else (pair[0], pair[1], False, None, None)


def weight_layout(name: str) -> str:
    """``out_in`` for ``F.linear``-style weights, ``in_out`` for ``x @ W`` / ``addmm(b, x, W)``."""
    return "in_out" if kind_of_name(name) in ("linear", "matmul") and name != "linear" else "out_in"


def fan_in(weight: torch.Tensor, kind: str, layout: str = "out_in") -> int:
    """Number of summands per output: in_features, or in_channels/groups x kernel area."""
    if kind == "linear":
        return int(weight.shape[0] if layout == "in_out" else weight.shape[-1])
    return int(weight.shape[1]) * int(math.prod(weight.shape[2:]))


ENDPOINT_KINDS = NORM_KINDS | {"softmax", "log_softmax", "attention", "rnn", "other", "reduce", "matmul",
                               "embedding", "conv_transpose"}
"""Ops where the variance analysis of a stretch of weight layers ends: a normalisation resets the
scale, a softmax or attention judges it on its own terms, and the rest have no known gain (IL001,
IL005)."""
EXTREMA_KINDS = WEIGHT_KINDS | NORM_KINDS | frozenset(ACTIVATIONS) | {
    "softmax", "log_softmax", "attention", "rnn", "embedding", "conv_transpose", "input"}
"""Ops whose largest magnitude is measured: where an Inf is never on purpose (IL009)."""


def unit_axis(kind: str) -> Optional[int]:
    """Axis that indexes units (features, channels) of a kind's output, if the kind fixes it."""
    if kind in ("conv", "conv_transpose", "batch_norm", "instance_norm", "group_norm"):
        return 1
    if kind in ("linear", "layer_norm", "rms_norm", "embedding"):
        return -1
    return None


# ------------------------------------------------------------------ attention calls
MASKED_BIAS = -1e4
"""An additive attention bias at or below this is a mask, not a preference: ``exp(-1e4)`` is 0 in
every floating-point type, so whatever the scores, the key gets no weight (``-inf``,
``torch.finfo(dtype).min``, ``-1e9`` and GAT's ``-9e15`` are all masks; ALiBi and T5's
relative position biases, a few tens at most, are not)."""


@dataclass
class AttentionCall:
    """What decides an attention op's probabilities, read from the call's arguments.

    ``form == "sdpa"``: ``q`` is ``(..., Hq, L, E)`` and ``k`` ``(..., Hk, S, E)`` as given to
    ``F.scaled_dot_product_attention``; ``mask`` is boolean (True: may attend) or additive,
    broadcastable to ``(..., Hq, L, S)``. ``form == "mha"``: ``q``/``k`` are the query and key
    *inputs* ``(L, N, E)``/``(S, N, E)`` of ``F.multi_head_attention_forward``, projected per
    head with ``q_weight``/``k_weight``; ``mask`` is its ``attn_mask`` (boolean True: masked
    out, or additive; ``(L, S)`` or ``(N * heads, L, S)``) and ``padding`` its
    ``key_padding_mask`` (``(N, S)``, True: padding, or additive).
    """

    form: str
    q: torch.Tensor
    k: torch.Tensor
    scale: Optional[float] = None
    """The factor applied to ``q @ k^T``; None means the default ``1 / sqrt(head_dim)``."""
    is_causal: bool = False
    mask: Optional[torch.Tensor] = None
    gqa: bool = False
    heads: int = 1
    q_weight: Optional[torch.Tensor] = None
    k_weight: Optional[torch.Tensor] = None
    q_bias: Optional[torch.Tensor] = None
    k_bias: Optional[torch.Tensor] = None
    padding: Optional[torch.Tensor] = None
    v: Optional[torch.Tensor] = None
    """The values the probabilities average."""

    @property
    def head_dim(self) -> int:
        return int(self.q.shape[-1]) if self.form == "sdpa" else int(self.q_weight.shape[0]) // self.heads

    @property
    def keys(self) -> int:
        return int(self.k.shape[-2] if self.form == "sdpa" else self.k.shape[0])


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def attention_call(name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[AttentionCall]:
    """The :class:`AttentionCall` of an SDPA or multi-head-attention call, None for forms it cannot read."""
    try:
        if name == "scaled_dot_product_attention":
            return _sdpa_call(args, kwargs)
        if name == "multi_head_attention_forward":
            return _mha_call(args, kwargs)
    except (TypeError, ValueError, IndexError):  # an unusual call: no attention statistics, nothing else lost
        return None
    return None


def _sdpa_call(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[AttentionCall]:
    bound = dict(zip(_SDPA_ARGS, args), **kwargs)
    q, k, mask = bound.get("query"), bound.get("key"), bound.get("attn_mask")
    if not _float_tensor(q) or not _float_tensor(k) or q.dim() < 2 or k.dim() < 2 or q.numel() == 0 or k.numel() == 0:
        return None
    scale = bound.get("scale")
    return AttentionCall("sdpa", q, k, scale=None if scale is None else float(scale),
                         is_causal=bool(bound.get("is_causal", False)),
                         mask=mask if isinstance(mask, torch.Tensor) else None,
                         gqa=bool(bound.get("enable_gqa", False)),
                         v=bound.get("value") if isinstance(bound.get("value"), torch.Tensor) else None)


@lru_cache(maxsize=1)
def _mha_signature() -> Any:
    import inspect

    return inspect.signature(F.multi_head_attention_forward)


def _mha_call(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[AttentionCall]:
    a = _mha_signature().bind(*args, **kwargs)
    a.apply_defaults()
    v = a.arguments
    if v["bias_k"] is not None or v["add_zero_attn"] or v["static_k"] is not None:
        return None  # an extra key column: rare, and not worth a second code path
    query, key, heads = v["query"], v["key"], int(v["num_heads"])
    if not _float_tensor(query) or not _float_tensor(key) or query.dim() not in (2, 3):
        return None
    if query.dim() == 2:  # unbatched (L, E)
        query, key = query.unsqueeze(1), key.unsqueeze(1)
    embed = int(query.shape[-1])
    if v["use_separate_proj_weight"]:
        q_weight, k_weight = v["q_proj_weight"], v["k_proj_weight"]
    else:
        q_weight, k_weight = v["in_proj_weight"][:embed], v["in_proj_weight"][embed:2 * embed]
    bias = v["in_proj_bias"]
    q_bias, k_bias = (None, None) if bias is None else (bias[:embed], bias[embed:2 * embed])
    if q_weight is None or k_weight is None or embed % heads:
        return None
    padding = v["key_padding_mask"]
    if isinstance(padding, torch.Tensor) and padding.dim() == 1:
        padding = padding.unsqueeze(0)
    value = v["value"] if isinstance(v["value"], torch.Tensor) else None
    return AttentionCall("mha", query, key, mask=v["attn_mask"], heads=heads, q_weight=q_weight, k_weight=k_weight,
                         q_bias=q_bias, k_bias=k_bias, padding=padding, v=value)


def _float_tensor(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def scalar_attrs(kind: str, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """The Python-number factor of a ``mul``/``div`` by a constant, and ``alpha`` of ``baddbmm``:
    how an attention pattern scales its scores (``q @ k^T * scale``, ``/ math.sqrt(d)``); the exponent
    of a ``pow`` by a number (``x.pow(2)``, ``x ** 2``)."""
    if name in ("pow", "__pow__") and len(args) == 2 and isinstance(args[1], (int, float)) \
            and not isinstance(args[1], bool):
        return {"exponent": float(args[1])}
    if kind in ("mul", "div") and len(args) == 2:
        number = next((a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)), None)
        if number is not None and number != 0:
            factor = float(number)
            if kind == "div":
                factor = 1.0 / factor if args[1] is number else float("nan")  # number / tensor is not a scale
            return {"scalar": factor} if factor == factor else {}
    if name == "baddbmm":
        alpha = kwargs.get("alpha", 1)
        return {"scalar": float(alpha)} if isinstance(alpha, (int, float)) else {}
    return {}


# ------------------------------------------------------------------ hand-written normalisations
_SQUARE_NAMES = frozenset({"pow", "__pow__", "square"})
_STAT_PASS = frozenset({"clamp", "clamp_min", "clip", "maximum"})
_ROOT_POWERS = {"rsqrt": -0.5, "sqrt": 0.5, "reciprocal": -1.0}
_NORM_NAMES = frozenset({"norm", "linalg_vector_norm", "vector_norm"})


def _bare(target: str) -> str:
    name = target.rsplit(".", 1)[-1]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def _base(ops: Any, op_id: int) -> int:
    """``op_id`` with the views of one input in front of it looked through (``x.float()``, ``x.view(...)``)."""
    for _ in range(16):
        op = ops[op_id]
        if op.kind != "view" or len(op.inputs) != 1 or op.params:
            break
        op_id = op.inputs[0]
    return op_id


def _power_of_norm(ops: Any, scale: int, signal: int) -> Optional[Tuple[float, List[int]]]:
    """``(p, ops)`` when the tensor made by op ``scale`` is ``||signal||^p`` (up to an added epsilon, a clamp
    and constant factors) along an axis, and the ops that compute it from ``signal``: ``rsqrt(x.pow(2).mean(-1)
    + eps)`` has ``p`` -1, ``x.norm(dim=-1)``, ``sqrt((x * x).sum(-1))`` and ``x.pow(2).sum(-1).pow(0.5)`` 1.
    None for anything else."""
    power, current, base, walked = 1.0, scale, _base(ops, signal), []
    for _ in range(12):
        op = ops[current]
        name = _bare(op.target)
        walked.append(current)
        if op.params or not op.inputs:
            return None
        if op.kind == "reduce" or name in _NORM_NAMES:
            if name in _NORM_NAMES and _base(ops, op.inputs[0]) == base:
                return power, walked
            if name not in ("sum", "mean"):
                return None
            square = ops[_base(ops, op.inputs[0])]
            squared = bool(square.inputs) and (
                (square.kind == "mul" and set(square.inputs) == {square.inputs[0]} and "scalar" not in square.attrs)
                or (_bare(square.target) in _SQUARE_NAMES and len(square.inputs) == 1
                    and square.attrs.get("exponent", 2.0) == 2.0))
            if squared and _base(ops, square.inputs[0]) == base:
                return 2 * power, walked + [square.id]
            return None
        if len(op.inputs) != 1:
            return None
        if name in _ROOT_POWERS:
            power *= _ROOT_POWERS[name]
        elif name in _SQUARE_NAMES and isinstance(op.attrs.get("exponent"), float):
            power *= op.attrs["exponent"]  # a root as a power (AIMv2's and CLIP-style towers' `pow(s, 0.5)`)
        elif not (op.kind == "view" or (op.kind in ("add", "mul", "div") and len(op.inputs) == 1)
                  or name in _STAT_PASS):
            return None
        current = op.inputs[0]
    return None


def own_norm_statistic(ops: Any, kind: str, inputs: Any, params: Any) -> Optional[List[int]]:
    """The ops that compute the statistic when a ``mul``/``div`` of two tensors scales a signal by the inverse
    of its own root-mean-square or L2 norm along an axis, else None: a hand-written normalisation written as
    small functional ops, ``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)`` (an RMSNorm: Qwen3-Next's
    gated one, whose module also multiplies by a gate), ``x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)``
    or ``x / x.norm(dim=-1, keepdim=True)`` (an L2 normalisation: the gated-delta-rule's queries and keys).
    Its output's scale does not depend on its input's, as a normalisation module's does not."""
    if kind not in ("mul", "div") or params or len(inputs) != 2 or inputs[0] == inputs[1]:
        return None
    a, b = inputs
    pairs = [(b, a, 1.0)] if kind == "div" else [(b, a, -1.0), (a, b, -1.0)]
    for scale, signal, wanted in pairs:
        found = _power_of_norm(ops, scale, signal)
        if found is not None and found[0] == wanted:
            return found[1]
    return None
