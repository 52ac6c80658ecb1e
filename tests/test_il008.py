"""IL008: units that copy each other are confirmed exactly, never guessed from a statistic."""
import torch
import torch.nn as nn
import torch.nn.functional as F

import initlint
from test_sync import counting_syncs


def il008(report):
    return {module for code, module in report.codes() if code == "IL008"}


def finding(report, module):
    return next(f for f in report.findings if f.code == "IL008" and f.module == module)


def chance_collisions(w: torch.Tensor) -> int:
    """Rows whose float32 projection on one random direction equals another row's (the old test)."""
    proj = (w.float() @ (torch.rand(w.shape[1], generator=torch.Generator().manual_seed(0)) + 0.5)).sort().values
    return int((proj[1:] == proj[:-1]).sum())


def test_a_vocabulary_sized_head_with_distinct_rows_is_clean():
    torch.manual_seed(0)
    head = nn.Linear(768, 50257, bias=False)
    nn.init.normal_(head.weight, std=0.02)
    model = nn.Sequential(nn.Linear(64, 768), nn.GELU(), head)
    assert torch.unique(head.weight, dim=0).shape[0] == 50257  # every row distinct
    assert chance_collisions(head.weight.detach()) > 0  # one projection per row would have said otherwise
    report = initlint.audit(model, torch.randn(2, 64))
    assert il008(report) == set()
    assert report.probe.params["2.weight"]["dup_rows"] == 0


def test_units_with_equal_weights_but_different_biases_are_not_copies():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 8192), nn.ReLU(), nn.Linear(8192, 10))
    w = model[0].weight.detach()
    assert torch.unique(w, dim=0).shape[0] < 8192  # some units share their one weight value by chance
    assert il008(initlint.audit(model)) == set()
    with torch.no_grad():
        model[0].weight[5] = model[0].weight[9]
        model[0].bias[5] = model[0].bias[9]
    report = initlint.audit(model)
    assert il008(report) == {"0"}
    assert finding(report, "0").value == 1


def test_exact_copies_are_counted_wherever_they_are():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(300, 1001), nn.ReLU(), nn.Linear(1001, 64), nn.ReLU(), nn.Linear(64, 10))
    with torch.no_grad():
        for src, dst in ((-2, -1), (-2, 0), (17, 500)):
            model[0].weight[dst] = model[0].weight[src]
            model[0].bias[dst] = model[0].bias[src]
    report = initlint.audit(model)
    assert il008(report) == {"0"}
    f = finding(report, "0")
    assert f.value == 3 and f.threshold == 0
    assert "3 of the 1001 units of 0.weight are exact copies" in f.message
    assert f.fix == 'nn.init.kaiming_normal_(model[0].weight, nonlinearity="relu")'


