"""What the benchmark scripts share: the model set, the plain forward+backward, timing, peak memory.

Peak memory is read in a fresh subprocess per measurement, from the kernel's high-water
mark of the process's resident set (``VmHWM`` in ``/proc/self/status``), reset just before
the measured call by writing ``5`` to ``/proc/self/clear_refs``, with glibc's mmap
threshold fixed at 128 KiB. See bench_overhead.py.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
THREADS_ENV = "INITLINT_BENCH_THREADS"


def set_threads(threads: int) -> None:
    """Fix torch's intra-op threads for this process and the memory subprocesses it starts.

    The default is 1: on a 2-core machine shared with other jobs, two OpenMP threads spin at
    barriers while the other core is taken, which made a plain forward+backward up to 20x
    slower and its time vary run to run. One thread gives stable figures.
    """
    torch.set_num_threads(threads)
    os.environ[THREADS_ENV] = str(threads)

Inputs = Tuple[Tuple[Any, ...], Dict[str, Any]]


# ------------------------------------------------------------------ models
def relu_mlp(depth: int, width: int) -> nn.Module:
    layers: List[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


class ConvBN(nn.Sequential):
    """Four conv-BN-ReLU blocks at 32x32, then a linear head."""

    def __init__(self) -> None:
        def block(cin: int, cout: int) -> List[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

        super().__init__(*block(3, 32), *block(32, 64), nn.MaxPool2d(2), *block(64, 128), *block(128, 128),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))


class Branchy(nn.Module):
    """Residual GELU blocks whose sign depends on the data (``if x.sum() > 0``): torch.fx cannot trace it."""

    def __init__(self, depth: int = 12, width: int = 512) -> None:
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
                                    for _ in range(depth))
        self.out = nn.Linear(width, 10)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            if x.sum() > 0:
                x = x + block(x)
            else:
                x = x - block(x)
        return self.out(x)


def bert4() -> nn.Module:
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(hidden_size=768, num_hidden_layers=4, num_attention_heads=12, intermediate_size=3072))


def bert_small(layers: int, width: int) -> nn.Module:
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(hidden_size=width, num_hidden_layers=layers, num_attention_heads=width // 64,
                                intermediate_size=4 * width))


def gpt2_4() -> nn.Module:
    from transformers import GPT2Config, GPT2Model

    return GPT2Model(GPT2Config(n_layer=4, n_embd=768, n_head=12))


def gpt2_124m() -> nn.Module:
    """GPT-2 124M with its LM head: ``GPT2Config()`` (12 layers x 768, vocabulary 50257)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config())


def bert_base() -> nn.Module:
    """BERT-base for masked LM: ``BertConfig()`` (12 layers x 768, vocabulary 30522)."""
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig())


