"""Host synchronisations per audit, counted on any device (CPU included), at two depths of each model.

    python benchmarks/bench_syncs.py [--models mlp,transformer,gpt2,llama] [--sites]

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

Goal: at most 8 host synchronisations of initlint's own per audit, the same at 12 and 32 layers.
"""
from __future__ import annotations

import argparse
import os
import sys
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


def count(model: nn.Module, inputs: C.Inputs) -> Tuple[int, int, HostSyncs]:
    """Synchronisations of one fwd+bwd and of one audit (after a warm-up of each)."""
    import initlint

    out = C.main_output(model(*inputs[0], **inputs[1]))
    cotangent = torch.randn(out.shape)
    params = [p for p in model.parameters() if p.requires_grad]
    initlint.audit(model, C.example(inputs))
    with HostSyncs() as plain:
        out = C.main_output(model(*inputs[0], **inputs[1]))
        torch.autograd.grad([out], params, [cotangent], allow_unused=True)
    with HostSyncs() as audited:
        initlint.audit(model, C.example(inputs))
    return plain.count, audited.count, audited


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--sites", action="store_true", help="where each of the audit's synchronisations was made")
    opts = parser.parse_args()
    C.set_threads(1)
    import transformers

    transformers.logging.set_verbosity_error()
    print(f"machine: {C.machine()}")
    print(f"code: {C.revision()}")
    rows: List[List[Any]] = []
    own: Dict[str, List[int]] = {}
    for name in [n for n in opts.models.split(",") if n]:
        build, what = MODELS[name]
        for depth in DEPTHS:
            torch.manual_seed(0)
            model, inputs = build(depth)
            plain, audited, syncs = count(model, inputs)
            own.setdefault(name, []).append(audited - plain)
            rows.append([f"{name} {depth}", what, plain, audited, audited - plain])
            print(f"  {name} at {depth} layers: fwd+bwd {plain}, audit {audited}", flush=True)
            if opts.sites:
                for site, n in syncs.sites.most_common():
                    print(f"      {n} x {site}")
    print()
    print(C.table(["model", "what", "fwd+bwd", "audit", "audit - fwd+bwd"], rows))
    print()
    worst = max(max(v) for v in own.values())
    flat = all(len(set(v)) == 1 for v in own.values())
    print(f"goal at most {GOAL} of initlint's own per audit: {'met' if worst <= GOAL else 'MISSED'} (largest {worst}); "
          f"the same at {DEPTHS[0]} and {DEPTHS[1]} layers: {'met' if flat else 'MISSED'}")


if __name__ == "__main__":
    main()