class InOut(nn.Module):
    """Weights stored as (in, out) and applied as ``x @ W`` / ``addmm(b, x, W)``: a unit is a column."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(32, 48) / 32 ** 0.5)
        self.b1 = nn.Parameter(torch.zeros(48))
        self.w2 = nn.Parameter(torch.randn(48, 4) / 48 ** 0.5)

    def forward(self, x):
        return torch.relu(torch.addmm(self.b1, x, self.w1)) @ self.w2


def test_units_are_columns_of_a_transposed_weight():
    torch.manual_seed(0)
    model = InOut()
    with torch.no_grad():
        model.w1[3] = model.w1[7]  # two equal rows are two inputs with equal fan-out, not copied units
    assert il008(initlint.audit(model, torch.randn(8, 32))) == set()
    with torch.no_grad():
        model.w1[:, 11] = model.w1[:, 40]
    report = initlint.audit(model, torch.randn(8, 32))
    assert report.probe.params["w1"]["dup_rows"] == 1 and report.probe.params["w1"]["rows"] == 48
    assert il008(report) != set()


def test_grouped_convolutions_compare_units_within_a_group():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3, groups=2), nn.ReLU(), nn.Conv2d(8, 4, 1))
    with torch.no_grad():
        model[2].weight[0] = model[2].weight[4]  # groups read different inputs: not a copy
        model[2].bias[0] = model[2].bias[4]
    assert il008(initlint.audit(model)) == set()
    with torch.no_grad():
        model[2].weight[1] = model[2].weight[3]
        model[2].bias[1] = model[2].bias[3]
    assert il008(initlint.audit(model)) == {"2"}


def test_a_constant_depthwise_convolution_is_a_filter_per_channel():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 16, 3, groups=16), nn.ReLU(),
                          nn.Conv2d(16, 4, 1))
    nn.init.constant_(model[2].weight, 1 / 9)  # a box blur on every channel
    assert il008(initlint.audit(model)) == set()
    nn.init.constant_(model[4].weight, 0.1)
    report = initlint.audit(model)
    assert il008(report) == {"4"}


def test_constant_weights_say_whether_the_biases_differ():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
    nn.init.constant_(model[2].weight, 0.1)
    assert "differ only by their biases" in finding(initlint.audit(model), "2").message
    nn.init.zeros_(model[2].bias)
    assert "compute the same output for every input" in finding(initlint.audit(model), "2").message


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 64)
        self.body = nn.Linear(64, 64)
        self.decoder = nn.Linear(64, 1000, bias=False)
        self.decoder.weight = self.embed.weight

    def forward(self, ids):
        return F.log_softmax(self.decoder(torch.tanh(self.body(self.embed(ids)))), dim=-1)


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(64, 64)
        self.decoder = nn.Linear(64, 1000)

    def forward(self, x):
        return self.decoder(F.gelu(self.body(x)))


def test_the_fix_for_an_embedding_or_an_output_layer_is_not_a_relu_init():
    torch.manual_seed(0)
    tied = TiedLM()
    with torch.no_grad():
        tied.embed.weight[10] = tied.embed.weight[20]
    report = initlint.audit(tied, torch.randint(0, 1000, (2, 16)))
    assert il008(report) == {"decoder"}
    assert finding(report, "decoder").fix.startswith("nn.init.normal_(model.embed.weight, std=0.02)")

    head = Decoder()
    with torch.no_grad():
        head.decoder.weight[1] = head.decoder.weight[2]
        head.decoder.bias[1] = head.decoder.bias[2]
        head.body.weight[3] = head.body.weight[4]
        head.body.bias[3] = head.body.bias[4]
    report = initlint.audit(head, torch.randn(4, 64))
    assert il008(report) == {"decoder", "body"}
    assert finding(report, "decoder").fix.startswith("model.decoder.reset_parameters()")
    assert "nonlinearity" not in finding(report, "body").fix  # GELU: the gain is computed, not He's
    assert finding(report, "body").fix.startswith("nn.init.normal_(model.body.weight, std=")


def test_confirmation_syncs_only_when_there_are_candidates():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 10))
    with counting_syncs() as clean:
        initlint.audit(model, torch.randn(4, 64))
    with torch.no_grad():
        model[0].weight[1] = model[0].weight[2]
        model[0].bias[1] = model[0].bias[2]
    with counting_syncs() as copied:
        report = initlint.audit(model, torch.randn(4, 64))
    assert il008(report) == {"0"}
    assert sum(copied.values()) > sum(clean.values())  # the confirmation ran, and only here


class SeparateBias(nn.Module):
    """``x @ W + b`` written out: the bias is added by its own op."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(32, 64) / 32 ** 0.5)
        self.b = nn.Parameter(torch.randn(64))
        self.out = nn.Linear(64, 4)

    def forward(self, x):
        return self.out(torch.relu(x @ self.w + self.b))


def test_a_bias_added_by_its_own_op_is_part_of_the_unit():
    torch.manual_seed(0)
    model = SeparateBias()
    with torch.no_grad():
        model.w[:, 1] = model.w[:, 2]  # same weights, different biases: not copies
    assert il008(initlint.audit(model, torch.randn(8, 32))) == set()
    with torch.no_grad():
        model.b[1] = model.b[2]
    report = initlint.audit(model, torch.randn(8, 32))
    assert il008(report) != set()
    assert "weights and bias compared in full" in next(f for f in report.findings if f.code == "IL008").message


def test_units_alike_in_their_first_weights_are_compared_in_full():
    """The keys read each unit's first weights only: units that differ further on are candidates, and the
    comparison in full tells them apart from the one real copy."""
    from initlint.probe.duplicates import KEYED

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4 * KEYED, 256), nn.ReLU(), nn.Linear(256, 10))
    with torch.no_grad():
        w = model[0].weight
        w[:, :KEYED] = w[0, :KEYED]  # every unit starts alike
        model[0].bias.zero_()
        w[7] = w[3]  # the one exact copy
    report = initlint.audit(model, torch.randn(4, 4 * KEYED))
    assert report.probe.params["0.weight"]["dup_rows"] == 1
    assert il008(report) == {"0"}
    assert finding(report, "0").message.startswith("1 of the 256 units of 0.weight are exact copies")


