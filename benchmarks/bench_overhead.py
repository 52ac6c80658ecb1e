"""What an audit costs next to the model's own forward+backward, and next to torchinfo.

    python benchmarks/bench_overhead.py [--repeats 5] [--threads 1] [--models mlp50,convbn,...|small] [--no-memory]
                                        [--clock wall|process]

For each model of the set in ``_common.MODELS`` (a 50-layer ReLU MLP, a conv-BN net, a
4-layer BERT encoder and a 4-layer GPT-2 decoder built from their configs, and a model
with a data-dependent branch that only the runtime capture handles), one process measures
the median wall time, after one warm-up round, of:

* ``fwd+bwd``: a training-mode forward of the probe batch and ``torch.autograd.grad`` of a
  random cotangent with respect to every parameter (what one training step costs, minus
  the optimizer);
* ``audit``: ``initlint.audit(model, batch)`` with every rule;
* ``audit fwd``: the same with ``select=`` the rules whose ``needs`` do not include
  ``gradients`` (no backward probe);
* ``torchinfo``: ``torchinfo.summary(model, input_data=batch, verbose=0)`` (an eval-mode,
  no-grad forward with hooks on every module).

``--models small`` takes the small models where the audit's fixed cost shows most (``_common.SMALL``:
a 50-layer MLP of width 256 at batch 64, a 4-layer BERT of width 256 on 4 x 64 tokens, the conv-BN net).

The four take turns within each repeat, so a background job slows them alike. torch runs
one intra-op thread unless ``--threads`` says otherwise (see ``_common.set_threads``); the
audit's own overhead is single-threaded Python, so on an idle machine with two threads the
model's share shrinks and the ratios come out somewhat higher than at one thread.

Peak memory. On CPU, ``tracemalloc`` does not see torch's allocations and torch keeps no
CPU allocator statistics, so each measurement runs in a fresh subprocess: it builds the
model and batch, runs the workload once (lazy imports, code generation and caches are
one-off costs), writes ``5`` to ``/proc/self/clear_refs`` (which resets the kernel's
high-water mark ``VmHWM`` to the current resident set), runs the workload once more and
reports ``VmHWM - VmRSS`` at the reset: the extra resident memory at the peak of the call,
tensors and Python objects alike. The subprocess runs with ``MALLOC_MMAP_THRESHOLD_=131072``:
every block of 128 KiB or more (every tensor but the smallest) is then its own mapping,
returned to the kernel when freed, so the warm-up cannot leave memory resident for the
measured run to reuse unseen. (With glibc's default dynamic threshold it does: the audit of
the BERT model then showed +128 MiB instead of +291 MiB.) Smaller blocks kept in glibc's
arenas can still be reused without raising the mark, which understates both sides alike by
little. The ratio compares the audit's peak with plain fwd+bwd.

Goals: audit <= 1.5x fwd+bwd (median over the set), forward-only audit no slower than
torchinfo, peak memory <= 1.3x fwd+bwd.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default=",".join(n for n in C.MODELS if n not in C.REAL_SIZE + C.SMALL_ONLY))
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=sorted(C.CLOCKS), default="wall",
                        help="wall time, or this process's CPU time (steady on a shared machine)")
    opts = parser.parse_args()
    C.set_threads(opts.threads)
    C.set_clock(opts.clock)
    names = list(C.SMALL) if opts.models == "small" else [n for n in opts.models.split(",") if n]

    import initlint

    print(f"machine: {C.machine()}")
    print(f"code: {C.revision()}")
    print(f"forward rules (audit fwd): {', '.join(C.forward_rules())}; gradient rules: "
          f"{', '.join(C.gradient_rules()) or 'none'}")
    try:
        import torchinfo  # noqa: F401
        kinds = ("fwd_bwd", "audit", "audit_fwd", "torchinfo")
    except ImportError:
        kinds = ("fwd_bwd", "audit", "audit_fwd")
        print("torchinfo is not installed: its column is left out")
    rows, mem_rows = [], []
    ratios_audit, ratios_fwd, ratios_mem = [], [], []
    for name in names:
        model, inputs = C.build(name)
        report = initlint.audit(model, C.example(inputs))
        fns = {kind: C.workload(kind, model, inputs) for kind in kinds}
        t = C.interleaved_medians(fns, opts.repeats)
        r_audit = t["audit"] / t["fwd_bwd"]
        r_fwd = t["audit_fwd"] / t["torchinfo"] if "torchinfo" in t else float("nan")
        ratios_audit.append(r_audit)
        ratios_fwd.append(r_fwd)
        rows.append([name, report.capture, C.ms(t["fwd_bwd"]), C.ms(t["audit"]), C.ms(t["audit_fwd"]),
                     C.ms(t["torchinfo"]) if "torchinfo" in t else "", f"{r_audit:.2f}", f"{r_fwd:.2f}"])
        print(f"  {name}: " + ", ".join(f"{k} {C.ms(v)} ms" for k, v in t.items()), flush=True)
        if not opts.no_memory:
            plain = C.peak_rss(os.path.abspath(__file__), name, "fwd_bwd")
            audited = C.peak_rss(os.path.abspath(__file__), name, "audit")
            r_mem = audited["delta_kb"] / max(plain["delta_kb"], 1)
            ratios_mem.append(r_mem)
            mem_rows.append([name, f"{plain['delta_kb'] / 1024:.1f}", f"{audited['delta_kb'] / 1024:.1f}",
                             f"{r_mem:.2f}"])
            print(f"  {name}: peak +{plain['delta_kb'] / 1024:.1f} MiB fwd+bwd, "
                  f"+{audited['delta_kb'] / 1024:.1f} MiB audit", flush=True)
        del model, inputs, fns
    rows.append(["**median**", "", "", "", "", "", f"**{statistics.median(ratios_audit):.2f}**",
                 f"**{statistics.median(ratios_fwd):.2f}**"])
    print()
    print(f"Median of {opts.repeats} runs after a warm-up, milliseconds ({opts.clock} clock).")
    print()
    print(C.table(["model", "capture", "fwd+bwd", "audit", "audit fwd", "torchinfo", "audit / fwd+bwd",
                   "audit fwd / torchinfo"], rows))
    if mem_rows:
        mem_rows.append(["**median**", "", "", f"**{statistics.median(ratios_mem):.2f}**"])
        print()
        print("Peak resident memory above the baseline (MiB), fresh process per cell.")
        print()
        print(C.table(["model", "fwd+bwd", "audit", "audit / fwd+bwd"], mem_rows))
    print()
    verdict = [("audit <= 1.5x fwd+bwd (median)", statistics.median(ratios_audit) <= 1.5)]
    if "torchinfo" in kinds:
        verdict.append(("forward-only audit <= torchinfo (median)", statistics.median(ratios_fwd) <= 1.0))
    if ratios_mem:
        verdict.append(("peak memory <= 1.3x fwd+bwd (median)", statistics.median(ratios_mem) <= 1.3))
    if names == list(C.SMALL):
        verdict.append(("small models: audit <= 1.3x fwd+bwd (median)", statistics.median(ratios_audit) <= 1.3))
        verdict.append(("small models: the 50-layer MLP <= 2x", ratios_audit[0] <= 2.0))
    for goal, met in verdict:
        print(f"goal {goal}: {'met' if met else 'MISSED'}")
    print(f"machine at the end: {C.machine()}")


if __name__ == "__main__":
    if C.maybe_child(sys.argv) is None:
        main()
