"""Models whose forward changes state: buffers, parameters, flags, global modes, the RNG.

Each case in :data:`CASES` builds a fresh model and its example inputs; the no-mutation
tests audit it and check that nothing of it (or of the process) changed. :data:`BLOCKS`
are shape-preserving stateful blocks the generated models of the property test mix in.
"""
from __future__ import annotations

import random
from typing import Any, Callable, Dict, Tuple

import torch
import torch.nn as nn


# ------------------------------------------------------------------ blocks (any input shape)
class CountInPlace(nn.Module):
    """A call counter updated in place, as a step buffer often is."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.calls.add_(1)
        return x


class CountReassigned(nn.Module):
    """``self.calls = self.calls + 1``: the buffer is replaced by a new tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.calls = self.calls + 1
        return x


class RunningAverage(nn.Module):
    """Subtracts a running mean it updates in place (written under no_grad)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("avg", torch.zeros(()))

    def forward(self, x):
        with torch.no_grad():
            self.avg.mul_(0.9).add_(0.1 * x.mean())
        return x - self.avg


class CacheOnFirstCall(nn.Module):
    """The rotary-cache pattern: a buffer registered on the first forward, sized from the input."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", None, persistent=False)

    def forward(self, x):
        if self.cache is None:
            self.register_buffer("cache", torch.ones(x.shape[1], dtype=x.dtype), persistent=False)
        return x * self.cache.reshape((-1,) + (1,) * (x.dim() - 2))


class ClampParameter(nn.Module):
    """Clamps its own parameter in place on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        with torch.no_grad():
            self.scale.clamp_(max=1.5)
        return x * self.scale


class DropoutToEval(nn.Module):
    """Switches a child to eval mode in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        self.drop.eval()
        return self.drop(x)


class SeedsTheRng(nn.Module):
    """Reseeds the global RNGs (torch and Python's) in forward."""

    def forward(self, x):
        torch.manual_seed(1234)
        random.seed(1234)
        return x + 0.0 * torch.rand(())


class GradOff(nn.Module):
    """Turns autograd off for the rest of the forward (and leaves it off)."""

    def forward(self, x):
        torch.set_grad_enabled(False)
        return x


class PlainCounters(nn.Module):
    """Plain attributes: an int rebound, a list and a dict grown in place."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0
        self.history: list = []
        self.seen: Dict[str, int] = {}

    def forward(self, x):
        self.steps += 1
        self.history.append(self.steps)
        self.seen[str(self.steps)] = self.steps
        self.last_shape = tuple(x.shape)
        return x


class FreezesItself(nn.Module):
    """Sets ``requires_grad`` of its own parameter in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(()))

    def forward(self, x):
        self.gain.requires_grad_(False)
        return x * self.gain


class HookOnFirstCall(nn.Module):
    """Registers a forward hook and a child module the first time it runs."""

    def forward(self, x):
        if not self._forward_hooks:
            self.register_forward_hook(lambda module, args, out: None)
            self.extra = nn.Identity()
        return x


BLOCKS: Dict[str, Callable[[], nn.Module]] = {
    "count_in_place": CountInPlace, "count_reassigned": CountReassigned, "running_average": RunningAverage,
    "cache_on_first_call": CacheOnFirstCall, "clamp_parameter": ClampParameter, "dropout_to_eval": DropoutToEval,
    "seeds_the_rng": SeedsTheRng, "grad_off": GradOff, "plain_counters": PlainCounters,
    "freezes_itself": FreezesItself, "hook_on_first_call": HookOnFirstCall,
}


# ------------------------------------------------------------------ whole models
class Rotary(nn.Module):
    """A rotary-embedding cache built on the first call from the sequence length."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.register_buffer("cos_cached", None, persistent=False)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16)), persistent=False)

    def forward(self, x):
        seq = x.shape[1]
        if self.cos_cached is None or self.cos_cached.shape[0] < seq:
            t = torch.arange(seq, dtype=self.inv_freq.dtype)
            freqs = torch.outer(t, self.inv_freq)
            self.register_buffer("cos_cached", torch.cat([freqs, freqs], -1).cos(), persistent=False)
        return self.proj(x) * self.cos_cached[:seq]


class TrainOverride(nn.Module):
    """A ``train()`` override that freezes the first layer (sets ``requires_grad``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 2)

    def train(self, mode: bool = True):
        super().train(mode)
        for p in self.a.parameters():
            p.requires_grad_(not mode)
        return self

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class Writer(nn.Module):
    """Writes into its own input and into a parameter through ``.data``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x.mul_(0.5)
        self.fc.weight.data = self.fc.weight.data * 0.9
        return self.fc(x)


class Tied(nn.Module):
    """An embedding and an output layer sharing one weight, renormalised in place in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.out = nn.Linear(8, 20, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, ids):
        with torch.no_grad():
            self.emb.weight.div_(self.emb.weight.norm(dim=1, keepdim=True))
        return self.out(self.emb(ids))