def test_zero_filters_before_a_norm_are_counted_in_full_not_from_their_first_weights():
    from initlint.probe.duplicates import KEYED

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 32, 3), nn.BatchNorm2d(32), nn.ReLU(), nn.Flatten(), nn.Linear(32 * 36, 10))
    with torch.no_grad():
        model[0].weight[3].zero_()  # a zero filter
        model[0].weight[5].view(-1)[:KEYED].zero_()  # zero where the count first looks, not further on
    report = initlint.audit(model, torch.randn(4, 16, 8, 8))
    assert il008(report) == {"0"}
    assert finding(report, "0").message.startswith("1 of the 32 filters of 0.weight are exactly zero")


def test_zero_filters_of_many_layers_before_norms_are_counted_layer_by_layer():
    """The zero filters of every layer a norm follows are counted in batches of layers: each layer gets its own
    count, whatever the order and shape of the layers (2-D convolutions of three widths, one 1x1, one Linear)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                          nn.Conv2d(32, 16, 1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Flatten(), nn.Linear(16 * 64, 24), nn.BatchNorm1d(24), nn.ReLU(), nn.Linear(24, 4))
    zeroed = {"0": [15], "6": [0, 7], "9": [], "13": [2, 3, 23]}
    with torch.no_grad():
        for index, units in zeroed.items():
            for unit in units:
                model[int(index)].weight[unit].zero_()
    report = initlint.audit(model, torch.randn(4, 3, 8, 8))
    assert il008(report) == {"0", "6", "13"}
    for index in ("0", "6", "13"):
        assert finding(report, index).value == len(zeroed[index]), index


class ZeroThen(nn.Module):
    """A hidden layer zeroed, its output reaching the next weight layer through ``act``."""

    def __init__(self, act, zero_next: bool = False):
        super().__init__()
        self.inp, self.zero, self.next, self.head = (nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 64),
                                                     nn.Linear(64, 4))
        nn.init.zeros_(self.zero.weight)
        nn.init.zeros_(self.zero.bias)
        if zero_next:
            nn.init.zeros_(self.next.weight)
        self.act = act

    def forward(self, x):
        return self.head(torch.tanh(self.next(self.act(self.zero(torch.tanh(self.inp(x)))))))


def test_a_zero_layer_is_flagged_only_where_it_stays_zero():
    torch.manual_seed(0)
    x = torch.randn(8, 32)
    # through a ReLU (flat at 0) or into another zero layer, neither ever gets a gradient
    assert il008(initlint.audit(ZeroThen(nn.ReLU()), x)) == {"zero"}
    assert "relu" in finding(initlint.audit(ZeroThen(F.relu), x), "zero").message.lower()
    assert il008(initlint.audit(ZeroThen(nn.GELU(), zero_next=True), x)) >= {"zero"}
    # through GELU, tanh or nothing its gradient is not zero: it moves on the first step
    for act in (nn.GELU(), nn.Tanh(), nn.Identity()):
        model = ZeroThen(act)
        assert il008(initlint.audit(model, x)) == set(), act
        loss = model(x).square().mean()
        loss.backward()
        assert model.zero.weight.grad.abs().sum() > 0  # what the rule claims: it learns from its first step
    relu = ZeroThen(nn.ReLU())
    relu(x).square().mean().backward()
    assert relu.zero.weight.grad.abs().sum() == 0  # and the flagged one does not


def test_a_zero_layer_feeding_attention_learns_and_is_not_flagged():
    # Grounding DINO's reference-point head: its last layer zero, its output the queries' positions
    torch.manual_seed(0)

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.pos_head = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64))
            nn.init.zeros_(self.pos_head[2].weight)
            nn.init.zeros_(self.pos_head[2].bias)
            self.q, self.k, self.v = nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64)

        def forward(self, ref):
            pos = self.pos_head(ref)
            return F.scaled_dot_product_attention(self.q(pos).unsqueeze(1), self.k(ref).unsqueeze(1),
                                                  self.v(ref).unsqueeze(1))

    assert il008(initlint.audit(Decoder(), torch.randn(2, 16, 64))) == set()


def test_a_subpixel_convolution_initialised_as_nearest_neighbour_upsampling_is_not_copies():
    # Nemotron's diarizer: Conv1d(H, 4H) whose four blocks are the identity on the centre tap, reshaped
    # to 4x the frames; the copies land on different frames and part on the first step
    class Upsampler(nn.Module):
        def __init__(self, hidden=32, factor=4, icnr=True):
            super().__init__()
            self.factor, self.conv, self.head = factor, nn.Conv1d(hidden, hidden * factor, 3, padding=1), \
                nn.Linear(hidden, 3)
            weight = torch.zeros_like(self.conv.weight)
            weight[:, :, 1] = torch.eye(hidden).repeat(factor, 1)
            if not icnr:  # the same copies, summed back over the frames they would fill: they stay copies
                self.factor = 1
            with torch.no_grad():
                self.conv.weight.copy_(weight)
                self.conv.bias.zero_()

        def forward(self, h):
            b, t, d = h.shape
            y = self.conv(h.transpose(1, 2)).transpose(1, 2)
            y = y.reshape(b, t * self.factor, d) if self.factor > 1 else y.reshape(b, t, -1, d).sum(2)
            return self.head(y)

    x = torch.randn(2, 10, 32)
    model = Upsampler()
    assert il008(initlint.audit(model, x)) == set()
    target = torch.randn(2, 40, 3)  # one per frame, as the diarizer's speaker activity
    (model(x) - target).square().mean().backward()
    grads = model.conv.weight.grad[:, :, 1].reshape(4, 32, 32)
    assert not torch.equal(grads[0], grads[1])  # the copies get different gradients
    assert il008(initlint.audit(Upsampler(icnr=False), x)) == {"conv"}
    # pixel shuffle (2-D sub-pixel, blocked layout: the r*r units of a channel are consecutive)

    class Shuffle(nn.Module):
        def __init__(self, blocked=True):
            super().__init__()
            self.conv = nn.Conv2d(8, 8 * 4, 3, padding=1)
            base = torch.randn(8, 8, 3, 3) * 0.1
            with torch.no_grad():  # strided copies: four channels' sub-pixels alike, each channel its own
                self.conv.weight.copy_(base.repeat_interleave(4, dim=0) if blocked else base.repeat(4, 1, 1, 1))
                self.conv.bias.zero_()
            self.head = nn.Conv2d(8, 2, 1)

        def forward(self, x):
            return self.head(F.pixel_shuffle(self.conv(x), 2))

    assert il008(initlint.audit(Shuffle(), torch.randn(2, 8, 6, 6))) == set()
    assert il008(initlint.audit(Shuffle(blocked=False), torch.randn(2, 8, 6, 6))) == {"conv"}


def test_layers_of_many_shapes_keyed_together_count_only_copies_within_a_layer():
    """The keys of all layers (of one dtype and keyed width) are sorted in one batch, layer by layer: a unit
    equal to a unit of another layer is no copy, and copies at a layer's first and last unit are counted."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(40, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 96, bias=False),
                          nn.ReLU(), nn.Linear(96, 40), nn.ReLU(), nn.Linear(40, 10))
    with torch.no_grad():
        model[2].weight[0] = model[2].weight[63]  # the layer's first and last unit
        model[2].bias[0] = model[2].bias[63]
        model[4].weight[95] = model[4].weight[3]  # no bias
        model[4].weight[1] = model[4].weight[3]
        model[6].weight[:, :32] = model[4].weight[:40, :32]  # equal first weights across layers, not copies
        model[8].weight[5] = model[2].weight[5, :40]  # a unit equal to another layer's, in its first weights
    report = initlint.audit(model, torch.randn(8, 40))
    dup = {name: report.probe.params[name]["dup_rows"] for name in ("0.weight", "2.weight", "4.weight", "6.weight",
                                                                      "8.weight")}
    assert dup == {"0.weight": 0, "2.weight": 1, "4.weight": 2, "6.weight": 0, "8.weight": 0}
    assert il008(report) == {"2", "4"}


