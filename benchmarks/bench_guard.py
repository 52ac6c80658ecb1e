"""What the state guard costs on GPT-2 124M, next to a plain forward+backward and a deep copy.

    python benchmarks/bench_guard.py [--repeats 3] [--threads 1] [--batch 4] [--seq 64] [--layers 12]

The model is ``transformers.GPT2LMHeadModel(GPT2Config())`` (124M parameters, the 50257-word
output layer tied to the input embedding), built from its config; the probe batch is
``batch x seq`` random token ids. One process measures the median wall time, after one
warm-up round and with the workloads taking turns within each repeat, of:

* ``fwd+bwd``: a training-mode forward and ``torch.autograd.grad`` of a random cotangent
  with respect to every parameter (``_common.forward_backward``);
* ``guarded fwd+bwd``: the same inside ``initlint.probe.guard.guarded`` (stand-ins for every
  tensor, train mode, seeded RNG, everything restored afterwards): what the guard adds to a
  forward, including any copy-on-write materialisation the forward causes;
* ``guard alone``: entering and leaving the guard with nothing inside (taking the snapshot,
  giving every tensor its stand-in, restoring);
* ``guard, plain copies``: the same with ``copy_on_write=False``: every parameter's stand-in
  is a real copy (what a clone-based snapshot costs, and the fallback for kernels that
  refuse copy-on-write tensors);
* ``audit``: ``initlint.audit(model, batch)`` with every rule;
* ``deepcopy``: ``copy.deepcopy(model)``, what auditing a copy instead would cost up front
  (measured once per repeat like the others).

With ``--small`` (default ``mlp50,convbn,branchy`` from ``_common.MODELS``) it also times the
guard alone against those models' forward+backward, where a fixed cost would show most, in
wall-clock and in process CPU time.

It also checks what the guard promises on this model: after an audit every parameter and
buffer is the same object with the same bits and the same version counter.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402


def gpt2(layers: int):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=layers))


def state(model):
    """Object, version counter and a checksum of every parameter and buffer."""
    import torch

    with torch.no_grad():
        return [(n, id(t), t._version, float(t.double().sum()), float(t.double().abs().sum()))
                for n, t in list(model.named_parameters()) + list(model.named_buffers())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--small", default="mlp50,convbn,branchy")
    opts = parser.parse_args()
    C.set_threads(opts.threads)

    import torch

    import initlint
    from initlint.probe.guard import guarded

    model = gpt2(opts.layers)
    ids = torch.randint(0, model.config.vocab_size, (opts.batch, opts.seq), generator=torch.Generator().manual_seed(0))
    inputs = ((), {"input_ids": ids})
    params = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    print(f"machine: {C.machine()}")
    print(f"code: {C.revision()}")
    print(f"model: GPT2LMHeadModel, {opts.layers} layers, {params / 1e6:.1f}M parameters, "
          f"{buffers / 2**20:.2f} MiB of buffers; batch {opts.batch} x {opts.seq} tokens")

    before = state(model)
    report = initlint.audit(model, {"input_ids": ids})
    assert state(model) == before, "the audit changed the model"
    print(f"audit: capture {report.capture}, {len(report.findings)} findings; parameters and buffers unchanged "
          f"(objects, bits, version counters)")

    def guarded_fwd_bwd():
        with guarded(model, 0, inputs):
            C.forward_backward(model, inputs)

    def guard_alone():
        with guarded(model, 0, inputs):
            pass

    def guard_copies():
        with guarded(model, 0, inputs, copy_on_write=False):
            pass

    fns = {
        "fwd_bwd": lambda: C.forward_backward(model, inputs),
        "guarded_fwd_bwd": guarded_fwd_bwd,
        "guard_alone": guard_alone,
        "guard_plain_copies": guard_copies,
        "audit": lambda: initlint.audit(model, {"input_ids": ids}),
        "deepcopy": lambda: copy.deepcopy(model),
    }
    t = C.interleaved_medians(fns, opts.repeats)
    base = t["fwd_bwd"]
    rows = [[name, C.ms(seconds), f"{seconds / base:.3f}"] for name, seconds in t.items()]
    print()
    print(f"Median of {opts.repeats} runs after a warm-up, milliseconds; ratio to fwd+bwd.")
    print()
    print(C.table(["workload", "ms", "/ fwd+bwd"], rows))
    print()
    added = t["guarded_fwd_bwd"] - base
    print(f"guard inside a forward+backward: {added * 1000:+.1f} ms ({added / base:+.1%}); "
          f"guard alone: {t['guard_alone'] * 1000:.1f} ms ({t['guard_alone'] / base:.2%} of fwd+bwd)")
    print(f"audit / fwd+bwd: {t['audit'] / base:.2f}; deepcopy / guard alone: {t['deepcopy'] / t['guard_alone']:.0f}x")
    small(opts, guarded)
    print(f"machine at the end: {C.machine()}")


def small(opts, guarded) -> None:
    """The guard alone against the forward+backward of the small models of the overhead benchmark.

    These take milliseconds, so on a loaded machine a single lost time slice (about 12 ms
    here) decides a wall-clock median; the table gives the process CPU time too, which a
    wait for the CPU does not count (torch runs one thread)."""
    names = [n for n in opts.small.split(",") if n]
    if not names:
        return
    repeats = max(opts.repeats, 15)
    rows = []
    for name in names:
        model, inputs = C.build(name)

        def guard_alone(model=model, inputs=inputs):
            with guarded(model, 0, inputs):
                pass

        fns = {"fwd_bwd": C.workload("fwd_bwd", model, inputs), "guard": guard_alone}
        wall = C.interleaved_medians(fns, repeats)
        cpu = _cpu_medians(fns, repeats)
        rows.append([name, len(list(model.modules())), C.ms(wall["fwd_bwd"]), C.ms(wall["guard"]),
                     f"{wall['guard'] / wall['fwd_bwd']:.3f}", C.ms(cpu["fwd_bwd"]), C.ms(cpu["guard"]),
                     f"{cpu['guard'] / cpu['fwd_bwd']:.3f}"])
    print()
    print(f"The guard alone on the small models, median of {repeats} runs, milliseconds (wall clock, then CPU time).")
    print()
    print(C.table(["model", "modules", "fwd+bwd", "guard alone", "guard / fwd+bwd", "fwd+bwd CPU", "guard CPU",
                   "guard / fwd+bwd CPU"], rows))


def _cpu_medians(fns, repeats: int):
    """Like ``_common.interleaved_medians``, in process CPU time."""
    import statistics
    import time

    samples = {k: [] for k in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            start = time.process_time()
            fn()
            samples[key].append(time.process_time() - start)
    return {k: statistics.median(v) for k, v in samples.items()}


if __name__ == "__main__":
    main()
