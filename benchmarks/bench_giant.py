"""A model too big to build: the streamed audit of a Llama-3-8B-shaped config on the meta device.

    python benchmarks/bench_giant.py [--threads 2] [--layers 32] [--hidden 4096] [--tokens 32] [--device cpu]

The config is Llama 3 8B's (hidden 4096, 32 layers, intermediate 14336, 32 heads, 8 key-value
heads, vocabulary 128256: 8.03e9 parameters, 32.1 GB in float32), built under
``torch.device("meta")`` and audited with ``initlint.audit(model, input_ids, device="cpu")``
and a probe of batch 1 x 32 tokens, at Hugging Face's default init. The script prints the
wall time of the audit, the peak resident memory of the process (``ru_maxrss``; it never
held the whole model) and the findings. Smaller shapes (``--layers 2 --hidden 512``) check
the script in seconds. It runs once, not repeated: a full run draws 16e9 random numbers.

Llama 3 70B's shape: ``--layers 80 --hidden 8192 --intermediate 28672 --heads 64`` (70.55e9 parameters,
282 GB in float32). ``--breakdown`` adds the wall time of the audit's stages (:class:`_Stages`);
``--profile FILE`` writes a cProfile of the audit (the calling thread's only). ``--device cuda`` streams
the blocks onto the GPU instead (the model stays on meta) and prints the GPU's peak memory too.
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=14336)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--profile", default="", help="write a cProfile of the audit to this file")
    parser.add_argument("--breakdown", action="store_true", help="wall time of the audit's stages")
    parser.add_argument("--device", default="cpu", help="where the blocks are streamed to (default cpu)")
    opts = parser.parse_args()
    # Threads that lose their core wait passively instead of spinning at OpenMP barriers (a shared machine).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    import torch
    import transformers

    import initlint

    torch.set_num_threads(opts.threads)
    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(
        hidden_size=opts.hidden, num_hidden_layers=opts.layers, intermediate_size=opts.intermediate,
        num_attention_heads=opts.heads, num_key_value_heads=8, vocab_size=opts.vocab, max_position_embeddings=8192,
        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, opts.vocab, (1, opts.tokens), generator=torch.Generator().manual_seed(0))

    on_gpu = torch.device(opts.device).type == "cuda"
    card = f", {torch.cuda.get_device_name(opts.device)}" if on_gpu else ""
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads "
          f"{opts.threads}, load average before {os.getloadavg()[0]:.1f}; device {opts.device}{card}, "
          f"torch {torch.__version__}")
    if on_gpu:
        torch.cuda.reset_peak_memory_stats(opts.device)
    print(f"code: {_revision()}")
    print(f"model: LlamaForCausalLM, {opts.layers} layers x {opts.hidden}, vocabulary {opts.vocab}: "
          f"{params / 1e9:.2f}e9 parameters, {params * 4 / 1e9:.1f} GB in float32, on the meta device")
    rss_before = _peak_gb()
    start = time.perf_counter()
    last = [start]

    def progress(event: "initlint.scale.stream.BlockProgress") -> None:
        now = time.perf_counter()
        if now - last[0] >= 30 or event.index == event.total:
            left = f", about {event.remaining:.0f} s left" if event.remaining is not None else ""
            print(f"  {event.phase} {event.index}/{event.total} {event.block} at {event.seconds:.0f} s{left}",
                  flush=True)
            last[0] = now

    stages = _Stages(synchronise=on_gpu) if opts.breakdown else None
    profiler = None
    if opts.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    if stages is not None:
        with stages.installed():
            report = initlint.audit(model, {"input_ids": ids}, device=opts.device, progress=progress)
    else:
        report = initlint.audit(model, {"input_ids": ids}, device=opts.device, progress=progress)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(opts.profile)
    wall = time.perf_counter() - start
    goals = "900 s, 12 GiB: the 70B shape" if params > 30e9 else "600 s, 6 GB: the 8B shape"
    print(f"audit: {wall:.0f} s wall, peak RSS {_peak_gb():.2f} GB ({rss_before:.2f} GB before the audit; goals "
          f"{goals}), load average after {os.getloadavg()[0]:.1f}")
    if on_gpu:
        print(f"GPU peak memory: {torch.cuda.max_memory_allocated(opts.device) / 2**30:.2f} GiB allocated, "
              f"{torch.cuda.max_memory_reserved(opts.device) / 2**30:.2f} GiB reserved")
    if stages is not None:
        stages.report(wall)
    print(f"still on the meta device: {all(p.device.type == 'meta' for p in model.parameters())}")
    for note in report.notes:
        print(f"note: {note}")
    print(f"findings: {len(report.findings)}")
    for f in report.findings:
        print(f"  {f.code} {f.module}: {f.message}")


def _stages_base():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_real_size import Stages  # its timing wrapper: each stage without the stages inside it

    return Stages


class _Stages(_stages_base()):
    """Wall time of the streamed audit's stages, each without the stages inside it:

    * ``init draw``: a block's init steps (the declared init's fills), for the forward and again for the backward;
    * ``drawn stats``: the statistics of what the init gave each parameter, once (``Materialiser._record``);
    * ``forward``: the blocks' forward with the per-op statistics;
    * ``backward``: each block recomputed from its input and differentiated, the gradients' statistics;
    * ``weight stats``: the weights' statistics for the rules (``StreamProbe._param_stats``);
    * ``rules``: every rule (IL014 compares the drawn statistics with the declared init's);
    * ``other``: the rest (capture, copies, the report).
    """

    def __init__(self, synchronise: bool = False) -> None:
        super().__init__()
        self.seconds = {k: 0.0 for k in ("init draw", "drawn stats", "forward", "backward", "weight stats", "rules")}
        self.synchronise = synchronise  # on a GPU: each stage waits for its kernels, so its time is its own

    def _timed(self, stage, fn, subtract_nested=False):
        if not self.synchronise:
            return super()._timed(stage, fn, subtract_nested)
        import torch

        def synchronised(*args, **kwargs):
            torch.cuda.synchronize()
            try:
                return fn(*args, **kwargs)
            finally:
                torch.cuda.synchronize()
        return super()._timed(stage, synchronised, subtract_nested)

    def installed(self):
        import contextlib

        from initlint import api
        from initlint.scale import stream

        patches = [(stream.Materialiser, "_run_steps", "init draw"), (stream.Materialiser, "_record", "drawn stats"),
                   (stream.StreamProbe, "call", "forward"), (stream.StreamProbe, "recompute", "backward"),
                   (stream.StreamProbe, "_param_stats", "weight stats"), (api, "_run_rules", "rules")]

        @contextlib.contextmanager
        def installing():
            saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
            try:
                for owner, name, stage in patches:
                    setattr(owner, name, self._timed(stage, getattr(owner, name), True))
                yield
            finally:
                for owner, name, fn in saved:
                    setattr(owner, name, fn)
        return installing()

    def report(self, wall: float) -> None:
        rows = dict(self.seconds, other=wall - sum(self.seconds.values()))
        print("stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in rows.items()))


def _peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kilobytes on Linux


def _revision() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "?"
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
