"""IL005 signal-drift."""
from __future__ import annotations

import math
from typing import Dict, Iterator, List, Optional, Set, Tuple

import torch.nn as nn

from ..capture import ops as O
from ..capture.graph import Graph, Op
from ..report.findings import Finding
from .base import (AuditContext, Example, RepairPlan, Rule, copies, created_tensor, fmt, fmt_beyond, gate_factor,
                   lsuv_stretch, measured_rms, rescales_only, softmax_gate, starved)
from .il001_init_scale import scale_target

_START_KINDS = O.NORM_KINDS | {"input", "embedding"}
_CARRY = 0.1
"""An input of an addition with less than this fraction of the largest input's scale (1% of its
variance) does not carry the sum."""
_MASK_DOMINANCE = 1e3
"""An addition whose input that is not the signal (a mask, a bias built from created tensors) is more
than this many times the signal's scale is a masking, not the signal: no stretch goes through it."""


# Examples: the rule's documentation and its tests (tests/test_rule_examples.py).
def deep_linear_stack_with_tiny_weights():
    model = nn.Sequential(*[nn.Linear(100, 100) for _ in range(30)])
    for layer in model:
        nn.init.normal_(layer.weight, std=0.01)  # 1/10 of 1/sqrt(100): the signal shrinks 10x per layer
        nn.init.zeros_(layer.bias)
    return model


def deep_linear_stack_at_lecun_init():
    model = nn.Sequential(*[nn.Linear(100, 100) for _ in range(30)])
    for layer in model:
        nn.init.normal_(layer.weight, std=0.1)
        nn.init.zeros_(layer.bias)
    return model