def test_layers_of_one_unit_count_keyed_together_count_their_own_copies():
    """Layers of one unit count (a stack of equal layers) are sorted as rows of one matrix, each on its own."""
    torch.manual_seed(0)
    layers = [nn.Linear(64, 64) for _ in range(4)]
    model = nn.Sequential(*[m for layer in layers for m in (layer, nn.Tanh())])
    with torch.no_grad():
        layers[1].weight[63] = layers[1].weight[0]
        layers[1].bias[63] = layers[1].bias[0]
        layers[3].weight[5] = layers[3].weight[6]
        layers[3].bias[5] = layers[3].bias[6]
        layers[3].weight[7] = layers[3].weight[6]
        layers[3].bias[7] = layers[3].bias[6]
        layers[2].weight[9] = layers[0].weight[9]  # equal to another layer's unit: no copy
        layers[2].bias[9] = layers[0].bias[9]
    report = initlint.audit(model, torch.randn(8, 64))
    assert [report.probe.params[f"{2 * i}.weight"]["dup_rows"] for i in range(4)] == [0, 1, 0, 2]
    assert il008(report) == {"2", "6"}


class _Indexer(nn.Module):
    """Scores keys with a gate set to ones, under no_grad: a sparse-attention indexer's shape."""

    def __init__(self, width=64, gates=32, no_grad=True):
        super().__init__()
        self.gate = nn.Linear(width, gates, bias=False)
        nn.init.ones_(self.gate.weight)
        self.no_grad = no_grad

    def forward(self, x):
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.no_grad):
            return self.gate(x).softmax(dim=1).argmax(dim=-1)


