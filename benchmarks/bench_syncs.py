"""Host synchronisations per audit, counted on any device (CPU included), at two depths of each model.

    python benchmarks/bench_syncs.py [--models mlp,transformer,gpt2,llama] [--sites] [--cuda]

A host synchronisation is a call after which the host waits for the device on CUDA: a value read
on the host (``.item()``, ``float(t)``, ``bool(t)``, ``.tolist()``, ``.cpu()``, ...), an op whose
output size depends on the data (``nonzero``, a boolean index, ``torch.equal``, ...), or a copy of a
host tensor to the device (``torch.tensor(data, device=...)``, ``t.to(device)`` of a tensor made on
the host). ``tests/host_syncs.py`` counts them as they are called, so on this CPU machine the count is
the one a GPU run would make (less the model's own calls that only a GPU path makes).

For each model at 12 and at 32 layers (small widths: the count does not depend on the width) it
counts, after one warm-up audit, the synchronisations of

* ``fwd+bwd``: the model's own training-mode forward and a backward (``_common.forward_backward``),
  which a training step makes as well (the cotangent of the baseline is not counted: it is the
  benchmark's, not the model's);
* ``audit``: ``initlint.audit(model, batch)`` with every rule;

and ``audit - fwd+bwd``: initlint's own. ``--sites`` lists where each of the audit's was made.

``--cuda`` runs the models on the GPU and also gives the count CUDA itself reports
(``torch.cuda.set_sync_debug_mode("warn")``: one warning per synchronising call), as a check of the counter.

Goal: at most 8 host synchronisations of initlint's own per audit, the same at 12 and 32 layers.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from typing import Any, Callable, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's initlint
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))  # the counter

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import _common as C  # noqa: E402
from host_syncs import HostSyncs  # noqa: E402

GOAL = 8
DEPTHS = (12, 32)


def _mlp(depth: int) -> Tuple[nn.Module, C.Inputs]:
    return C.relu_mlp(depth, 256), ((torch.randn(64, 256),), {})


def _transformer(depth: int) -> Tuple[nn.Module, C.Inputs]:
    """``nn.Transformer`` with ``depth`` encoder and ``depth`` decoder layers, width 128."""
    model = nn.Transformer(d_model=128, nhead=4, num_encoder_layers=depth, num_decoder_layers=depth,
                           dim_feedforward=256, batch_first=True)
    return model, ((torch.randn(2, 16, 128), torch.randn(2, 16, 128)), {})


def _ids(vocab: int) -> C.Inputs:
    return (), {"input_ids": torch.randint(0, vocab, (2, 16))}


def _gpt2(depth: int) -> Tuple[nn.Module, C.Inputs]:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=depth, n_embd=128, n_head=4, vocab_size=5000)), _ids(5000)


def _llama(depth: int) -> Tuple[nn.Module, C.Inputs]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=depth, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=5000)
    return LlamaForCausalLM(config), _ids(5000)


MODELS: Dict[str, Tuple[Callable[[int], Tuple[nn.Module, C.Inputs]], str]] = {
    "mlp": (_mlp, "Linear 256 + ReLU per layer, batch 64"),
    "transformer": (_transformer, "nn.Transformer, that many encoder and decoder layers, width 128, 2 x 16 tokens"),
    "gpt2": (_gpt2, "GPT2LMHeadModel, width 128, vocabulary 5000, 2 x 16 tokens"),
    "llama": (_llama, "LlamaForCausalLM, width 128, vocabulary 5000, 2 x 16 tokens"),
}


CUDA_SITES: "Counter[str]" = Counter()
"""Where the audits' synchronisations that CUDA reported were made (the innermost frames of initlint's, and of any)."""


def _cuda_reported(fn: Callable[[], Any], sites: bool = False) -> int:
    """Synchronisations CUDA reports while ``fn`` runs (``set_sync_debug_mode``'s warnings)."""
    import traceback
    import warnings

    count = 0

    def record(message: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal count
        if "synchroniz" not in str(message):
            return
        count += 1
        if sites:
            stack = traceback.extract_stack()[:-1]
            ours = [f for f in stack if "/initlint/" in f.filename]
            where = [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in (ours[-2:] or stack[-2:])]
            CUDA_SITES[" <- ".join(reversed(where))] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return count


def count(model: nn.Module, inputs: C.Inputs, device: str = "cpu") -> Tuple[int, int, HostSyncs, Any]:
    """Synchronisations of one fwd+bwd and of one audit (after a warm-up of each); on CUDA also the counts
    CUDA reports for the two."""
    import initlint
    from initlint.inputs.load import move_inputs

    if device != "cpu":
        model = model.to(device)
        inputs = (move_inputs(inputs[0], torch.device(device)), move_inputs(inputs[1], torch.device(device)))
    out = C.main_output(model(*inputs[0], **inputs[1]))
    cotangent = torch.randn(out.shape, device=out.device)
    params = [p for p in model.parameters() if p.requires_grad]
    initlint.audit(model, C.example(inputs))

    def plain_step() -> None:
        out = C.main_output(model(*inputs[0], **inputs[1]))
        torch.autograd.grad([out], params, [cotangent], allow_unused=True)

    with HostSyncs() as plain:
        plain_step()
    with HostSyncs() as audited:
        initlint.audit(model, C.example(inputs))
    reported = None
    if device != "cpu":
        reported = (_cuda_reported(plain_step),
                    _cuda_reported(lambda: initlint.audit(model, C.example(inputs)), sites=True))
    return plain.count, audited.count, audited, reported


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--sites", action="store_true", help="where each of the audit's synchronisations was made")
    parser.add_argument("--cuda", action="store_true", help="on the GPU, with CUDA's own count too")
    opts = parser.parse_args()
    device = "cuda" if opts.cuda else "cpu"
    C.set_threads(1)
    import transformers

    transformers.logging.set_verbosity_error()
    print(f"machine: {C.machine()}")
    print(f"code: {C.revision()}; device: {device}")
    rows: List[List[Any]] = []
    own: Dict[str, List[int]] = {}
    for name in [n for n in opts.models.split(",") if n]:
        build, what = MODELS[name]
        for depth in DEPTHS:
            torch.manual_seed(0)
            model, inputs = build(depth)
            plain, audited, syncs, reported = count(model, inputs, device)
            own.setdefault(name, []).append(audited - plain)
            rows.append([f"{name} {depth}", what, plain, audited, audited - plain]
                        + ([reported[0], reported[1], reported[1] - reported[0]] if reported else []))
            print(f"  {name} at {depth} layers: fwd+bwd {plain}, audit {audited}"
                  + (f"; CUDA reports fwd+bwd {reported[0]}, audit {reported[1]}" if reported else ""), flush=True)
            if opts.sites:
                for site, n in syncs.sites.most_common():
                    print(f"      {n} x {site}")
                for site, n in CUDA_SITES.most_common():
                    print(f"      CUDA: {n} x {site}")
                CUDA_SITES.clear()
    print()
    print(C.table(["model", "what", "fwd+bwd", "audit", "audit - fwd+bwd"]
                  + (["CUDA: fwd+bwd", "CUDA: audit", "CUDA: audit - fwd+bwd"] if opts.cuda else []), rows))
    print()
    worst = max(max(v) for v in own.values())
    flat = all(len(set(v)) == 1 for v in own.values())
    print(f"goal at most {GOAL} of initlint's own per audit: {'met' if worst <= GOAL else 'MISSED'} (largest {worst}); "
          f"the same at {DEPTHS[0]} and {DEPTHS[1]} layers: {'met' if flat else 'MISSED'}")


if __name__ == "__main__":
    main()