class SignalDrift(Rule):
    """## What it does
    Follows the measured scale (root mean square) of the forward signal through the
    network and flags a signal that explodes or vanishes. The signal is compared with its
    scale where it last started afresh: the model input, an embedding module's output
    (after its own scaling, such as Gemma's ``sqrt(hidden)``), the output of a
    normalisation layer, or a branch gate (below). It is judged where the signal ends: at
    the next normalisation, softmax or attention, or at the model output. A (log-)softmax
    or the addition of a constant shifts the signal without scaling it (the
    log-probabilities of a near-uniform prediction over 33k words are all about
    ``-ln 33278 = -10.4``), so the signal is judged at their input, as it is at the input of an
    addition of tensors that carry no signal to it (a shifted window's mask of -100, a position
    bias computed from a table of coordinates); and the scale of a
    weight layer that feeds a normalisation directly is the norm's to fix (as in IL001):
    the signal is judged at that layer's input. A shrink into a normalisation (or into a product
    whose output reaches one through ops that only rescale it, as a gated delta rule's or a
    state-space scan's products reach their gated RMSNorm) through layers without a bias (or with
    an all-zero one) and activations that are 0 at 0 is a rescaled copy of the signal, which the
    normalisation undoes: it is not judged (as in IL001). A normalisation whose epsilon outweighs its
    input's mean square does not normalise: the signal does not start afresh there, and its scale
    goes on through it. A residual sum that feeds a norm is judged
    itself, whichever operand is written first (SegFormer's ``branch + x`` once had its small
    pre-norm branch judged instead of the sum). What reaches an endpoint through ``exp`` is not
    judged: the exponential's input is a log-domain quantity, not the signal (Mamba2's
    ``exp(cumsum(A * dt))``, whose log-decays of 128 heads reach a scale of 4.7e3 at init), and
    the exponential carries none of it on. A product of two signals (``q @ k^T``, a scan's
    einsum) is small at init when they are unrelated (the cosine of two random vectors is about
    ``1 / sqrt(d)``, and a sequence padded to the chunk of a chunked scan dilutes it further):
    only its growth is judged, not its shrink.
    Into a normalisation, the scale that parameter-free ops of one signal put on the path (a
    constant factor, a Fourier transform) is not counted: no init sets it and the norm undoes
    it (FNet's unnormalised ``LayerNorm(x + fft(x).real)`` is about ``sqrt(tokens x width)``
    times its input, 108x at 16 tokens); on the way to the model output it still counts. An
    addition of a tensor that is not the signal (a mask built from created tensors) and over
    1000x the signal's scale is a masking, not the signal (LongT5's local mask of -1e10 added
    to its position bias): no stretch goes through it. Where such a tensor carries the sum
    otherwise (the signal holds less than 1% of its variance), the sum starts afresh: RF-DETR
    adds a learned offset of scale 0.001 to its proposals' box centres (0.58), and what its
    decoder computes from the sum is judged against 0.58, not against the offset. An
    attention's output carries the signal of its values; its queries and keys only weigh them
    (RF-DETR's first queries are positions from those boxes, its values a learned embedding).

    Residual additions: only the inputs that carry the sum count (at least 1% of the
    largest input's variance), so a deliberately small or zero-initialised branch does not
    count as vanishing; the depth reported is that of the inputs that carry. A softmax whose output
    only gates elementwise (PatchTSMixer's ``h * softmax(W h)``) is left uniform by a small input, a
    constant factor: its input's shrink is not judged (as in IL001), what it gates carries its own on.
    Where the signal is read at a layer before an addition (an output of fewer than ``min-units``),
    it is read on the input that carries the sum, whichever operand is written first (a forecast's
    ``head(x) * scale + loc``, which starts at the context's mean ``loc``).

    When a branch started at a normalisation the stream it is added to
    did not start from (pre-norm and sandwich-norm transformers, a branch ending in
    BatchNorm), its scale is fixed by that norm and the stream only grows additively, by
    the square root of the number of blocks at most: the branch is judged at its end (for
    explosion) and the sum starts afresh. A stream whose branches read it without a norm
    (a plain residual network) compounds, and is followed through every block.

    Branch gates are recognised from the graph and the measured scales, not from class
    names: a multiply by a parameter, or by a decay (an exponential), that leaves at most a
    quarter of the signal (LayerScale at 1e-6 as in ConvNeXt, CaiT's and DINOv2's LayerScale, ReZero's and
    SkipInit's alpha = 0), a normalisation whose weight is ~0 (``zero_init_residual``), a
    weight layer whose weight is exactly zero (Fixup, modded-nanoGPT's output
    projections). They make a branch near identity by design: the branch is judged up to
    the gate, and the signal starts afresh after it.

    A batch of one example cannot tell a vanishing at an average over positions: a training-mode
    BatchNorm centres each channel on that example's positions, so a sum of such outputs averages
    to rounding (ALIGN's EfficientNet on one 600 x 600 image, the batch the probe falls back to
    when two run out of memory: 1.99 -> 4.3e-8 at its pooler, with no weight layer in between).
    Such an average is not judged at a batch of 1.

    Tensors the forward creates (``torch.zeros``, ``ones``, ``empty``, ``full``, ``arange``
    and their ``_like``/``new_`` forms: an LSTM's zero initial state, a position index) are
    not the signal: they neither start nor end a stretch. Nor are integer outputs: an audio codec
    that returns its codes (XCodec's ``dist.max(-1).indices`` over a squared distance to its
    codebook, 4.7e4 at init) is not judged through them.

    The finding reports the scale at the start, the worst scale reached, the factor per
    weight layer (geometric mean over the deepest path of weight layers in between) and
    the first layer where the drift starts.

    ## Why is this bad?
    Each layer multiplies the signal's variance by ``fan_in * Var(w) / gain^2``. Away from 1,
    the product over depth grows or shrinks exponentially: a 50-layer linear stack with
    ``randn`` weights overflows to inf/NaN, one with ``0.01 * randn`` weights outputs zeros,
    and a 100-layer ReLU network with LeCun or Glorot init shrinks its signal by ~1e-16.
    Such a network cannot learn: its outputs do not depend on its inputs, and its gradients
    drift the same way (IL006).

    ## Fix
    Initialise every layer for the activation after it (see the IL001 findings this one
    links to), or add normalisation layers:
    ```python
    for m in model:
        nn.init.kaiming_normal_(m.weight, nonlinearity="linear")
    ```

    ## Options
    - ``max-scale-ratio`` (default ``100``): flag when the signal's scale ends more than this
      factor above or below its starting scale (four orders of magnitude in variance, well
      beyond the drift IL001 accepts, so IL005 reports only what has already gone wrong).
    - ``min-units`` (default ``16``): the scale is read at the last layer on the path with
      at least this many units (features or channels); the scale of a few units is too noisy
      to judge, and a network's narrow output layers (a width-1 regression head) are judged
      by the layers that feed them.
    """

    code = "IL005"
    name = "signal-drift"
    severity = "warning"
    needs = frozenset({"activations"})
    summary = "the measured forward signal exploding or vanishing through depth"
    role = "symptom"
    repair_after_causes = True
    stretch = True
    bad = (Example(deep_linear_stack_with_tiny_weights, expect={"0"}),)
    good = (Example(deep_linear_stack_at_lecun_init),)
    options = {"max-scale-ratio": 100.0, "min-units": 16}
    option_ranges = {"max-scale-ratio": (1, None), "min-units": (1, None)}

    def check(self, audit: AuditContext) -> Iterator[Finding]:
        limit = math.log(self.opts["max-scale-ratio"])
        trace = _Trace(audit)
        worst: Optional[Tuple[float, Op, Op]] = None
        for src, branch, normed, gate in self._judged_points(audit, trace):
            rms = audit.op_stats(src).get("rms")
            start = trace.ref.get(src.id)
            if rms is None or start is None or not _finite(rms) or start[0] <= 0:
                continue
            ratio = math.log(max(rms, 1e-300) / start[0])
            if (branch or gate) and ratio < 0:
                continue  # a small residual branch leaves the stream as it is; a softmax gate stays uniform
            if ratio < 0 and src.id in trace.products:
                continue  # q @ k^T of unrelated vectors is small at init (a cosine over sqrt(d)): no lost signal
            if abs(ratio) > limit and (worst is None or abs(ratio) > abs(worst[0])):
                if normed and abs(ratio - _code_gain(audit, audit.graph[start[1]], src)) <= limit:
                    continue  # the drift is a parameter-free op's, into a norm that undoes it (FNet's FFT)
                if normed and ratio < 0 and all(
                        rescales_only(audit, op) is not False
                        for op in _deepest_path(audit.graph, audit.graph[start[1]], src, trace.carried)):
                    continue  # a rescaled copy of the signal, into a norm that undoes the rescale
                if ratio < 0 and _centred_by_a_batch_of_one(audit, audit.graph[start[1]], src, trace):
                    continue
                worst = (ratio, src, audit.graph[start[1]])
        if worst is None:
            return
        ratio, src, start_op = worst
        yield self._finding(audit, trace, ratio, src, start_op)

    def _judged_points(self, audit: AuditContext, trace: "_Trace") -> Iterator[Tuple[Op, bool, bool, bool]]:
        """Where the signal ends, as ``(op, branch, normed, gate)``: the inputs of the endpoints and the
        model outputs, and the ends of the residual branches the stream is not judged through (``branch``);
        ``normed``: the input of a normalisation; ``gate``: the input of a softmax whose output only gates
        elementwise (:func:`~initlint.rules.base.softmax_gate`)."""
        outputs = set(audit.graph.outputs)
        ends = [(e, [e.id] if e.id in outputs else e.inputs, False) for e in self._endpoints(audit)]
        ends += [(audit.graph[i], [i], True) for i in trace.branch_ends]
        into_norm: Dict[int, bool] = {}
        for endpoint, sources, branch in ends:
            normed = endpoint.kind in O.NORM_KINDS or (
                not branch and O.is_product(endpoint) and _rescaled_into_norm(audit, endpoint, into_norm))
            gate = softmax_gate(audit, endpoint)
            for src_id in sources:
                src: Optional[Op] = audit.graph[src_id]
                if endpoint.kind in O.NORM_KINDS:
                    src = _input_of_last_weight(audit.graph, src)  # its scale is the norm's to fix
                src = self._judged_point(audit, src, trace) if src is not None else None
                if src is not None:
                    yield src, branch, normed, gate

    def _judged_point(self, audit: AuditContext, op: Op, trace: "_Trace") -> Optional[Op]:
        """``op``, or the nearest op before it on its main path with at least ``min-units`` units.

        A (log-)softmax and a shift by a constant change the offset of the signal, not its scale (the
        log-probabilities of a near-uniform prediction over V classes are all about -ln V): the
        signal is judged at their input. So is an addition of tensors that carry no signal to it (a
        mask of -100 on a shifted window's scores, a position bias computed from a table of
        coordinates): the signal is judged at its own input. Integer outputs (token ids, the indices an
        argmax or a codebook lookup picks) are not the signal, and no walk goes back through them."""
        current: Optional[Op] = op
        for _ in range(4096):
            if current is None:
                break
            if _starts_afresh(audit, current) or created_tensor(current) or _exponential(current) \
                    or current.id in audit.probe.discrete:  # ids or indices (a codebook's codes): not the signal
                return None
            shifted = [i for i in current.inputs if i in trace.ref]
            if _offset(current) or (current.kind == "add" and len(current.inputs) > 1 and len(shifted) == 1):
                current = audit.graph[shifted[0] if current.kind == "add" and shifted else current.inputs[0]]
                continue
            shape = audit.shape(current)
            if shape and "rms" in audit.op_stats(current):
                axis = audit.graph.unit_axis(current) % len(shape) if len(shape) > 1 else 0
                if len(shape) > 1 and shape[axis] >= self.opts["min-units"]:
                    return current
            current = audit.graph[_main_input(audit, current, trace)] if current.inputs else None
        return None

    @staticmethod
    def _endpoints(audit: AuditContext) -> List[Op]:
        graph = audit.graph
        ends = [op for op in graph if op.kind in O.ENDPOINT_KINDS and op.kind not in ("other", "reduce", "embedding")
                and not (op.kind in O.NORM_KINDS and starved(audit, op))]
        ends += [graph[i] for i in graph.outputs]
        return ends

    def _finding(self, audit: AuditContext, trace: "_Trace", ratio: float, src: Op, start_op: Op) -> Finding:
        path = _deepest_path(audit.graph, start_op, src, trace.carried)
        chain = [op for op in path if op.kind in O.WEIGHT_KINDS]
        start_rms = trace.ref[src.id][0]
        end_rms = audit.op_stats(src)["rms"]
        first = _first_drifting(audit, chain, start_rms, ratio) or _first_drifting(audit, path, start_rms, ratio) \
            or (chain[0] if chain else src)
        direction = "explodes" if ratio > 0 else "vanishes"
        over = (f" over {len(chain)} weight layer(s), {fmt(math.exp(ratio / len(chain)))}x per layer" if chain
                else " with no weight layer in between")
        bound = self.opts["max-scale-ratio"] if ratio > 0 else 1 / self.opts["max-scale-ratio"]
        message = (f"signal {direction}: scale (rms) {fmt(start_rms)} at {_describe(trace, start_op)} -> {fmt(end_rms)} at "
                   f"{src.target} ({src.module or '<model>'}), {fmt_beyond(end_rms / start_rms, bound)}x{over}, "
                   f"starting at {first.module or '<model>'} (limit {fmt(self.opts['max-scale-ratio'])}x either way)")
        fix = ("re-initialise the layers from " + (first.module or "the first layer") +
               " on for the activation that follows each (see IL001), or add a normalisation layer")
        return self.finding(audit, first, message, fix, value=end_rms / start_rms,
                            threshold=self.opts["max-scale-ratio"] if ratio > 0 else 1 / self.opts["max-scale-ratio"])

    def repair(self, plan: RepairPlan, finding: Finding, module: str) -> None:
        """With no repaired cause: LSUV from the first drifting layer to the end of its stretch."""
        lsuv_stretch(plan, module, self.code, "the signal drifts through this stretch", from_layer=True,
                     fallback=lambda op: scale_target(plan, op))