def llama_32k() -> nn.Module:
    """A Llama-style LM: 8 layers x 1024 (MLP 2816, 16 heads), vocabulary 32000."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                                        num_attention_heads=16, num_key_value_heads=16, vocab_size=32000))


def _tokens(model: nn.Module, batch: int, seq: int, gen: torch.Generator) -> Inputs:
    return (), {"input_ids": torch.randint(0, model.config.vocab_size, (batch, seq), generator=gen)}


MODELS: Dict[str, Tuple[Callable[[], nn.Module], Callable[[nn.Module, torch.Generator], Inputs], str]] = {
    "mlp50": (lambda: relu_mlp(50, 256), lambda m, g: ((torch.randn(16, 256, generator=g),), {}),
              "50 x (Linear 256 + ReLU), batch 16"),
    "convbn": (ConvBN, lambda m, g: ((torch.randn(16, 3, 32, 32, generator=g),), {}),
               "4 x conv-BN-ReLU (32-128 ch), 3x32x32, batch 16"),
    "bert4": (bert4, lambda m, g: _tokens(m, 8, 64, g), "BertModel, 4 layers, hidden 768, batch 8 x 64 tokens"),
    "gpt2_4": (gpt2_4, lambda m, g: _tokens(m, 8, 64, g), "GPT2Model, 4 layers, n_embd 768, batch 8 x 64 tokens"),
    "gpt2_124m": (gpt2_124m, lambda m, g: _tokens(m, 8, 64, g),
                  "GPT2LMHeadModel(GPT2Config()): 12 layers x 768, vocabulary 50257, batch 8 x 64 tokens"),
    "bert_base": (bert_base, lambda m, g: _tokens(m, 8, 64, g),
                  "BertForMaskedLM(BertConfig()): 12 layers x 768, vocabulary 30522, batch 8 x 64 tokens"),
    "llama_32k": (llama_32k, lambda m, g: _tokens(m, 8, 64, g),
                  "LlamaForCausalLM: 8 layers x 1024, vocabulary 32000, batch 8 x 64 tokens"),
    "mlp50_b64": (lambda: relu_mlp(50, 256), lambda m, g: ((torch.randn(64, 256, generator=g),), {}),
                  "50 x (Linear 256 + ReLU), batch 64"),
    "bert4_256": (lambda: bert_small(4, 256), lambda m, g: _tokens(m, 4, 64, g),
                  "BertModel, 4 layers, hidden 256, batch 4 x 64 tokens"),
    "branchy": (Branchy, lambda m, g: ((torch.randn(16, 512, generator=g),), {}),
                "12 residual LN-Linear-GELU blocks, width 512, data-dependent branch (runtime capture only)"),
}
REAL_SIZE = ("gpt2_124m", "bert_base", "llama_32k")
SMALL = ("mlp50_b64", "bert4_256", "convbn")
SMALL_ONLY = ("mlp50_b64", "bert4_256")
"""Small models, where the audit's fixed cost per op and per audit shows most (bench_overhead.py --models small)."""
"""Published models at full width and vocabulary (bench_real_size.py); not in bench_overhead's default set."""


def build(name: str, seed: int = 0) -> Tuple[nn.Module, Inputs]:
    """The model (built from config, no download) and its probe batch."""
    factory, inputs, _ = MODELS[name]
    torch.manual_seed(seed)
    model = factory()
    return model, inputs(model, torch.Generator().manual_seed(seed))


def example(inputs: Inputs) -> Any:
    """The probe batch in the form ``initlint.audit`` takes."""
    args, kwargs = inputs
    return kwargs if kwargs else (args[0] if len(args) == 1 else args)


# ------------------------------------------------------------------ workloads
def main_output(out: Any) -> torch.Tensor:
    """The tensor the audit backpropagates from: ``logits``, else ``last_hidden_state`` of a Hugging Face model,
    else the output (as ``initlint.probe.run.primary_output``)."""
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state"):
        if key in out:
            return out[key]
    return out[0]


def forward_backward(model: nn.Module, inputs: Inputs) -> None:
    """One training-mode forward and a backward of a random cotangent with ``torch.autograd.grad``; the
    cotangent is drawn on the output's device from that device's generator (on CPU the same numbers as
    ``torch.Generator().manual_seed(0)``), as the audit draws its own."""
    args, kwargs = inputs
    params = [p for p in model.parameters() if p.requires_grad]
    out = main_output(model(*args, **kwargs))
    gen = torch.Generator(device=out.device).manual_seed(0)
    cotangent = torch.randn(out.shape, generator=gen, device=out.device, dtype=out.dtype)
    torch.autograd.grad([out], params, [cotangent], allow_unused=True)


def forward_rules() -> List[str]:
    """Codes of the rules that need no backward pass (``needs`` without ``gradients``)."""
    from initlint.rules import all_rules

    return [code for code, rule in all_rules().items() if "gradients" not in rule.needs]


def gradient_rules() -> List[str]:
    from initlint.rules import all_rules

    return [code for code, rule in all_rules().items() if "gradients" in rule.needs]


def workload(kind: str, model: nn.Module, inputs: Inputs) -> Callable[[], Any]:
    """``fwd_bwd``, ``audit``, ``audit_fwd`` or ``torchinfo`` as a zero-argument callable."""
    import initlint

    if kind == "fwd_bwd":
        return lambda: forward_backward(model, inputs)
    if kind == "audit":
        return lambda: initlint.audit(model, example(inputs))
    if kind == "audit_fwd":
        select = forward_rules()
        return lambda: initlint.audit(model, example(inputs), select=select)
    if kind == "torchinfo":
        import torchinfo

        return lambda: torchinfo.summary(model, input_data=example(inputs), verbose=0)
    raise ValueError(kind)


