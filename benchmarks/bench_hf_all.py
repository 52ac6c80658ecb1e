"""Every model type of transformers' auto mappings, shrunk, built at default init and audited.

    python benchmarks/bench_hf_all.py [--types llama,clip,...] [--first N] [--start K]
                                      [--time-limit 60] [--memory-gib 6] [--batch 2]
                                      [--out benchmarks/results/hf_all.jsonl] [--memory TYPE,...]

For each model type that has a model class (``MODEL_MAPPING_NAMES``, else the first task mapping
that names one), a child process (``--child TYPE``), under ``RLIMIT_AS`` of ``--memory-gib`` and a
wall-clock limit of ``--time-limit`` seconds, offline (``HF_HUB_OFFLINE=1``):

* builds the class from its default config with the sizes shrunk (``--sizes real``: the depth
  only, widths and vocabularies as configured), in the config and in every
  sub-config (``text_config``, ``vision_config``, ``encoder``, ...): widths to 64, layers to 2,
  heads to 4, feed-forward widths to 128, head widths to 16 (rotary and low-rank widths within them);
  a size is only ever made smaller; a hybrid keeps one attention layer among its two;
* infers the probe inputs with initlint's own inference (:func:`initlint.inputs.load.infer_inputs`,
  what ``initlint.audit(model)`` and ``initlint check`` use without example inputs);
* runs ``initlint.audit(model, batch_size=--batch)`` with every rule; where the audit fails, a plain
  training-mode forward on the same inputs tells a model that refuses them (``plain_forward``) from
  an audit that fails where the model runs;
* where the shrinking broke the model (the shrunk config does not build, or a plain forward refuses
  the inputs too), runs the type again at its real widths, the depth cut to 2 (``--fallback real``,
  the default; each record's ``sizes`` says which config it audited).

Each type gives one JSON line in ``--out``; a summary follows on stdout: built, inputs inferred,
audited, audit errors, rule crashes (IL000), clean, loud (a warning or an error), and the
codes of the loud findings, and the errors split into models whose plain forward refuses the
inferred inputs and audits that failed where the model runs. ``--memory TYPE,...`` instead measures, for each type, the peak
resident memory of a plain training-mode forward+backward on the inferred inputs next to the
audit's, each in a fresh child (the process's ``VmHWM``).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))

WIDTHS = ("hidden_size", "d_model", "n_embd", "embed_dim", "projection_dim", "projection_size", "text_embed_dim", "vision_embed_dim")
LAYERS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers", "decoder_layers",
          "num_encoder_layers", "num_decoder_layers", "depth", "vision_layers", "text_layers")
HEADS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
         "decoder_attention_heads", "num_key_value_heads", "num_kv_heads")
FFN = ("intermediate_size", "d_ff", "encoder_ffn_dim", "decoder_ffn_dim", "ffn_dim", "n_inner", "d_inner")
HEAD_DIMS = ("head_dim", "d_kv", "d_head", "attention_head_dim", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
             "linear_head_dim")
ROTARY = (("rotary_dim", 8), ("qk_head_dim", 32), ("kv_lora_rank", 32), ("q_lora_rank", 32))  # within a head of 16
TARGETS = ([(k, 64) for k in WIDTHS] + [(k, 2) for k in LAYERS] + [(k, 4) for k in HEADS]
           + [(k, 128) for k in FFN] + [(k, 16) for k in HEAD_DIMS] + list(ROTARY))
LIST_TARGETS = [("depths", 2), ("num_heads", 4), ("num_attention_heads", 4)]


# ------------------------------------------------------------------ the model types
def model_types() -> List[Tuple[str, str]]:
    """(model type, class name) for every type with a model class, in mapping order."""
    from transformers.models.auto import modeling_auto as ma

    out: Dict[str, str] = {}
    mappings = [ma.MODEL_MAPPING_NAMES] + [getattr(ma, n) for n in sorted(dir(ma))
                                           if n.endswith("_MAPPING_NAMES") and n != "MODEL_MAPPING_NAMES"
                                           and isinstance(getattr(ma, n), dict)]
    for mapping in mappings:
        for kind, names in mapping.items():
            name = names[0] if isinstance(names, (tuple, list)) else names
            if kind not in out and isinstance(name, str) and not name.endswith("Config"):
                out[kind] = name
    out["encoder-decoder"] = "EncoderDecoderModel"  # its mapping names the config
    return list(out.items())


def shrink(config: Any, seen: Optional[set] = None, sizes: str = "shrunk") -> None:
    """Make the config's sizes small, in place, sub-configs included (a size is never raised).

    ``sizes="real"`` cuts the depth only (layers and per-stage depths to 2): widths, heads,
    feed-forward widths and vocabularies stay the default config's. A backbone keeps the layers (or
    stages) up to the deepest its ``out_indices`` name, which a head reads (Depth Anything's four, ConvNeXt's
    last stage).
    """
    from transformers import PretrainedConfig

    seen = set() if seen is None else seen
    if id(config) in seen:
        return
    seen.add(id(config))
    list_targets = LIST_TARGETS if sizes == "shrunk" else LIST_TARGETS[:1]
    targets = TARGETS if sizes == "shrunk" else [(k, 2) for k in LAYERS]
    for key, target in list_targets:  # per-stage sizes (Swin's depths and heads)
        value = getattr(config, key, None)
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
            try:
                setattr(config, key, type(value)(min(v, target) for v in value))
            except Exception:  # noqa: BLE001
                pass
    indices = getattr(config, "out_indices", None)  # a backbone: the layers (or stages) its head reads stay
    deepest = max(indices) if isinstance(indices, (list, tuple)) and indices and all(
        isinstance(i, int) and not isinstance(i, bool) for i in indices) else 0
    widths = getattr(config, "hidden_sizes", None)
    stages = len(widths) if isinstance(widths, (list, tuple)) else None
    for key, target in targets:
        if key in LAYERS:
            target = max(target, deepest)
        value = getattr(config, key, None)
        if key in LAYERS and value == stages:
            continue  # a count of stages, one per entry of hidden_sizes (Muse Spark's audio encoder)
        if isinstance(value, int) and not isinstance(value, bool) and value > target:
            try:
                setattr(config, key, target)
            except Exception:  # noqa: BLE001
                pass  # a derived property: the size it derives from is shrunk instead
    _keep_attention(config)
    for key in list(getattr(config, "sub_configs", {}) or {}) + ["encoder", "decoder"]:
        sub = getattr(config, key, None)
        if isinstance(sub, PretrainedConfig):
            shrink(sub, seen, sizes)
    qformer, vision = getattr(config, "qformer_config", None), getattr(config, "vision_config", None)
    if isinstance(getattr(qformer, "encoder_hidden_size", None), int) and \
            isinstance(getattr(vision, "hidden_size", None), int):  # BLIP-2's Q-Former reads the vision tower's width
        qformer.encoder_hidden_size = vision.hidden_size


def _fit_sections(model: Any) -> None:
    """Multimodal rotary sections (Qwen2-VL's and GLM-4V's ``mrope_section``: the rotary half-width split into
    time, height and width; the model code's default when the config names none) shrink with the head: each
    rotary module's sections are scaled to sum to its ``inv_freq``'s length."""
    for module in model.modules():
        sections, inv = getattr(module, "mrope_section", None), getattr(module, "inv_freq", None)
        if not (isinstance(sections, (list, tuple)) and sections and inv is not None) or sum(sections) == inv.numel() \
                or inv.numel() < len(sections):
            continue
        ratio = inv.numel() / sum(sections)
        cut = [max(1, int(v * ratio)) for v in sections]
        cut[0] += inv.numel() - sum(cut)  # the first section takes the rounding
        module.mrope_section = type(sections)(cut)


PER_LAYER = ("layer_types", "layers_block_type", "mlp_layer_types", "block_types")


def _keep_attention(config: Any, depth: int = 2) -> None:
    """A hybrid cut to ``depth`` layers keeps one attention layer beside its other kind.

    Cut to its first two layers, a hybrid whose attention comes every fourth layer or later would
    keep linear-attention (or recurrent, or convolution) layers only, whose cache transformers then
    refuses: a plain forward fails. The per-layer lists keep their first layer and their first
    attention layer; the period-and-offset and index forms are set to put attention at layer 1.
    """
    for name in ("layer_types", "layers_block_type", "block_types"):  # a cycle (block_types) or one per layer
        kinds = getattr(config, name, None)
        if not (isinstance(kinds, (list, tuple)) and len(kinds) > depth and all(isinstance(k, str) for k in kinds)):
            continue
        attention = sorted((i for i, k in enumerate(kinds) if k != kinds[0] and ("attention" in k or k == "hybrid")
                            and "linear" not in k), key=lambda i: "full" not in kinds[i])  # full attention first
        keep = [0, attention[0]] if attention else list(range(depth))
        for key in PER_LAYER:
            value = getattr(config, key, None)
            if isinstance(value, (list, tuple)) and len(value) == len(kinds):
                try:
                    setattr(config, key, type(value)(value[i] for i in keep))
                except Exception:  # noqa: BLE001 - derived (recurrent Gemma's layer_types cycle its block_types)
                    pass
    for key, value in (("attn_layer_period", 2), ("attn_layer_offset", 1)):
        if isinstance(getattr(config, key, None), int) and getattr(config, key) > value:
            setattr(config, key, value)
    for key in ("attn_layer_indices", "hybrid_layer_ids"):
        if hasattr(config, key) and not [i for i in (getattr(config, key) or []) if i < depth]:
            try:
                setattr(config, key, [depth - 1])
            except Exception:  # noqa: BLE001
                pass


def build(kind: str, cls_name: str, sizes: str = "shrunk") -> Any:
    import torch
    import transformers
    from transformers import CONFIG_MAPPING

    if kind == "encoder-decoder":  # a composite config: BERT as encoder and as decoder
        from transformers import BertConfig, EncoderDecoderConfig

        config = EncoderDecoderConfig.from_encoder_decoder_configs(BertConfig(), BertConfig())
    else:
        config = CONFIG_MAPPING[kind]()
        if getattr(config, "prediction_length", 0) is None:  # a forecaster's horizon, which its default leaves
            config = CONFIG_MAPPING[kind](prediction_length=24)  # unset (and its context with it)
    shrink(config, sizes=sizes)
    cls = getattr(transformers, cls_name)
    torch.manual_seed(0)
    model = cls(config)
    if sizes == "shrunk":
        _fit_sections(model)
    return model


# ------------------------------------------------------------------ one type, in a child
def child(kind: str, cls_name: str, batch: int, mode: str, sizes: str = "shrunk") -> Dict[str, Any]:
    import torch

    from initlint.inputs.load import infer_inputs

    rec: Dict[str, Any] = {"type": kind, "class": cls_name, "built": False}
    t0 = time.perf_counter()
    try:
        model = build(kind, cls_name, sizes)
    except Exception as exc:  # noqa: BLE001 - a type the harness cannot build is a count, not a stop
        rec["build_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        return rec
    rec["built"] = True
    rec["params"] = sum(p.numel() for p in model.parameters())
    try:
        _, kwargs = infer_inputs(model, batch, 0)
        rec["inputs_inferred"] = True
        rec["inputs"] = {k: list(v.shape) for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    except Exception as exc:  # noqa: BLE001
        rec["inputs_inferred"] = False
        rec["infer_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        return rec
    if mode == "forward":
        return _forward_peak(rec, model, kwargs)
    if mode == "audit-peak":
        _reset_peak()
    import initlint

    try:
        report = initlint.audit(model, batch_size=batch)
    except Exception as exc:  # noqa: BLE001 - initlint's LoadError on a forward that refused the inputs
        rec["audited"] = False
        rec["audit_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        rec["plain_forward"] = _plain_forward(model, kwargs)
        return rec
    rec["seconds"] = round(time.perf_counter() - t0, 2)
    rec["peak_kb"] = _status_kb("VmHWM")
    rec["audited"] = report.error is None
    if report.error:
        rec["audit_error"] = report.error[:400]
    rec["findings"] = [[f.code, f.severity, f.module, f.message[:200]] for f in report.findings]
    rec["notes"] = [n[:200] for n in report.notes]
    return rec


def _plain_forward(model: Any, kwargs: Dict[str, Any]) -> str:
    """``"ok"`` when a plain training-mode forward, without initlint, accepts the inputs; else its error."""
    import torch

    model.train()
    try:
        with torch.no_grad():
            model(**kwargs)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return "ok"


def _forward_peak(rec: Dict[str, Any], model: Any, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """A plain training-mode forward and a backward from every floating output, its peak resident memory."""
    import torch

    model.train()
    _reset_peak()
    out = model(**kwargs)
    leaves = [t for t in _tensors(out) if t.requires_grad and t.is_floating_point()]
    if leaves:
        torch.autograd.backward(leaves, [torch.randn_like(t) for t in leaves])
    rec["forward_peak_kb"] = _status_kb("VmHWM")
    return rec


def _tensors(obj: Any) -> List[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict) or hasattr(obj, "values") and callable(obj.values):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # VmHWM back to the current VmRSS


def run_type(kind: str, cls_name: str, args: argparse.Namespace) -> Dict[str, Any]:
    """One type at ``--sizes``; where the shrinking broke the model, again with its real widths.

    The shrinking broke it when the shrunk config does not build (for a reason other than a missing
    library), or when a plain forward refuses the inferred inputs too. Then the depth-cut real config
    (``sizes="real"``) runs; its record replaces the shrunk one where it audits, with the shrunk
    error kept in ``shrunk_error``. Otherwise the shrunk record stays, with ``real`` saying what
    the real config did.
    """
    rec = run_child(kind, cls_name, args)
    rec["sizes"] = args.sizes
    if args.sizes != "shrunk" or args.fallback != "real" or not _shrinking_broke(rec):
        return rec
    real = run_child(kind, cls_name, args, sizes="real")
    real["sizes"] = "real"
    why = rec.get("build_error") or rec.get("infer_error") or rec.get("audit_error", "")
    if real.get("audited"):
        real["shrunk_error"] = why[:300]
        return real
    rec["real"] = (real.get("killed") or real.get("build_error") or real.get("infer_error")
                   or real.get("audit_error") or "")[:300]
    return rec


def _shrinking_broke(rec: Dict[str, Any]) -> bool:
    if "killed" in rec:
        return False  # a limit: the real widths need more
    error = rec.get("build_error", "")
    if error:
        return not error.startswith(("ImportError", "ModuleNotFoundError"))
    return bool(rec.get("infer_error")) or rec.get("plain_forward", "ok") != "ok"


def run_child(kind: str, cls_name: str, args: argparse.Namespace, mode: str = "audit",
              sizes: Optional[str] = None) -> Dict[str, Any]:
    limit = int(args.memory_gib * 2 ** 30)

    def limits() -> None:
        os.nice(10)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               INITLINT_NO_PROGRESS="1", TOKENIZERS_PARALLELISM="false")
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind, cls_name,
                               "--batch", str(args.batch), "--mode", mode, "--sizes", sizes or args.sizes],
                              capture_output=True, text=True, env=env, timeout=args.time_limit, preexec_fn=limits)
    except subprocess.TimeoutExpired:
        return {"type": kind, "class": cls_name, "killed": f"time limit {args.time_limit:g} s"}
    wall = round(time.perf_counter() - t0, 2)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode == 0 and lines:
        rec = json.loads(lines[-1])
        rec["wall"] = wall
        return rec
    tail = proc.stderr.strip().splitlines()[-3:]
    memory = any("MemoryError" in ln or "std::bad_alloc" in ln or "DefaultCPUAllocator" in ln for ln in tail)
    why = f"memory limit {args.memory_gib:g} GiB" if memory or proc.returncode < 0 else f"exit {proc.returncode}"
    return {"type": kind, "class": cls_name, "killed": why, "tail": " | ".join(tail)[-400:], "wall": wall}


# ------------------------------------------------------------------ summary
def summary(records: List[Dict[str, Any]]) -> Dict[str, Any]:
    built = [r for r in records if r.get("built")]
    inferred = [r for r in built if r.get("inputs_inferred")]
    audited = [r for r in inferred if r.get("audited")]
    errors = [r for r in inferred if not r.get("audited")] + [r for r in records if "killed" in r]
    refused = [r for r in errors if r.get("plain_forward", "ok") != "ok"]
    crashes = [r for r in audited if any(f[0] == "IL000" for f in r["findings"])]
    loud = [r for r in audited if any(f[1] != "info" for f in r["findings"])]
    codes = Counter(f[0] for r in loud for f in r["findings"] if f[1] != "info")
    return {"types": len(records), "built": len(built) + sum("killed" in r for r in records),
            "inputs_inferred": len(inferred), "audited": len(audited), "errors": len(errors),
            "forward_refuses_inputs": len(refused), "killed": sum("killed" in r for r in records),
            "audit_errors_where_forward_runs": sorted(r["type"] for r in errors
                                                      if "killed" not in r and r not in refused),
            "real_widths": sum(r.get("sizes") == "real" for r in records) if any(
                r.get("sizes") == "shrunk" for r in records) else None,
            "rule_crashes": len(crashes), "clean": len(audited) - len(loud), "loud": len(loud),
            "loud_codes": dict(codes.most_common()),
            "not_inferred": sorted(r["type"] for r in built if not r.get("inputs_inferred")),
            "error_types": sorted(r["type"] for r in errors), "loud_types": sorted(r["type"] for r in loud)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=2, metavar=("TYPE", "CLASS"))
    ap.add_argument("--mode", default="audit", choices=["audit", "forward", "audit-peak"])
    ap.add_argument("--types", default="")
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--memory-gib", type=float, default=6.0)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--sizes", default="shrunk", choices=["shrunk", "real"],
                    help="real: the default config's widths and vocabularies, depth cut to 2")
    ap.add_argument("--fallback", default="real", choices=["real", "none"],
                    help="real: a type whose shrunk config does not build or run runs again at its real widths")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "hf_all.jsonl"))
    ap.add_argument("--memory", default="", help="types whose forward and audit peaks to compare")
    ap.add_argument("--summary-of", default="", help="print the summary of an existing JSON-lines file")
    args = ap.parse_args()
    if args.child:
        import logging
        import warnings

        warnings.filterwarnings("ignore")
        logging.disable(logging.WARNING)
        import torch

        torch.set_num_threads(1)
        print(json.dumps(child(args.child[0], args.child[1], args.batch, args.mode, args.sizes)))
        return
    if args.summary_of:
        with open(args.summary_of) as fh:
            print(json.dumps(summary([json.loads(ln) for ln in fh if ln.strip()]), indent=1))
        return
    types = model_types()
    if args.memory:
        wanted = dict(types)
        for kind in args.memory.split(","):
            fwd = run_child(kind, wanted[kind], args, "forward")
            aud = run_child(kind, wanted[kind], args, "audit-peak")
            print(json.dumps({"type": kind, "inputs": fwd.get("inputs"),
                              "forward_peak_mib": round(fwd.get("forward_peak_kb", 0) / 1024),
                              "audit_peak_mib": round(aud.get("peak_kb", 0) / 1024),
                              "forward": fwd.get("killed") or fwd.get("infer_error") or "ok",
                              "audit": aud.get("killed") or aud.get("audit_error") or "ok"}), flush=True)
        return
    if args.types:
        named = dict(types)
        types = [(t, named[t]) for t in args.types.split(",") if t in named]  # in the order given
    types = types[args.start:]
    if args.first:
        types = types[:args.first]
    records = []
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as fh:
        for kind, cls_name in types:
            rec = run_type(kind, cls_name, args)
            records.append(rec)
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            loud = sorted({f[0] for f in rec.get("findings", []) if f[1] != "info"})
            state = rec.get("killed") or rec.get("build_error", "")[:60] or rec.get("infer_error", "")[:80] \
                or rec.get("audit_error", "")[:80] or (",".join(loud) if loud else "clean")
            print(f"{kind:32s} {rec.get('wall', 0):6.1f}s  {rec.get('sizes', ''):6s}  {state}", flush=True)
    print(json.dumps(summary(records), indent=1))


if __name__ == "__main__":
    main()