class _Trace:
    """For each op, where its signal last started afresh: ``ref[id] = (scale there, op id)``.

    Tensors the forward creates (:func:`~initlint.rules.base.created_tensor`) carry no signal and are skipped. Fresh starts: the model input, an embedding module's output (after its own scaling, such as
    Gemma's ``sqrt(hidden)``), a normalisation, and a branch gate (a LayerScale, a zero-initialised
    layer: small by design). At an addition only the inputs that carry the sum count (a gated or
    negligible branch does not), and the strongest of them carries on. When a residual branch
    started at a normalisation the stream it is added to did not start from (pre-norm and
    sandwich-norm blocks, a branch ending in BatchNorm), the branch's scale is fixed and the stream
    only grows additively, it cannot compound: the inputs are judged there and the sum starts afresh.
    """

    def __init__(self, audit: AuditContext) -> None:
        self.audit = audit
        self.ref: Dict[int, Tuple[float, int]] = {}
        self.branch_ends: List[int] = []
        self.embedding_outputs: Set[int] = set()
        self.carried: Dict[int, List[int]] = {}
        """The inputs of an addition of several signals that carry the sum."""
        self.products: Set[int] = set()
        """Ops whose signal went through a matrix product of two signals since it started."""
        for op in audit.graph:
            self._visit(op)

    def _visit(self, op: Op) -> None:
        audit, ref = self.audit, self.ref
        if created_tensor(op) or op.attrs.get("norm_statistic") or _exponential(op):
            # not the signal: what a hand-written norm divides by is the norm's own, and exp reads a
            # log-domain quantity (a decay's log); no stretch goes on from them
            return
        if self._starts(op):
            if op.kind not in _START_KINDS and op.inputs:
                self.branch_ends.append(op.inputs[0])  # a gated branch is judged up to its gate
            rms = audit.op_stats(op).get("rms")
            if rms is not None and rms > 0:
                ref[op.id] = (rms, op.id)
            return
        ins = [i for i in op.inputs if i in ref]
        if op.kind == "attention" and "v_input" in op.attrs:  # it averages the values: queries and keys weigh them
            ins = [op.attrs["v_input"]] if op.attrs["v_input"] in ref else []
        if not ins:
            return
        outweighed = self._outweighed(op, ins) if op.kind == "add" and len(op.inputs) > len(ins) else 0.0
        if outweighed > _MASK_DOMINANCE:
            return  # the signal plus a mask far larger than it (LongT5's -1e10 local mask): not the signal
        if outweighed > 1 / _CARRY:
            rms = audit.op_stats(op).get("rms")
            if rms is not None and _finite(rms) and rms > 0:
                ref[op.id] = (rms, op.id)  # the sum is the other tensor's: it starts afresh
                return
        if op.kind == "add" and len(ins) > 1:
            ins = self.carried[op.id] = self._carriers(ins)
            rms = audit.op_stats(op).get("rms")
            if self._fresh_branches(op, ins) and rms is not None and _finite(rms) and rms > 0:
                self.branch_ends.extend(ins)
                ref[op.id] = (rms, op.id)
                return
        if op.kind in ("add", "cat", "mul", "other") and len(ins) > 1:
            best = max(ins, key=lambda i: _rel(audit, audit.graph[i], ref))  # relative to its own start
        else:
            best = ins[0]
        ref[op.id] = ref[best]
        if best in self.products or (O.is_product(op) and len(ins) > 1):
            self.products.add(op.id)

    def _starts(self, op: Op) -> bool:
        if _starts_afresh(self.audit, op) or gate_factor(self.audit, op) is not None:
            return True
        # an embedding module scaling its own lookup (Gemma's x * sqrt(hidden)): its output is the start
        signals = [i for i in op.inputs if i in self.ref]
        if op.kind in ("mul", "div") and len(signals) == 1:
            start = self.audit.graph[self.ref[signals[0]][1]]
            if start.kind == "embedding" and start.module == op.module:
                self.embedding_outputs.add(op.id)
                return True
        return False

    def _outweighed(self, op: Op, ins: List[int]) -> float:
        """How many times an addition's input that is not the signal (built from created tensors: a mask, a
        constant bias) outweighs its signal inputs; 0 where either scale is unknown."""
        graph = self.audit.graph
        signal = [s for i in ins if (s := measured_rms(self.audit, graph[i])) is not None and _finite(s)]
        other = [s for i in op.inputs if i not in ins and (s := measured_rms(self.audit, graph[i])) is not None]
        if not (signal and other) or max(signal) <= 0:
            return math.inf if signal and other and max(other) > 0 else 0.0
        return max(other) / max(signal)

    def _carriers(self, ins: List[int]) -> List[int]:
        """The inputs of an addition that carry at least 1% of the largest one's variance."""
        scales = {i: measured_rms(self.audit, self.audit.graph[i]) for i in ins}
        known = [s for s in scales.values() if s is not None and _finite(s)]
        if not known:
            return ins
        top = max(known)
        return [i for i in ins if scales[i] is None or not _finite(scales[i]) or scales[i] >= _CARRY * top]

    def _fresh_branches(self, op: Op, ins: List[int]) -> List[int]:
        """Carriers of the addition ``op`` whose signal started at a normalisation that the other inputs
        did not start from (a pre-norm or sandwich-norm branch, a branch ending in BatchNorm): such a
        branch has a fixed scale, so adding it grows the stream additively, it cannot compound."""
        graph, ref = self.audit.graph, self.ref
        found = []
        for i in ins:
            start = ref[i][1]
            if graph[start].kind in O.NORM_KINDS and any(j != i and ref.get(j, (0.0, -1))[1] != start
                                                         for j in op.inputs):
                found.append(i)
        return found


