"""Where a forward-only audit spends its time, next to torchinfo, stage by stage.

    python benchmarks/bench_breakdown.py [--repeats 7] [--threads 1] [--models mlp50,convbn,...]

For each model of ``_common.MODELS``, one process measures the median wall time, after a
warm-up round and with the workloads taking turns, of cumulative stages of the forward-only
audit (``select=`` the rules that need no backward probe):

* ``eval fwd``: the model's own forward in eval mode under ``no_grad`` (what torchinfo runs);
* ``train fwd``: the same in train mode with dropout off, as the probe must run it
  (BatchNorm normalises with the batch's statistics in training, which is the signal the
  rules judge; dropout is turned off by the ``TorchFunctionMode`` the probe uses for it);
* ``torchinfo``: ``torchinfo.summary(model, input_data=batch, verbose=0)``;
* ``capture``: building the graph (an fx trace, or a failed fx trace and the runtime
  capture's setup);
* ``+ fwd``: capture, then the probe's forward through it with an observer that does nothing;
* ``+ op stats``: the same with the statistics of every op's output, moved to the host;
* ``+ param stats``: the whole probe (``run_probe``), adding the weights' statistics;
* ``audit fwd``: ``initlint.audit(model, batch, select=forward rules)``: adds the rules,
  the report and restoring the model.

``capture`` + ``+ fwd`` is the least a graph-level audit pays before it computes anything:
when it alone exceeds torchinfo, no statistics code can bring the audit under torchinfo.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402


def stages(model, inputs):
    import torch
    import torchinfo

    import initlint
    from initlint.capture import capture
    from initlint.capture.base import DropoutOff
    from initlint.probe.guard import guarded as preserved
    from initlint.probe.run import ProbeResult, StatsObserver, _Collector, run_probe

    args, kwargs = inputs
    select = C.forward_rules()

    def eval_fwd():
        flags = [(m, m.training) for m in model.modules()]
        model.eval()
        try:
            with torch.no_grad():
                model(*args, **kwargs)
        finally:
            for m, flag in flags:
                m.training = flag

    def train_fwd():
        with preserved(model, 0), torch.no_grad(), DropoutOff():
            model(*args, **kwargs)

    def bare():
        with preserved(model, 0), torch.no_grad():
            capture(model).run(args, kwargs, lambda op, value: None)

    def op_stats():
        with preserved(model, 0), torch.no_grad():
            cap, collector = capture(model), _Collector()
            cap.run(args, kwargs, StatsObserver(lambda: cap.graph, collector))
            collector.finish(ProbeResult())

    def probe():
        with preserved(model, 0):
            run_probe(capture(model), args, kwargs, backward=False)

    return {
        "eval fwd": eval_fwd,
        "train fwd": train_fwd,
        "torchinfo": lambda: torchinfo.summary(model, input_data=C.example(inputs), verbose=0),
        "capture": lambda: capture(model),
        "+ fwd": bare,
        "+ op stats": op_stats,
        "+ param stats": probe,
        "audit fwd": lambda: initlint.audit(model, C.example(inputs), select=select),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--models", default=",".join(C.MODELS))
    parser.add_argument("--threads", type=int, default=1)
    opts = parser.parse_args()
    C.set_threads(opts.threads)
    print(f"machine: {C.machine()}")
    print(f"code: {C.revision()}")
    rows = []
    for name in [n for n in opts.models.split(",") if n]:
        model, inputs = C.build(name)
        t = C.interleaved_medians(stages(model, inputs), opts.repeats)
        floor = t["+ fwd"]
        rows.append([name, *(C.ms(v) for v in t.values()), f"{floor / t['torchinfo']:.2f}",
                     f"{t['audit fwd'] / t['torchinfo']:.2f}"])
        print(f"  {name}: " + ", ".join(f"{k} {C.ms(v)} ms" for k, v in t.items()), flush=True)
        del model, inputs
    print()
    print(f"Median of {opts.repeats} runs after a warm-up, milliseconds; the stages are cumulative.")
    print()
    print(C.table(["model", "eval fwd", "train fwd", "torchinfo", "capture", "+ fwd", "+ op stats",
                   "+ param stats", "audit fwd", "(capture + fwd) / torchinfo", "audit fwd / torchinfo"], rows))
    print(f"machine at the end: {C.machine()}")


if __name__ == "__main__":
    main()