class GlobalModes(nn.Module):
    """Changes process-wide settings in forward: default dtype, deterministic algorithms, anomaly mode."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = self.fc(x)
        torch.set_default_dtype(torch.float64)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.set_float32_matmul_precision("medium")
        return y


class Interrupted(nn.Module):
    """Changes state, then raises: the state must still be restored."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.register_buffer("calls", torch.zeros(()))
        self.exc = exc

    def forward(self, x):
        self.calls.add_(1)
        with torch.no_grad():
            self.fc.weight.zero_()
        self.fc.eval()
        torch.manual_seed(5)
        raise self.exc


class InitOnFirstCall(nn.Module):
    """Initialises its weights on the first forward and remembers that it did."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)
        self.initialised = False

    def forward(self, x):
        if not self.initialised:
            nn.init.orthogonal_(self.fc.weight)
            self.apply(lambda m: nn.init.zeros_(m.bias) if isinstance(m, nn.Linear) else None)
            self.initialised = True
        return self.head(torch.relu(self.fc(x)))


class ConvertsItself(nn.Module):
    """Casts itself to float64 in forward (``Module.to`` swaps every parameter's data)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x):
        self.double()
        return self.fc(x.double()) * self.scale


class DeletesItsCache(nn.Module):
    """Drops a buffer and a plain attribute in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.register_buffer("cache", torch.zeros(4), persistent=False)
        self.note = "kept"

    def forward(self, x):
        del self.cache
        del self.note
        return self.fc(x)


class Threads(nn.Module):
    """Changes torch's intra-op thread count in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        torch.set_num_threads(torch.get_num_threads() + 1)
        return self.fc(x)


class Checkpointed(nn.Module):
    """Activation checkpointing inside forward (it stashes and replays the RNG state)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.2), nn.ReLU())
        self.head = nn.Linear(8, 2)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        self.calls += 1
        return self.head(checkpoint(self.block, x, use_reentrant=False))


def _weight_norms() -> nn.Module:
    """The parametrization and the deprecated hook-based weight norm (which sets ``weight`` in a pre-hook)."""
    import warnings

    from torch.nn.utils.parametrizations import weight_norm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        old = nn.utils.weight_norm(nn.Linear(8, 8))
    return nn.Sequential(weight_norm(nn.Linear(8, 8)), nn.ReLU(), old, nn.ReLU(), nn.Linear(8, 2))


def _parametrized_spectral() -> nn.Module:
    from torch.nn.utils.parametrizations import spectral_norm

    return nn.Sequential(spectral_norm(nn.Linear(8, 8)), nn.ReLU(), nn.Linear(8, 2))


def _old_spectral() -> nn.Module:
    return nn.Sequential(nn.utils.spectral_norm(nn.Linear(8, 8)), nn.ReLU(), nn.Linear(8, 2))


def _qat() -> nn.Module:
    import warnings

    from torch.ao.quantization import get_default_qat_qconfig, prepare_qat

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        model.qconfig = get_default_qat_qconfig("fbgemm")
        return prepare_qat(model.train())


def _max_norm_embedding() -> nn.Module:
    return nn.Sequential(nn.Embedding(30, 16, max_norm=1.0), nn.Linear(16, 4))


def _eval_batchnorm() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2)).eval()


def _with_blocks(*names: str) -> nn.Module:
    layers = [nn.Linear(8, 8)]
    for name in names:
        layers += [BLOCKS[name](), nn.Linear(8, 8), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(8, 2))


def _x(batch: int = 4, width: int = 8) -> Callable[[], torch.Tensor]:
    return lambda: torch.randn(batch, width, generator=torch.Generator().manual_seed(0))


def _ids(vocab: int, shape: Tuple[int, ...] = (4, 5)) -> Callable[[], torch.Tensor]:
    return lambda: torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(0))


CASES: Dict[str, Tuple[Callable[[], nn.Module], Callable[[], Any]]] = {
    **{f"block_{name}": (lambda name=name: _with_blocks(name), _x()) for name in BLOCKS},
    "all_blocks": (lambda: _with_blocks(*BLOCKS), _x()),
    "rotary_cache": (Rotary, lambda: torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(0))),
    "spectral_norm_parametrization": (_parametrized_spectral, _x()),
    "spectral_norm_hooks": (_old_spectral, _x()),
    "prepare_qat": (_qat, _x()),
    "embedding_max_norm": (_max_norm_embedding, _ids(30)),
    "train_override": (TrainOverride, _x()),
    "writes_input_and_data": (Writer, _x()),
    "tied_and_renormalised": (Tied, _ids(20)),
    "global_modes": (GlobalModes, _x()),
    "eval_batchnorm": (_eval_batchnorm, _x()),
    "init_on_first_call": (InitOnFirstCall, _x()),
    "converts_itself": (ConvertsItself, _x()),
    "deletes_its_cache": (DeletesItsCache, _x()),
    "threads": (Threads, _x()),
    "checkpointed": (Checkpointed, _x()),
    "weight_norms": (_weight_norms, _x()),
}
"""name -> (model factory, example-input factory): every model here runs and changes state in forward."""