def _main_input(audit: AuditContext, op: Op, trace: "_Trace") -> int:
    """The input that carries ``op``'s signal: of a sum of several signals the largest (whichever operand
    is written first: a forecast's ``loc + scale * head(x)`` as ``scale * head(x) + loc``), else the first."""
    signals = [i for i in op.inputs if i in trace.ref]
    if op.kind != "add" or len(signals) < 2:
        return op.inputs[0]
    scales = {i: measured_rms(audit, audit.graph[i]) for i in signals}
    return max(signals, key=lambda i: scales[i] if scales[i] is not None and scales[i] == scales[i] else -1.0)


def _rescaled_into_norm(audit: AuditContext, op: Op, memo: Dict[int, bool], budget: int = 4096) -> bool:
    """Whether everything ``op``'s output reaches goes through ops that only rescale it
    (:func:`~initlint.rules.base.rescales_only`, products with other signals, sums of them) into a
    normalisation that normalises, and none reaches the model output another way (a value nothing reads
    ends nowhere): the products of a delta-rule or state-space scan, whose output a gated RMSNorm
    normalises. A factor that shrank by a rescale is undone there."""
    graph, outputs = audit.graph, set(audit.graph.outputs)
    stack, seen, order = [op.id], set(), []
    while stack:  # the ops reachable from op, without the normalisations that end each path
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        order.append(current)
        if len(seen) > budget:
            return False
        for user in graph[current].users:
            u = graph[user]
            if not _normalises(audit, u) and not created_tensor(u) and not u.attrs.get("norm_statistic"):
                stack.append(user)
    for current in sorted(order, reverse=True):  # users come after their inputs
        if current in memo:
            continue
        o = graph[current]
        own = current == op.id or rescales_only(audit, o) is not False or copies(o)
        users = [graph[u] for u in o.users if not created_tensor(graph[u]) and not graph[u].attrs.get("norm_statistic")]
        memo[current] = own and current not in outputs and all(  # a value nothing reads (a cache) ends nowhere
            _normalises(audit, u) or memo.get(u.id, False) for u in users)
    return memo[op.id]


