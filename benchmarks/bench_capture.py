"""Runtime capture cost relative to a plain forward pass, on the zoo models.

For each model (tiny configs from transformers, built offline, plus torch blocks) and the
same probe batch, in one process:
  forward   plain ``model(**inputs)`` under ``torch.no_grad()``
  capture   the runtime capture recording the graph (module hooks + TorchFunctionMode),
            with an observer that does nothing
  probe     the runtime capture with initlint's statistics observer (what an audit runs)
Times are medians of several repeats after a warm-up; the ratios are what to read (the
machine is shared and noisy).  Run: python benchmarks/bench_capture.py
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from initlint.capture import RuntimeCapture  # noqa: E402
from initlint.capture.base import DropoutOff  # noqa: E402  (the plain forward runs with dropout off too)
from initlint.probe.run import StatsObserver, _Collector  # noqa: E402

REPEATS = 7


def median_time(fn, repeats=REPEATS):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench(name, model, inputs):
    args, kwargs = ((), inputs) if isinstance(inputs, dict) else ((inputs,), {})
    model.train()
    cap = RuntimeCapture(model)

    def plain():
        with torch.no_grad(), DropoutOff():
            model(*args, **kwargs)

    def capture_only():
        with torch.no_grad():
            cap.run(args, kwargs, lambda op, value: None)

    def probe():
        c = _Collector()
        with torch.no_grad():
            cap.run(args, kwargs, StatsObserver(lambda: cap.graph, c))
        result = type("R", (), {"ops": {}, "params": {}, "grads": {}, "logits": None})()
        c.finish(result)

    t_plain, t_cap, t_probe = median_time(plain), median_time(capture_only), median_time(probe)
    return [name, len(cap.graph), f"{t_plain * 1e3:.1f}", f"{t_cap * 1e3:.1f}", f"{t_probe * 1e3:.1f}",
            f"{t_cap / t_plain:.2f}", f"{t_probe / t_plain:.2f}"]


def main():
    import logging

    import transformers as tf
    from tabulate import tabulate

    import test_zoo as zoo

    tf.logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    rows = []
    sizes = {"batch": 8, "length": 64}
    for name in ("gpt2", "bert", "vit", "llama", "t5", "resnet", "wav2vec2", "encoder", "lstm", "gru", "mha"):
        model, inputs = zoo.build(name)
        if inputs is None:
            if name in ("gpt2", "bert", "llama"):
                inputs = {"input_ids": torch.randint(0, 128, (sizes["batch"], sizes["length"]), generator=gen)}
            elif name == "t5":
                pass
            elif name == "vit":
                inputs = {"pixel_values": torch.randn(sizes["batch"], 3, 32, 32, generator=gen)}
            elif name == "resnet":
                inputs = {"pixel_values": torch.randn(sizes["batch"], 3, 64, 64, generator=gen)}
            elif name == "wav2vec2":
                inputs = {"input_values": torch.randn(sizes["batch"], 16000, generator=gen)}
            elif name == "mha":
                x = torch.randn(sizes["batch"], sizes["length"], 64, generator=gen)
                inputs = {"query": x, "key": x, "value": x}
            elif name == "encoder":
                inputs = torch.randn(sizes["batch"], sizes["length"], 64, generator=gen)
            else:
                inputs = torch.randn(sizes["length"], sizes["batch"], 16, generator=gen) if name == "gru" else \
                    torch.randn(sizes["batch"], sizes["length"], 16, generator=gen)
        rows.append(bench(name, model, inputs))
    # the same runtime capture at GPT-2 size (4 layers, n_embd 768), where compute dominates
    big = tf.GPT2Model(tf.GPT2Config(n_layer=4, n_embd=768, n_head=12, bos_token_id=0, eos_token_id=0))
    rows.append(bench("gpt2 4x768", big, {"input_ids": torch.randint(0, 50257, (8, 64), generator=gen)}))
    headers = ["model", "ops", "forward ms", "capture ms", "probe ms", "capture / forward", "probe / forward"]
    print(tabulate(rows, headers=headers, tablefmt="github"))
    ratios = sorted(float(r[5]) for r in rows)
    print(f"\nmedian capture / forward: {statistics.median(ratios):.2f}   "
          f"median probe / forward: {statistics.median(sorted(float(r[6]) for r in rows)):.2f}")


if __name__ == "__main__":
    main()