# ------------------------------------------------------------------ timing
CLOCKS = {"wall": time.perf_counter, "process": time.process_time}
_clock = time.perf_counter


def set_clock(name: str) -> None:
    """``wall`` (the default) or ``process``: this process's CPU time, which other jobs on a shared machine
    do not inflate (with one intra-op thread it is the call's own work; not for GPU work, which it misses)."""
    global _clock
    _clock = CLOCKS[name]


def _synchronize() -> None:
    """Wait for queued CUDA work, so that a wall time covers what the call launched."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any]) -> float:
    _synchronize()
    start = _clock()
    fn()
    _synchronize()
    return _clock() - start


def interleaved_medians(fns: Dict[str, Callable[[], Any]], repeats: int, warmup: int = 1,
                        settle: int = 0) -> Dict[str, float]:
    """Median seconds per callable; the callables take turns so background load hits them alike.

    ``settle``: untimed calls of a callable right before each of its timed calls, so that each is
    timed in the state its own kind leaves (the heap, the pages the process holds), as a call in a
    loop is, and not in the state the callable before it left: a 32-layer Llama's forward+backward
    right after an audit took 8.2 s with 480 thousand page faults, after another forward+backward
    2.4 s with 32 thousand, because the gradients it forms reuse memory only a forward+backward
    had allocated."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    samples: Dict[str, List[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            for _ in range(settle):
                fn()
            samples[key].append(timed(fn))
    return {k: statistics.median(v) for k, v in samples.items()}


# ------------------------------------------------------------------ peak memory
def _status_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_rss_child(model_name: str, kind: str) -> Dict[str, Any]:
    """In a fresh process: build, warm up once, reset the high-water mark, run once, report the peak."""
    set_threads(int(os.environ.get(THREADS_ENV, "1")))
    torch.manual_seed(0)
    model, inputs = build(model_name)
    fn = workload(kind, model, inputs)
    fn()  # one-off work (lazy imports, code generation, caches) is not part of the peak
    import gc

    gc.collect()
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # resets VmHWM to the current VmRSS
    base = _status_kb("VmRSS")
    fn()
    return {"base_kb": base, "peak_kb": _status_kb("VmHWM"), "delta_kb": _status_kb("VmHWM") - base}


def peak_rss(script: str, model_name: str, kind: str) -> Dict[str, Any]:
    """Run :func:`peak_rss_child` in a subprocess of ``script`` (``--memory-child MODEL KIND``)."""
    # A fixed mmap threshold turns off glibc's dynamic one, which would otherwise rise after the
    # warm-up frees its tensors and serve the measured run's tensors from memory already resident.
    env = dict(os.environ, INITLINT_NO_PROGRESS="1", MALLOC_MMAP_THRESHOLD_="131072")
    out = subprocess.run([sys.executable, script, "--memory-child", model_name, kind], capture_output=True, text=True,
                         env=env, check=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ reporting
def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return (f"{os.cpu_count()} cores ({cpu}), torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, "
            f"Python {platform.python_version()}, load average {os.getloadavg()[0]:.2f}")


def revision() -> str:
    """The commit measured, and whether initlint/ differed from it."""
    root = os.path.dirname(HERE)
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "initlint"], cwd=root, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown revision"
    return f"initlint at {head}" + (" with uncommitted changes in initlint/" if dirty else "")


def table(headers: List[str], rows: List[List[Any]]) -> str:
    """A Markdown table."""
    def cell(x: Any) -> str:
        return f"{x:.3g}" if isinstance(x, float) else str(x)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def maybe_child(argv: List[str]) -> Optional[Dict[str, Any]]:
    """Handle ``--memory-child MODEL KIND`` and print its JSON result."""
    if len(argv) >= 4 and argv[1] == "--memory-child":
        result = peak_rss_child(argv[2], argv[3])
        print(json.dumps(result))
        return result
    return None