def _normalises(audit: AuditContext, op: Op) -> bool:
    """A normalisation that normalised its input (not one starved by its epsilon)."""
    return op.kind in O.NORM_KINDS and not starved(audit, op)


def _starts_afresh(audit: AuditContext, op: Op) -> bool:
    """The model input, an embedding, or a normalisation that normalised (not one starved by its epsilon,
    through which the input's scale passes: :func:`~initlint.rules.base.starved`)."""
    return op.kind in _START_KINDS and (op.kind not in O.NORM_KINDS or _normalises(audit, op))


def _input_of_last_weight(graph: Graph, op: Op) -> Optional[Op]:
    """Going back from a norm's input: the input of the weight layer that feeds the norm directly.

    A sum of two signals (a residual stream and its branch) is the norm's input itself, whichever
    operand comes first: ``branch + x`` (SegFormer) as ``x + branch`` (GPT-2)."""
    current = op
    for current in graph.back(op, limit=64):
        if current.kind in O.WEIGHT_KINDS:
            return graph[current.inputs[0]] if current.inputs else None
        if current.kind == "add" and len(current.inputs) > 1:
            return op  # a sum of two signals
        if current.kind not in O.PASS_KINDS and current.kind != "add":
            return op
    return None if not current.inputs else op


def _rel(audit: AuditContext, op: Op, ref: Dict[int, Tuple[float, int]]) -> float:
    rms = measured_rms(audit, op)
    if rms is None or not _finite(rms):
        return float("inf")
    return rms / ref[op.id][0] if ref[op.id][0] > 0 else 0.0


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