class _Indexed(nn.Module):
    def __init__(self, no_grad=True, traceable=True):
        super().__init__()
        self.inp, self.idx, self.out = nn.Linear(64, 64), _Indexer(no_grad=no_grad), nn.Linear(64, 64)
        self.traceable = traceable

    def forward(self, x):
        h = self.inp(x)
        if not self.traceable and bool(h.isnan().any()):  # data-dependent: fx cannot trace it
            h = h.nan_to_num()
        chosen = self.idx(h).unsqueeze(-1)
        return self.out(h).gather(1, chosen.expand(-1, -1, 64))


def test_a_layer_the_model_runs_under_no_grad_is_information_in_both_captures():
    # The model's loss sends the gate no gradient: whatever trains it (an indexer's own loss) is not probed.
    for traceable, capture in ((True, "fx"), (False, "runtime")):
        torch.manual_seed(0)
        report = initlint.audit(_Indexed(traceable=traceable), torch.randn(4, 16, 64))
        assert report.capture == capture
        found = {(f.code, f.module): f for f in report.findings}
        assert set(found) >= {("IL008", "idx.gate"), ("IL004", "idx.gate")}
        for key in (("IL008", "idx.gate"), ("IL004", "idx.gate")):
            assert found[key].severity == "info" and "autograd off" in found[key].message
        assert "idx.gate.weight" not in report.probe.grads  # the replay keeps the block: no gradient reaches it
        assert "out.weight" in report.probe.grads


def test_the_same_layer_with_autograd_on_is_still_flagged():
    for traceable in (True, False):
        torch.manual_seed(0)
        report = initlint.audit(_Indexed(no_grad=False, traceable=traceable), torch.randn(4, 16, 64))
        assert {(f.code, f.severity) for f in report.findings if f.module == "idx.gate"} >= {("IL008", "warning")}
        assert not report.probe.untracked


class _Scorer(nn.Module):
    """A block the model runs under no_grad: a dead ReLU, a saturated tanh and attention with scores of std 32."""

    def __init__(self, width=64):
        super().__init__()
        self.dead, self.sat, self.q, self.k = (nn.Linear(width, width) for _ in range(4))
        nn.init.constant_(self.dead.bias, -100.0)
        nn.init.normal_(self.sat.weight, std=1.0)
        for layer in (self.q, self.k):
            nn.init.normal_(layer.weight, std=1.0)

    @torch.no_grad()
    def forward(self, x):
        q, k = self.q(x), self.k(x)
        attention = (q @ k.transpose(-1, -2) / 8).softmax(dim=-1)
        return (torch.relu(self.dead(x)) + torch.tanh(self.sat(x)) + attention @ x).sum(-1).argmax(-1)


class _Scored(nn.Module):
    def __init__(self, no_grad=True):
        super().__init__()
        self.inp, self.scorer, self.out = nn.Linear(64, 64), _Scorer(), nn.Linear(64, 64)
        if not no_grad:
            self.scorer.forward = _Scorer.forward.__wrapped__.__get__(self.scorer)

    def forward(self, x):
        h = torch.layer_norm(self.inp(x), (64,))
        chosen = self.scorer(h)
        return self.out(h)[torch.arange(h.shape[0]), chosen]


def test_dead_saturated_and_one_hot_layers_under_no_grad_are_information():
    torch.manual_seed(0)
    loud = initlint.audit(_Scored(no_grad=False), torch.randn(4, 32, 64))
    torch.manual_seed(0)
    quiet = initlint.audit(_Scored(), torch.randn(4, 32, 64))
    codes = {"IL003", "IL007", "IL011"}
    assert codes <= {f.code for f in loud.findings if f.severity == "warning" and f.module.startswith("scorer")}
    found = [f for f in quiet.findings if f.code in codes]
    assert {f.code for f in found} == codes
    assert all(f.severity == "info" and "autograd off" in f.message for f in found)