def _first_drifting(audit: AuditContext, chain: List[Op], start_rms: float, ratio: float) -> Optional[Op]:
    """First op of ``chain`` whose output scale moved from the previous one's by > 1.5x in the drift's direction."""
    prev = start_rms
    for op in chain:
        out = audit.op_stats(op).get("rms")
        if out is None or out <= 0 or not _finite(out) or prev <= 0:
            prev = out if out else prev
            continue
        step = math.log(out / prev)
        if (ratio > 0 and step > math.log(1.5)) or (ratio < 0 and step < -math.log(1.5)):
            return op
        prev = out
    return None


def _centred_by_a_batch_of_one(audit: AuditContext, start: Op, end: Op, trace: "_Trace") -> bool:
    """True for an average over positions, with no weight layer since ``start``, of a batch of one example
    that training-mode BatchNorms have made: each centres every channel on that one example's positions, so
    a sum of their outputs has a mean of 0 per channel, and the average is rounding (ALIGN's EfficientNet,
    whose probe fell back to one 600 x 600 image: 1.99 -> 4.3e-8 at its pooler). A batch of one cannot
    tell a vanishing there; with two examples or more the means are the examples' own."""
    shape = audit.shape(end)
    if not shape or shape[0] != 1 or end.kind not in ("pool", "mean", "reduce") or "max" in end.target:
        return False
    if any(op.kind in O.WEIGHT_KINDS for op in _deepest_path(audit.graph, start, end, trace.carried)):
        return False
    return any(op.kind == "batch_norm" and op.id < end.id for op in audit.graph)


def _deepest_path(graph: Graph, start: Op, end: Op, carried: Dict[int, List[int]]) -> List[Op]:
    """The ops from ``start`` (excluded) to ``end`` on the path through the most weight layers: the
    depth the signal went through (every block of a residual stack, not the skips around them), through
    the inputs of each addition that carry the sum (``carried``), not the branches it outweighs."""
    best: Dict[int, Tuple[int, Optional[int]]] = {start.id: (0, None)}
    for op in graph.ops[start.id + 1:end.id + 1]:
        ins = [i for i in carried.get(op.id, op.inputs) if i in best]
        if ins:
            came = max(ins, key=lambda i: best[i][0])
            best[op.id] = (best[came][0] + (op.kind in O.WEIGHT_KINDS), came)
    path: List[Op] = []
    current = end.id if end.id in best else None
    while current is not None and current != start.id:
        path.append(graph[current])
        current = best[current][1]
    return list(reversed(path))


def _code_gain(audit: AuditContext, start: Op, end: Op, limit: int = 256) -> float:
    """The log of the scale that parameter-free ops of one signal (a constant factor, a Fourier
    transform: ``mul``, ``div``, ``other`` without parameters) put on the path that carries the signal
    from ``start`` to ``end``: back from ``end`` through the input of the largest scale at each op. A
    run of such ops counts from the scale before it to the scale after it (a complex ``fftn`` between
    has none of its own)."""
    graph = audit.graph
    path: List[Op] = []
    current: Optional[Op] = end
    while current is not None and current.id != start.id and len(path) < limit:
        path.append(current)
        ins = [graph[i] for i in current.inputs if i >= start.id]
        current = max(ins, key=lambda o: measured_rms(audit, o) or -1.0) if ins else None
    if current is None or current.id != start.id:
        return 0.0
    total, before, in_run = 0.0, audit.op_stats(start).get("rms"), False
    for op in reversed(path):
        rms = audit.op_stats(op).get("rms")
        code = op.kind in ("mul", "div", "other") and not op.params and len(op.inputs) == 1
        if code and not in_run:
            in_run, anchor = True, before
        if in_run and not code:
            in_run = False
        if in_run and rms and anchor and _finite(rms) and _finite(anchor) and rms > 0 and anchor > 0:
            total += math.log(rms / anchor)
            anchor = rms
        before = rms if rms is not None else before
    return total


def _exponential(op: Op) -> bool:
    """``exp``: what it reads is a log-domain quantity (a decay's log, a log-variance), not the signal."""
    return op.target.rsplit(".", 1)[-1] in ("exp", "exp_", "exp2")


def _offset(op: Op) -> bool:
    """A (log-)softmax or the addition of a constant: it shifts the signal without scaling it."""
    if not op.inputs:
        return False
    return op.kind in ("softmax", "log_softmax") or (op.kind == "add" and len(op.inputs) == 1)


def _describe(trace: _Trace, op: Op) -> str:
    if op.kind == "input":
        return "the input"
    if op.id in trace.embedding_outputs:
        return f"the output of {op.module or '<model>'}"
    return f"{op.target} ({op.module or '<model>'})"
