"""The built-in rules' metadata and documentation, generated from the rule classes by
``python -m initlint.output.docs`` (do not edit): ``initlint rules``, ``initlint explain`` and rule
selection read it without importing torch; a test fails when it is stale."""
from typing import Any, Dict

RULES: Dict[str, Dict[str, Any]] = {
    'IL000': {'code': 'IL000',
              'name': 'rule-error',
              'severity': 'info',
              'role': 'meta',
              'summary': 'a rule crashed on this model, or a rule plugin could not be loaded; the others still ran',
              'options': {},
              'option_ranges': {},
              'needs': ('graph',),
              'uses': (),
              'page': '# IL000 `rule-error`\n'
                      '\n'
                      'Severity: **info**. Role: meta. Needs: graph.\n'
                      '\n'
                      '## What it does\n'
                      'Reports that another rule raised an exception while it checked the model. The audit\n'
                      'pipeline emits this finding itself (``initlint.api``): the rule that failed is named in\n'
                      'the message with the exception type and text, and every other rule still reports. This\n'
                      'class only documents the code; its own check finds nothing.\n'
                      '\n'
                      '## Why is this bad?\n'
                      'A rule that crashed has not looked at the model, so the absence of its findings says\n'
                      'nothing about the model. Hiding the crash would make a broken check look like a clean\n'
                      'result; stopping the whole audit would throw away what the other rules found. The\n'
                      'finding is informational: it does not fail ``initlint check`` at the default\n'
                      '``--fail-on warning``.\n'
                      '\n'
                      '## Example\n'
                      '```text\n'
                      "<model>  IL000  info  IL003 (dead-relu) could not run: KeyError: 'units'\n"
                      'help: please report this with the model that triggers it\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      'Report it, with the model (or a small one that triggers the same error). Until then,\n'
                      'skip the failing rule with ``--ignore IL003`` (or whichever code is named); the\n'
                      'IL000 finding goes away with it.\n'
                      '\n'
                      '## Options\n'
                      'None. It is reported whenever a rule that ran fails, also when ``--select`` does not\n'
                      'name IL000 (a failure of a selected rule must stay visible); ``--ignore IL000`` hides it.\n'},
    'IL001': {'code': 'IL001',
              'name': 'init-scale',
              'severity': 'warning',
              'role': 'cause',
              'summary': 'weight scale (rms) against `gain / sqrt(fan_in)` of the next activation, judged by how far the '
                         'mismatch compounds before a normalisation',
              'options': {'max-variance-drift': 10000.0, 'tolerance': 1.1},
              'option_ranges': {'max-variance-drift': (1, None), 'tolerance': (1, None)},
              'needs': ('graph',),
              'uses': (),
              'page': '# IL001 `init-scale`\n'
                      '\n'
                      'Severity: **warning**. Role: cause. Needs: graph.\n'
                      '\n'
                      '## What it does\n'
                      "Compares every weight layer's weight scale (Linear, Conv1d/2d/3d, and matmuls with a\n"
                      "parameter such as GPT-2's ``Conv1D``) with the scale its downstream nonlinearity needs,\n"
                      '``gain / sqrt(fan_in)``, and follows how far the mismatch compounds through the layers\n'
                      'that come after it before anything renormalises the signal.\n'
                      '\n'
                      'The nonlinearity is read from the graph (module, functional or tensor-method form).\n'
                      'Gains: ReLU ``sqrt(2)`` (He), LeakyReLU ``sqrt(2 / (1 + slope^2))``, tanh anything from\n'
                      "``1`` (LeCun, Glorot on square layers) to ``5/3`` (PyTorch's gain), sigmoid ``1`` to\n"
                      '``4``, SELU ``3/4`` to ``1``, no activation ``1``. For any other elementwise activation\n'
                      '(GELU, SiLU, ELU, Mish, Softplus ...) the gain is computed numerically as\n'
                      '``1 / sqrt(E[phi(z)^2])`` for ``z ~ N(0, 1)``: the gain that keeps the second moment of\n'
                      'the signal unchanged through ``phi`` (it gives ``sqrt(2)`` for ReLU, 1.53 for GELU,\n'
                      '1.68 for SiLU).\n'
                      '\n'
                      '## Why is this bad?\n'
                      'For a layer ``y = W x`` with i.i.d. zero-mean weights, ``Var(y) = fan_in * Var(w) * E[x^2]``.\n'
                      'After an activation ``phi``, ``E[phi(y)^2] = Var(y) / gain^2``. So each layer multiplies\n'
                      "the signal's second moment by ``(std(w) * sqrt(fan_in) / gain)^2``, and a stack of L\n"
                      "layers multiplies it by the product of these factors. The rule measures each weight's\n"
                      'root mean square, which is its std when its mean is zero and the scale that enters\n'
                      '``E[y^2]`` when it is not. The compounded factor is a prediction from the weight scales\n'
                      "(the forward probe's measurement is IL005's). A factor of 1/6 per layer (PyTorch's\n"
                      'default ``nn.Linear`` init, std ``1/sqrt(3 fan_in)``, in front of a ReLU) is harmless in a\n'
                      'two-layer network (1/18 in all), but an eight-layer ReLU MLP shrinks its signal by about\n'
                      "``6^8``: the biases take over, half of the last layer's units die, and gradients vanish.\n"
                      'Randomly drawn ``randn`` weights do the opposite and explode.\n'
                      '\n'
                      'A normalisation layer (BatchNorm, LayerNorm, GroupNorm, RMSNorm, also hand-written ones, and\n'
                      'ones written as functional ops: ``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)``,\n'
                      'an L2 normalisation ``x / x.norm(dim=-1, keepdim=True)``, ``F.normalize``) resets the scale,\n'
                      'so a layer whose output reaches one before the next weight layer is not judged, and\n'
                      'compounding restarts after every normalisation. A shrink that reaches a normalisation through\n'
                      'layers without a bias (or with an all-zero one) and activations that are 0 at 0 is a rescaled\n'
                      'copy of the signal, which the normalisation undoes: it is not judged there (the gated delta\n'
                      'rule of Qwen3-Next and Lara-mini normalises its queries and keys this way, and its values\n'
                      "with a gated RMSNorm; at Hugging Face's init, its depthwise conv of std 0.02 at fan-in 4, that\n"
                      "model learnt the copy task of ``benchmarks/hf_init_training.py`` sooner than with PyTorch's\n"
                      "default conv). A layer's bias that a shrunk signal no longer dominates makes it more than a\n"
                      'rescale, and the shrink is judged; so is a shrink into a normalisation whose epsilon outweighs\n'
                      "its input's mean square, which then does not normalise: the shrink goes on through it. At a "
                      'residual addition the larger of the two signals\n'
                      "carries on: a deliberately small residual branch (GPT-2's ``N(0, 0.02)`` behind LayerNorm,\n"
                      'zero-initialised last layers) is not a defect. A product of two signals (a gate, ``q @ k^T``,\n'
                      'a linear solve) multiplies their scales and carries the shrinks of both on, to the softmax or\n'
                      "normalisation that ends them, and the growth of both but a gate's: a bounded activation\n"
                      "(sigmoid, hardsigmoid, tanh) caps what it passes on (squeeze-excitation's\n"
                      '``x * hardsigmoid(conv(pool(x)))`` grows as ``x`` does, once); a small input leaves a sigmoid at '
                      '1/2 (softplus at ln 2), so\n'
                      'its output does not shrink with it, and a softmax whose output only gates elementwise\n'
                      "(PatchTSMixer's ``h * softmax(W h)``) uniform, a constant factor of one over its size: the\n"
                      'shrink into such a softmax is not judged, what it gates carries its own on (PatchTSMixer at its\n'
                      'own init, every Linear at std 0.02 at a width of 8, learnt the forecasting task of\n'
                      '``benchmarks/hf_init_training.py`` in 43-46 steps, with its mixers at ``1 / sqrt(fan_in)`` in\n'
                      "104-149). An attention's softmax, whose output weighs the tokens (``softmax(q k^T) @ v``), is\n"
                      "judged. A clamp that leaves the probe's signal as it was (D-FINE's query positions,\n"
                      '``.clamp(min=-10, max=10)`` on values of scale 1e-3) passes a shrink on to where it ends.\n'
                      '\n'
                      "The rule flags the layers that contribute to a compounded change of the signal's second\n"
                      'moment beyond ``max-variance-drift`` (either way) by the time the signal reaches a\n'
                      'normalisation, a softmax or attention, an op of unknown gain, or the model output. Layers within\n'
                      '``tolerance`` of their target (sampling noise of a finite weight matrix) contribute nothing.\n'
                      '\n'
                      '## Example\n'
                      '```python\n'
                      'def deep_relu_mlp_at_pytorch_default_init():\n'
                      '    layers = []\n'
                      '    for _ in range(8):\n'
                      '        layers += [nn.Linear(256, 256), nn.ReLU()]  # default init: std 1/sqrt(3 * 256)\n'
                      '    return nn.Sequential(*layers, nn.Linear(256, 10))\n'
                      '```\n'
                      'Flagged at ``0``, ``10``, ``12``, ``14``, ``16``, ``2``, ``4``, ``6``, ``8``.\n'
                      '\n'
                      'Passed:\n'
                      '```python\n'
                      'def deep_relu_mlp_at_he_init():\n'
                      '    layers = []\n'
                      '    for _ in range(16):\n'
                      '        layers += [nn.Linear(256, 256), nn.ReLU()]\n'
                      '    model = nn.Sequential(*layers, nn.Linear(256, 10))\n'
                      '    for layer in model[:-1:2]:\n'
                      '        nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")\n'
                      '    nn.init.kaiming_normal_(model[-1].weight, nonlinearity="linear")\n'
                      '    return model\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      'Initialise each flagged layer for the activation that follows it:\n'
                      '```python\n'
                      'for m in model.modules():\n'
                      '    if isinstance(m, nn.Linear):\n'
                      '        nn.init.kaiming_normal_(m.weight, nonlinearity="relu")\n'
                      '        nn.init.zeros_(m.bias)\n'
                      '```\n'
                      'or put a normalisation layer in the chain.\n'
                      '\n'
                      '## Options\n'
                      '- ``max-variance-drift`` (default ``10000``): largest accepted compounded change of the\n'
                      "  signal's second moment, as a factor either way (100 in std). PyTorch's default init\n"
                      '  in front of ReLUs (1/6 per layer, 1/3 for the output layer) passes with up to four\n'
                      '  hidden layers and is flagged from five; LeCun init in a 10-layer ReLU network (1/2 per\n'
                      '  layer, 1/1024 in all) passes, in a 100-layer one it is flagged.\n'
                      '- ``tolerance`` (default ``1.1``): a layer whose weight scale (rms) is within this factor\n'
                      '  of its target band counts as on target.\n'},
    'IL002': {'code': 'IL002',
              'name': 'bias-before-norm',
              'severity': 'warning',
              'role': 'check',
              'summary': 'a Linear/Conv bias cancelled exactly by a following BatchNorm/InstanceNorm',
              'options': {},
              'option_ranges': {},
              'needs': ('graph',),
              'uses': (),
              'page': '# IL002 `bias-before-norm`\n'
                      '\n'
                      'Severity: **warning**. Role: check. Needs: graph.\n'
                      '\n'
                      '## What it does\n'
                      'Finds a Linear, Conv or ConvTranspose layer (1d, 2d or 3d) with a bias whose output\n'
                      'goes, through nothing but ops that keep its channel axis (dropout, identity, pooling,\n'
                      'transposes, reshapes that keep the shape), into a BatchNorm or InstanceNorm that\n'
                      'normalises over that same channel axis. Module and functional forms (``F.conv2d``,\n'
                      '``F.conv_transpose2d``, ``F.batch_norm``, ``F.instance_norm``) all count.\n'
                      '\n'
                      '## Why is this bad?\n'
                      "A per-channel norm subtracts each channel's mean over every other axis:\n"
                      '``BN(W x + b) = gamma * (W x + b - mean(W x) - b) / std + beta = BN(W x)``. The bias\n'
                      'is cancelled exactly, in training and (through the running mean) at inference, so it\n'
                      'is dead weight: parameters, optimizer state and compute that can never affect the\n'
                      "output, and a gradient that is always zero. The norm's ``beta`` already provides the\n"
                      'shift.\n'
                      '\n'
                      "Not flagged: a norm the model's own ``train()`` leaves in eval mode (mmdetection's\n"
                      '``norm_eval=True``, detectron-style frozen BatchNorm): it subtracts its running mean, not\n'
                      'the batch mean, so the bias is not cancelled; LayerNorm or GroupNorm (they normalise over other '
                      'axes, so the bias is not\n'
                      'cancelled exactly), a nonlinearity or a residual addition between the layer and the\n'
                      'norm, or a layer output that is also used elsewhere (each intermediate value must have\n'
                      'exactly one user).\n'
                      '\n'
                      '## Example\n'
                      '```python\n'
                      'def conv_with_bias_into_batchnorm():\n'
                      '    return nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU())\n'
                      '```\n'
                      'Flagged at ``0``.\n'
                      '\n'
                      'Passed:\n'
                      '```python\n'
                      'def conv_without_bias_into_batchnorm():\n'
                      '    return nn.Sequential(nn.Conv2d(3, 16, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU())\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      '```python\n'
                      'nn.Sequential(nn.Conv2d(3, 16, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU())\n'
                      'nn.Sequential(nn.ConvTranspose2d(100, 512, 4, 1, 0, bias=False), nn.BatchNorm2d(512), '
                      'nn.ReLU(True))\n'
                      '```\n'
                      '\n'
                      '## Options\n'
                      'None.\n'},
    'IL003': {'code': 'IL003',
              'name': 'dead-relu',
              'severity': 'warning',
              'role': 'symptom',
              'summary': 'ReLU units that output zero for the whole probe batch (units, not outputs)',
              'options': {'max-dead-fraction': 0.5, 'noise-sigmas': 4.0, 'min-observations': 8},
              'option_ranges': {'max-dead-fraction': (0, 1), 'noise-sigmas': (0, None), 'min-observations': (0, None)},
              'needs': ('activations',),
              'uses': ('IL001',),
              'page': '# IL003 `dead-relu`\n'
                      '\n'
                      'Severity: **warning**. Role: symptom. Needs: activations. Uses: IL001.\n'
                      '\n'
                      '## What it does\n'
                      'For every ReLU-family op (``nn.ReLU``, ``F.relu``, ``torch.relu``, ``x.relu()``,\n'
                      '``x.relu_()``, ReLU6), measures the fraction of its *units* (features of a linear\n'
                      'layer, channels of a convolution) that output zero for every sample and every\n'
                      'position of the probe batch.\n'
                      '\n'
                      '## Why is this bad?\n'
                      'A unit whose pre-activation is negative for every input passes no gradient, so gradient\n'
                      'descent never moves the weights that feed it: it is dead before training starts and\n'
                      'usually stays dead. The capacity it stands for is lost.\n'
                      '\n'
                      'This counts dead *units*, not zero *outputs*: a healthy ReLU layer outputs zero about\n'
                      'half of the time, yet almost none of its units are zero for a whole batch. Rules that\n'
                      'flag "70% zero outputs" fire on healthy networks. Units are judged only when each one\n'
                      'saw at least ``min-observations`` values, so a tiny probe batch cannot make healthy\n'
                      'units look dead by chance (a healthy unit is zero for 8 independent samples with\n'
                      'probability 1/256).\n'
                      '\n'
                      'In a deep plain ReLU network the representations of different inputs become nearly\n'
                      'parallel with depth (a property of the ReLU kernel, not of the init scale), so a unit\n'
                      'sees the same sign for the whole batch about half of the time even with He init: a\n'
                      '100-layer He-initialised network shows 45-50% of such units in wide layers and up to\n'
                      '80% in layers of a handful of units. The threshold therefore adds binomial noise to the\n'
                      '50% anchor: a layer of ``n`` units is flagged when its dead fraction exceeds\n'
                      '``max-dead-fraction + noise-sigmas * sqrt(p (1 - p) / n)`` (with ``p`` the anchor): 59%\n'
                      'for 256 units, 75% for 64, never for layers of fewer than 16 units. Dying from a\n'
                      'negative bias or a vanished signal kills far more than that.\n'
                      '\n'
                      "One case is reported whatever the layer's width: a layer whose every unit is dead and\n"
                      'that every path from the input to the model output passes through. Its output is\n'
                      "exactly zero, so the model's output is the same for every sample of the batch and every\n"
                      'gradient before it is exactly zero: the network is dead, not noisy. A He-initialised\n'
                      '100-layer ReLU pyramid narrowing to 5 units does this in some random draws (with\n'
                      '``torch.manual_seed(7)`` every unit of its last 5-unit layer is dead for the probe\n'
                      'batch). It is reported once, at the layer where the signal dies; the layers after it\n'
                      'only see a constant.\n'
                      '\n'
                      'A layer the model runs with autograd off (a ``torch.no_grad`` block of its own) passes no\n'
                      "gradient of the model's loss either way: its dead units are information (a layer dead in every\n"
                      'unit is still reported, since its output carries no signal forward).\n'
                      '\n'
                      '## Example\n'
                      '```python\n'
                      'def negative_bias_before_relu():\n'
                      '    fc = nn.Linear(128, 128)\n'
                      '    nn.init.constant_(fc.bias, -5.0)  # pre-activations far below zero\n'
                      '    return nn.Sequential(fc, nn.ReLU(), nn.Linear(128, 10))\n'
                      '```\n'
                      'Flagged at ``1``.\n'
                      '\n'
                      'Passed:\n'
                      '```python\n'
                      'def he_initialised_relu_mlp():\n'
                      '    layers = []\n'
                      '    for _ in range(6):\n'
                      '        layers += [nn.Linear(128, 128), nn.ReLU()]\n'
                      '    model = nn.Sequential(*layers, nn.Linear(128, 10))\n'
                      '    for layer in model[::2]:\n'
                      '        nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")\n'
                      '        nn.init.zeros_(layer.bias)\n'
                      '    return model\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      'Depends on the cause, which the finding names: a large negative bias (re-initialise it\n'
                      'with ``nn.init.zeros_``), a too-small upstream init (the signal has vanished and the\n'
                      'biases dominate; see IL001), or, when units die anyway, ``nn.LeakyReLU``. A narrow layer\n'
                      'that kills the whole signal needs more units or a leaky activation.\n'
                      '\n'
                      '## Options\n'
                      "- ``max-dead-fraction`` (default ``0.5``): flag when more than this fraction of a layer's\n"
                      '  units is dead. 50% is the threshold TheDeepChecker and SageMaker Debugger use.\n'
                      '- ``noise-sigmas`` (default ``4``): binomial standard deviations added to the anchor.\n'
                      '- ``min-observations`` (default ``8``): values per unit needed before judging.\n'},
    'IL004': {'code': 'IL004',
              'name': 'saturated-softmax',
              'severity': 'warning',
              'role': 'symptom',
              'summary': "a softmax, or the model's logits, near one-hot at init",
              'options': {'min-entropy': 0.5, 'max-cross-entropy': 1.5},
              'option_ranges': {'min-entropy': (0, 1), 'max-cross-entropy': (0, None)},
              'needs': ('activations',),
              'uses': (),
              'page': '# IL004 `saturated-softmax`\n'
                      '\n'
                      'Severity: **warning**. Role: symptom. Needs: activations.\n'
                      '\n'
                      '## What it does\n'
                      'Measures how peaked the probability distributions are at initialisation: for every\n'
                      "explicit ``softmax``/``log_softmax`` op that is not attention (attention rows are IL011's),\n"
                      'and for the model output when it is logits. The output is logits when the caller says so\n'
                      '(``logits=True`` / ``--logits``), and without being told when that is certain: the\n'
                      '``logits`` field of a Hugging Face style output, or a Linear head whose weight is also the\n'
                      'input embedding table (a tied language-model head). ``--no-logits`` turns both off. It\n'
                      'reports the mean maximum probability, the mean entropy relative to ``ln(C)`` for ``C``\n'
                      'classes (masked entries, such as the future positions of causal attention, do not count\n'
                      "as classes; a row with one entry left counts as saturated, unless the softmax's input\n"
                      "holds the mask's ``-inf`` itself, as in PhiMoE's sparse router, which masks every score\n"
                      'but the top one: then only rows with two or more entries are judged) and, for the logits,\n'
                      'the expected cross-entropy at init against ``ln(C)``. A softmax the model runs with\n'
                      "autograd off (a ``torch.no_grad`` block of its own: the key pooling of GLM-5-Next's\n"
                      "sparse-attention indexer) passes no gradient of the model's loss either way: it is\n"
                      'reported as information.\n'
                      '\n'
                      '## Why is this bad?\n'
                      'An untrained classifier knows nothing, so its prediction should be close to uniform:\n'
                      'entropy near ``ln(C)`` and a cross-entropy loss near ``ln(C)`` on the first batch. When\n'
                      'the logits have a large scale (logit variance grows with every too-large layer) the\n'
                      'softmax is one-hot before training: the loss starts huge, the gradient of the softmax\n'
                      'is near zero for every class but two, and the first steps are spent shrinking weights\n'
                      'instead of learning. With logits of standard deviation ``sigma`` over many classes the\n'
                      'expected cross-entropy of a random label is about ``ln(C) + sigma^2 / 2`` while ``sigma``\n'
                      'is small and grows like ``sigma * sqrt(2 ln C)`` beyond: a T5 whose untied ``lm_head`` is\n'
                      '``N(0, 1)`` starts near 110 instead of ``ln(32128) = 10.4``.\n'
                      '\n'
                      "How it depends on the rows' length: the same scores give a higher entropy over ``ln(C)`` the\n"
                      'more entries a row has (Gaussian scores of std 3: 0.41 over 16 entries, 0.51 over 2048), and a\n'
                      "softmax op may run over a sequence's positions (a pooling, a sparse-attention indexer's key "
                      'pools),\n'
                      "whose count is the probe's length. So for a softmax op the limit is stated at 64 entries and "
                      'moved\n'
                      "to the rows' length as IL011's is (the entropy there of the score spread that meets it at 64: "
                      '0.46\n'
                      "over 8 entries, 0.55 over 512); for the model's logits, whose classes the model fixes, it is the\n"
                      'limit as stated.\n'
                      '\n'
                      'The statistics come from at most 512 rows of the output (rows spread over the batch and\n'
                      "positions), which bounds their cost and keeps the mean's standard error below 0.022. For the\n"
                      "model's logits, whose rows are as wide as the vocabulary, the rows read are ``2^21 / classes``\n"
                      'but at least 64 (standard error below 0.06): 64 rows of a 32k-260k vocabulary.\n'
                      '\n'
                      '## Example\n'
                      '```python\n'
                      'def oversized_head_into_softmax():\n'
                      '    head = nn.Linear(256, 10)\n'
                      '    nn.init.normal_(head.weight, std=1.0)  # logits with std ~ 16\n'
                      '    return nn.Sequential(nn.Linear(32, 256), nn.LayerNorm(256), nn.ReLU(), head, '
                      'nn.Softmax(dim=-1))\n'
                      '```\n'
                      'Flagged at ``3``.\n'
                      '\n'
                      'Passed:\n'
                      '```python\n'
                      'def lecun_head_into_softmax():\n'
                      '    head = nn.Linear(256, 10)\n'
                      '    nn.init.kaiming_normal_(head.weight, nonlinearity="linear")\n'
                      '    return nn.Sequential(nn.Linear(32, 256), nn.LayerNorm(256), nn.ReLU(), head, '
                      'nn.Softmax(dim=-1))\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      "Shrink the last layer's init (zero-init it, or scale it down) and check the signal\n"
                      'scale upstream (IL001, IL005):\n'
                      '```python\n'
                      'with torch.no_grad():\n'
                      '    model[2].weight.mul_(0.1)\n'
                      '```\n'
                      'A head whose weight is shared with the input embedding (tied weights) keeps its table:\n'
                      "zeroing or shrinking it would change the embedding too, so the fix scales the head's\n"
                      'input instead (as T5 does with ``d_model ** -0.5``). A layer whose output also feeds\n'
                      'other paths is scaled, never zeroed.\n'
                      '\n'
                      '## Options\n'
                      '- ``min-entropy`` (default ``0.5``): flag when the mean entropy divided by ``ln(C)`` is\n'
                      "  below this (for a softmax op: at 64 entries, and moved to its rows' length, above). A\n"
                      '  uniform prediction scores 1; logits with std 1 over 10 classes score about 0.8, with std\n'
                      '  3 about 0.4, and a one-hot prediction 0.\n'
                      "- ``max-cross-entropy`` (default ``1.5``): for the model's logits, flag only when, in\n"
                      '  addition, the expected cross-entropy at init exceeds this multiple of ``ln(C)``. A tied\n'
                      "  head whose stream still carries each token's own embedding gives that token a spike\n"
                      "  (T5's default: mean max-probability 0.67, entropy 0.37 x ``ln(C)``) that lowers the\n"
                      '  entropy but costs a random label only 1.2 x ``ln(C)``. Gaussian logits cost 1.6 to 1.9 x\n'
                      '  ``ln(C)`` (10 to 32128 classes) by the time their entropy falls to 0.5 x ``ln(C)``, so\n'
                      '  for them the entropy decides.\n'},
    'IL005': {'code': 'IL005',
              'name': 'signal-drift',
              'severity': 'warning',
              'role': 'symptom',
              'summary': 'the measured forward signal exploding or vanishing through depth',
              'options': {'max-scale-ratio': 100.0, 'min-units': 16},
              'option_ranges': {'max-scale-ratio': (1, None), 'min-units': (1, None)},
              'needs': ('activations',),
              'uses': (),
              'page': '# IL005 `signal-drift`\n'
                      '\n'
                      'Severity: **warning**. Role: symptom. Needs: activations.\n'
                      '\n'
                      '## What it does\n'
                      'Follows the measured scale (root mean square) of the forward signal through the\n'
                      'network and flags a signal that explodes or vanishes. The signal is compared with its\n'
                      "scale where it last started afresh: the model input, an embedding module's output\n"
                      "(after its own scaling, such as Gemma's ``sqrt(hidden)``), the output of a\n"
                      'normalisation layer, or a branch gate (below). It is judged where the signal ends: at\n'
                      'the next normalisation, softmax or attention, or at the model output. A (log-)softmax\n'
                      'or the addition of a constant shifts the signal without scaling it (the\n'
                      'log-probabilities of a near-uniform prediction over 33k words are all about\n'
                      '``-ln 33278 = -10.4``), so the signal is judged at their input, as it is at the input of an\n'
                      "addition of tensors that carry no signal to it (a shifted window's mask of -100, a position\n"
                      'bias computed from a table of coordinates); and the scale of a\n'
                      "weight layer that feeds a normalisation directly is the norm's to fix (as in IL001):\n"
                      "the signal is judged at that layer's input. A shrink into a normalisation (or into a product\n"
                      "whose output reaches one through ops that only rescale it, as a gated delta rule's or a\n"
                      "state-space scan's products reach their gated RMSNorm) through layers without a bias (or with\n"
                      'an all-zero one) and activations that are 0 at 0 is a rescaled copy of the signal, which the\n'
                      'normalisation undoes: it is not judged (as in IL001). A normalisation whose epsilon outweighs its\n'
                      "input's mean square does not normalise: the signal does not start afresh there, and its scale\n"
                      'goes on through it. A residual sum that feeds a norm is judged\n'
                      "itself, whichever operand is written first (SegFormer's ``branch + x`` once had its small\n"
                      'pre-norm branch judged instead of the sum). What reaches an endpoint through ``exp`` is not\n'
                      "judged: the exponential's input is a log-domain quantity, not the signal (Mamba2's\n"
                      '``exp(cumsum(A * dt))``, whose log-decays of 128 heads reach a scale of 4.7e3 at init), and\n'
                      "the exponential carries none of it on. A product of two signals (``q @ k^T``, a scan's\n"
                      'einsum) is small at init when they are unrelated (the cosine of two random vectors is about\n'
                      '``1 / sqrt(d)``, and a sequence padded to the chunk of a chunked scan dilutes it further):\n'
                      'only its growth is judged, not its shrink.\n'
                      'Into a normalisation, the scale that parameter-free ops of one signal put on the path (a\n'
                      'constant factor, a Fourier transform) is not counted: no init sets it and the norm undoes\n'
                      "it (FNet's unnormalised ``LayerNorm(x + fft(x).real)`` is about ``sqrt(tokens x width)``\n"
                      'times its input, 108x at 16 tokens); on the way to the model output it still counts. An\n'
                      'addition of a tensor that is not the signal (a mask built from created tensors) and over\n'
                      "1000x the signal's scale is a masking, not the signal (LongT5's local mask of -1e10 added\n"
                      'to its position bias): no stretch goes through it. Where such a tensor carries the sum\n'
                      'otherwise (the signal holds less than 1% of its variance), the sum starts afresh: RF-DETR\n'
                      "adds a learned offset of scale 0.001 to its proposals' box centres (0.58), and what its\n"
                      'decoder computes from the sum is judged against 0.58, not against the offset. An\n'
                      "attention's output carries the signal of its values; its queries and keys only weigh them\n"
                      "(RF-DETR's first queries are positions from those boxes, its values a learned embedding).\n"
                      '\n'
                      'Residual additions: only the inputs that carry the sum count (at least 1% of the\n'
                      "largest input's variance), so a deliberately small or zero-initialised branch does not\n"
                      'count as vanishing; the depth reported is that of the inputs that carry. A softmax whose output\n'
                      "only gates elementwise (PatchTSMixer's ``h * softmax(W h)``) is left uniform by a small input, a\n"
                      "constant factor: its input's shrink is not judged (as in IL001), what it gates carries its own "
                      'on.\n'
                      'Where the signal is read at a layer before an addition (an output of fewer than ``min-units``),\n'
                      "it is read on the input that carries the sum, whichever operand is written first (a forecast's\n"
                      "``head(x) * scale + loc``, which starts at the context's mean ``loc``).\n"
                      '\n'
                      'When a branch started at a normalisation the stream it is added to\n'
                      'did not start from (pre-norm and sandwich-norm transformers, a branch ending in\n'
                      'BatchNorm), its scale is fixed by that norm and the stream only grows additively, by\n'
                      'the square root of the number of blocks at most: the branch is judged at its end (for\n'
                      'explosion) and the sum starts afresh. A stream whose branches read it without a norm\n'
                      '(a plain residual network) compounds, and is followed through every block.\n'
                      '\n'
                      'Branch gates are recognised from the graph and the measured scales, not from class\n'
                      'names: a multiply by a parameter, or by a decay (an exponential), that leaves at most a\n'
                      "quarter of the signal (LayerScale at 1e-6 as in ConvNeXt, CaiT's and DINOv2's LayerScale, ReZero's "
                      'and\n'
                      "SkipInit's alpha = 0), a normalisation whose weight is ~0 (``zero_init_residual``), a\n"
                      "weight layer whose weight is exactly zero (Fixup, modded-nanoGPT's output\n"
                      'projections). They make a branch near identity by design: the branch is judged up to\n'
                      'the gate, and the signal starts afresh after it.\n'
                      '\n'
                      'A batch of one example cannot tell a vanishing at an average over positions: a training-mode\n'
                      "BatchNorm centres each channel on that example's positions, so a sum of such outputs averages\n"
                      "to rounding (ALIGN's EfficientNet on one 600 x 600 image, the batch the probe falls back to\n"
                      'when two run out of memory: 1.99 -> 4.3e-8 at its pooler, with no weight layer in between).\n'
                      'Such an average is not judged at a batch of 1.\n'
                      '\n'
                      'Tensors the forward creates (``torch.zeros``, ``ones``, ``empty``, ``full``, ``arange``\n'
                      "and their ``_like``/``new_`` forms: an LSTM's zero initial state, a position index) are\n"
                      'not the signal: they neither start nor end a stretch. Nor are integer outputs: an audio codec\n'
                      "that returns its codes (XCodec's ``dist.max(-1).indices`` over a squared distance to its\n"
                      'codebook, 4.7e4 at init) is not judged through them.\n'
                      '\n'
                      'The finding reports the scale at the start, the worst scale reached, the factor per\n'
                      'weight layer (geometric mean over the deepest path of weight layers in between) and\n'
                      'the first layer where the drift starts.\n'
                      '\n'
                      '## Why is this bad?\n'
                      "Each layer multiplies the signal's variance by ``fan_in * Var(w) / gain^2``. Away from 1,\n"
                      'the product over depth grows or shrinks exponentially: a 50-layer linear stack with\n'
                      '``randn`` weights overflows to inf/NaN, one with ``0.01 * randn`` weights outputs zeros,\n'
                      'and a 100-layer ReLU network with LeCun or Glorot init shrinks its signal by ~1e-16.\n'
                      'Such a network cannot learn: its outputs do not depend on its inputs, and its gradients\n'
                      'drift the same way (IL006).\n'
                      '\n'
                      '## Example\n'
                      '```python\n'
                      'def deep_linear_stack_with_tiny_weights():\n'
                      '    model = nn.Sequential(*[nn.Linear(100, 100) for _ in range(30)])\n'
                      '    for layer in model:\n'
                      '        nn.init.normal_(layer.weight, std=0.01)  # 1/10 of 1/sqrt(100): the signal shrinks 10x per '
                      'layer\n'
                      '        nn.init.zeros_(layer.bias)\n'
                      '    return model\n'
                      '```\n'
                      'Flagged at ``0``.\n'
                      '\n'
                      'Passed:\n'
                      '```python\n'
                      'def deep_linear_stack_at_lecun_init():\n'
                      '    model = nn.Sequential(*[nn.Linear(100, 100) for _ in range(30)])\n'
                      '    for layer in model:\n'
                      '        nn.init.normal_(layer.weight, std=0.1)\n'
                      '        nn.init.zeros_(layer.bias)\n'
                      '    return model\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      'Initialise every layer for the activation after it (see the IL001 findings this one\n'
                      'links to), or add normalisation layers:\n'
                      '```python\n'
                      'for m in model:\n'
                      '    nn.init.kaiming_normal_(m.weight, nonlinearity="linear")\n'
                      '```\n'
                      '\n'
                      '## Options\n'
                      "- ``max-scale-ratio`` (default ``100``): flag when the signal's scale ends more than this\n"
                      '  factor above or below its starting scale (four orders of magnitude in variance, well\n'
                      '  beyond the drift IL001 accepts, so IL005 reports only what has already gone wrong).\n'
                      '- ``min-units`` (default ``16``): the scale is read at the last layer on the path with\n'
                      '  at least this many units (features or channels); the scale of a few units is too noisy\n'
                      "  to judge, and a network's narrow output layers (a width-1 regression head) are judged\n"
                      '  by the layers that feed them.\n'},
    'IL006': {'code': 'IL006',
              'name': 'gradient-drift',
              'severity': 'warning',
              'role': 'symptom',
              'summary': 'weight gradients spread far beyond what the layer fans predict (backward probe)',
              'options': {'max-excess-spread': 100.0, 'max-gradient-drift': 1000000.0},
              'option_ranges': {'max-excess-spread': (1, None), 'max-gradient-drift': (1, None)},
              'needs': ('gradients',),
              'uses': (),
              'page': '# IL006 `gradient-drift`\n'
                      '\n'
                      'Severity: **warning**. Role: symptom. Needs: gradients.\n'
                      '\n'
                      '## What it does\n'
                      'Runs a backward probe: a random unit-variance cotangent is backpropagated from the\n'
                      'model output (no loss and no labels needed) and the gradient of every weight layer is\n'
                      'measured (its norm and mean; for a weight used only in matrix products or 2-D convolutions,\n'
                      "from the products' inputs and output gradients, without forming the gradient). It flags a spread "
                      'of gradient *variance* across layers far beyond what the\n'
                      "layers' fan-ins and fan-outs can explain. Existing ``.grad`` fields are never touched\n"
                      '(the probe uses ``torch.autograd.grad``).\n'
                      '\n'
                      'Layers are compared within each stretch of the network that no normalisation, pooling\n'
                      'or reduction interrupts: a norm rescales the backward signal by ``gamma / sigma`` on\n'
                      "purpose, and a mean over positions divides each position's backward signal by their\n"
                      'count (a conv -> conv -> global mean-pool -> linear network at He init spreads its\n'
                      'per-position gradients by the square of the number of positions, with nothing wrong).\n'
                      '\n'
                      'Layers left out, because their gradient is legitimately tiny or zero at init:\n'
                      '- embeddings (their gradient is sparse by nature: only the rows of the sampled tokens\n'
                      '  get one);\n'
                      '- one factor of a product of two signals, directly or through an activation, and every\n'
                      '  layer of a branch that reaches the stream only through such a product: the\n'
                      "  projections that produce attention scores, gates (a GRU's reset and update gates, a\n"
                      "  SwiGLU's gate), routing weights and the experts of a mixture of experts (an expert run\n"
                      '  on every token is weighted by a routing probability that is zero for most of them);\n'
                      '  the gradient of each factor is scaled by the other one;\n'
                      '- the layers of a residual branch gated near identity by design (see IL005: a\n'
                      "  LayerScale at 1e-6, ReZero's alpha = 0, a zero BatchNorm gamma, a zero-initialised\n"
                      '  last layer): the gate multiplies their backward signal by its own small value;\n'
                      '- the layers of a branch that, at init, adds at most ``1/4`` (the gate limit of IL005)\n'
                      '  of what a parallel branch beside it adds, where the two are summed before they reach\n'
                      "  the stream (not a residual addition: neither is computed from the other): Falcon-H1's\n"
                      '  Mamba-2 mixer beside its attention (``mamba(x) + attn(x)``), whose depthwise conv at\n'
                      "  std 0.02 leaves it 0.012x the attention's output at its real width, 0.0023x at width\n"
                      "  256. The branch is quiet, as a gated one is, and its layers' weight gradients are\n"
                      '  small because their inputs are. Trained with AdamW on a copy task\n'
                      '  (``benchmarks/hf_init_training.py --model falcon_h1``, 4 seeds) it learnt it at steps\n'
                      "  52-58, the same model with the conv at PyTorch's default at 49-56, and its mixer's\n"
                      "  output grew to 0.25-0.60x the attention's in 400 steps: a cost of a few steps (4-10%),\n"
                      "  where a finding IL006 keeps preceded failure (ELECTRA-small's embeddings projected at\n"
                      '  std 0.02 did not learn a shift task in 1000 steps; ``--model electra``);\n'
                      '- conditioning layers, whose output is broadcast over positions it was not computed at\n'
                      "  (a diffusion UNet's timestep embedding added to every pixel of every block, FiLM and\n"
                      '  AdaLN modulations), directly or through other layers: their gradient gathers every\n'
                      '  position they reach, and no fan ratio predicts how many;\n'
                      "- layers whose gradient is exactly zero (dead units are IL003's, symmetric weights\n"
                      "  IL008's).\n"
                      '\n'
                      'The spread leaves out one more kind of layer, one whose scale is free: its output reaches\n'
                      'only normalisations, through layers without a bias (or with an all-zero one), activations\n'
                      'that are 0 at 0, views and products, so that scaling the weight by ``c`` changes nothing the\n'
                      "model computes and its gradient by ``1 / c``. Hugging Face's generic init draws AIMv2's two\n"
                      'projections into the L2 normalisation of its embeddings at std 1 (32x ``1 / sqrt(fan_in)``):\n'
                      "the vision projection's gradient was 1.3e3x below the vision head's, and that init reached the\n"
                      'matching task of ``benchmarks/hf_init_training.py --model aimv2`` at steps 20-27, where the\n'
                      'projections at ``1 / sqrt(fan_in)`` took 36-49 (4 seeds). What the first step of the optimizer\n'
                      "does to such a weight is IL015's. The check of gradients that vanished or exploded in every layer\n"
                      'alike (below) still reads such layers: a deep stack of\n'
                      'bias-free layers into BatchNorms without residuals (100 x Linear-BatchNorm-ReLU) explodes its\n'
                      "gradients by 3.5e8x, which a layer's own scale does not explain.\n"
                      '\n'
                      '## Why is this bad?\n'
                      'Gradients are compared per sample and position: a weight applied at many positions (a\n'
                      'convolution over a long signal, a cell unrolled over time steps) sums that many terms,\n'
                      'so its gradient std is divided by the square root of the number of positions over all\n'
                      'its calls first.\n'
                      '\n'
                      'The gradient of layer ``l`` is the product of the forward signal reaching it and the\n'
                      'backward signal coming from above: ``Var(dW_l) = Var(h_{l-1}) * Var(delta_l)``. With a\n'
                      'forward-stable init, He et al. show these products cancel except for a fan ratio: the\n'
                      'spread of gradient variance across a network is bounded by the largest fan-in over the\n'
                      'smallest fan-out (about 1e3 for a pyramid from width 1000 down to 1, which is what one\n'
                      'measures with He init), or, in a widening network, by the largest fan-out over the\n'
                      'smallest fan-in (a head over 21841 classes on 128 features: the backward signal grows by\n'
                      '``21841 / 128`` through a layer initialised for its fan-in). Anything much larger\n'
                      'compounds with depth: layers near one end learn orders of magnitude faster than at the\n'
                      'other, and no single learning rate suits them (a naive ``U(-1, 1)`` init of a 10-layer\n'
                      'tanh pyramid spans more than 8 orders).\n'
                      '\n'
                      "How it depends on the sequence's length: the division by the square root of the positions\n"
                      'holds when the terms summed over positions are independent, and at init they need not be.\n'
                      "In T5-small at default init the encoder's first MLP (``wo`` against ``wi``) spreads its\n"
                      'gradient variance by 489x on 2048 encoder tokens (limit 400) and stays within the limit on\n'
                      '16, 512 and 1024: the spread grows with the length. T5 trains on 512 input tokens; the\n'
                      'rest of the real-size zoo is clean at 512 and, where tested, 2048.\n'
                      '\n'
                      'It also flags gradients that vanished (or exploded) in every layer alike, which no spread\n'
                      'shows: for each layer the backward signal ``delta_l`` is estimated as the per-position\n'
                      "gradient std over the scale of the layer's input, and compared with the unit-variance\n"
                      'cotangent at the output. With a stable init it stays within a few orders of magnitude\n'
                      '(1e-3 to 1 in a 100-layer He pyramid and in the transformer zoo of the tests); LeCun or\n'
                      'Glorot init in a 100-layer ReLU network leaves it near 1e-10. Through depth it vanishes away\n'
                      'from the output: the layers nearest the output get the cotangent at about its scale. Where\n'
                      "every layer's is below the limit, the signal was lost in the ops between the output and the\n"
                      'last weight layer, which no init of the layers changes: it is reported as information.\n'
                      "VideoPrism's contrastive output divides each ``exp`` of a similarity by their sum over the\n"
                      'batch; on the batch of one that the probe falls back to when a 16-frame clip at 288 x 288 does\n'
                      "not fit, the output is exactly 1 and every layer's gradient is round-off (6e-14 to 4.8e-11\n"
                      "of the output's).\n"
                      '\n'
                      '## Example\n'
                      '```python\n'
                      'def tanh_pyramid_with_uniform_weights():\n'
                      '    widths = [round(200 * 0.96 ** i) for i in range(11)]\n'
                      '    layers = []\n'
                      '    for fan_in, fan_out in zip(widths, widths[1:]):\n'
                      '        layer = nn.Linear(fan_in, fan_out)\n'
                      '        nn.init.uniform_(layer.weight, -1, 1)  # std 0.58, about 8x what tanh needs\n'
                      '        layers += [layer, nn.Tanh()]\n'
                      '    return nn.Sequential(*layers, nn.Linear(widths[-1], 1))\n'
                      '```\n'
                      'Flagged at ``18``.\n'
                      '\n'
                      'Passed:\n'
                      '```python\n'
                      'def conv_net_with_global_pooling():\n'
                      '    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), '
                      'nn.ReLU(),\n'
                      '                         nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), '
                      'nn.ReLU(),\n'
                      '                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      "Use the init that matches each layer's activation (IL001 names the layers), or add\n"
                      'normalisation. The finding names the layers with the smallest and largest gradients.\n'
                      '\n'
                      '## Options\n'
                      '- ``max-excess-spread`` (default ``100``): flag when the spread of gradient variance\n'
                      '  (largest over smallest) exceeds the fan-ratio prediction times this factor.\n'
                      '- ``max-gradient-drift`` (default ``1e6``): flag when the backward signal reaching a\n'
                      "  weight layer is below ``1 / max-gradient-drift`` of the output's, or above\n"
                      '  ``max-gradient-drift``, both widened by the square root of the fan ratio.\n'},
    'IL007': {'code': 'IL007',
              'name': 'saturated-activation',
              'severity': 'warning',
              'role': 'symptom',
              'summary': 'tanh/sigmoid-like outputs pinned at their bounds',
              'options': {'max-saturated-fraction': 0.5},
              'option_ranges': {'max-saturated-fraction': (0, 1)},
              'needs': ('activations',),
              'uses': (),
              'page': '# IL007 `saturated-activation`\n'
                      '\n'
                      'Severity: **warning**. Role: symptom. Needs: activations.\n'
                      '\n'
                      '## What it does\n'
                      'For every bounded activation (tanh, sigmoid, hardtanh, softsign, hardsigmoid) measures\n'
                      "the fraction of its outputs pinned near a bound: within 1% of the activation's range\n"
                      'from either end (``|tanh| > 0.98``, sigmoid below 0.01 or above 0.99, hardtanh exactly\n'
                      'at its limits).\n'
                      '\n'
                      '## Why is this bad?\n'
                      "A saturated unit has a derivative near zero (``tanh'(z) = 1 - tanh(z)^2 < 0.04`` once\n"
                      '``|tanh(z)| > 0.98``), so almost no gradient flows through it, and the layers below it\n'
                      'learn slowly or not at all. Saturation at initialisation comes from pre-activations\n'
                      'that are too large: weights drawn without regard to the fan-in (a naive ``U(-1, 1)``\n'
                      'init of a tanh pyramid saturates about 88% of the units of every layer), or a signal\n'
                      'that has grown upstream.\n'
                      '\n'
                      "A saturation set by an offset is reported as information: where the activation's input\n"
                      'is ``x + offset`` (or ``scale * (x + offset)``), with an offset (and scale) computed from\n'
                      'parameters alone that make its scale more than 3x that of ``x``, its parameters put it at\n'
                      "a bound on purpose. Kimi Delta Attention's decay gate,\n"
                      '``sigmoid(exp(A_log) * (f_proj(h) + dt_bias))`` with ``A_log = log U(1, 16)`` and\n'
                      '``dt_bias`` the inverse softplus of ``U(1e-3, 1e-1)``, sits near 0 at init (a decay near\n'
                      "1: long memory), as Mamba's step size is set small; its weights are not the cause, and\n"
                      "rescaling them would not move it. A layer's own bias is not such an offset.\n"
                      '\n'
                      'A layer the model runs with autograd off (a ``torch.no_grad`` block of its own) passes no\n'
                      "gradient of the model's loss either way: its finding is information.\n"
                      '\n'
                      '## Example\n'
                      '```python\n'
                      'def tanh_after_a_wide_layer_with_large_weights():\n'
                      '    layer = nn.Linear(500, 500)\n'
                      '    nn.init.normal_(layer.weight, std=0.2)  # pre-activation std ~4.5\n'
                      '    return nn.Sequential(layer, nn.Tanh(), nn.Linear(500, 1))\n'
                      '```\n'
                      'Flagged at ``1``.\n'
                      '\n'
                      'Passed:\n'
                      '```python\n'
                      'def tanh_after_a_glorot_layer():\n'
                      '    layer = nn.Linear(500, 500)\n'
                      '    nn.init.xavier_normal_(layer.weight)\n'
                      '    return nn.Sequential(layer, nn.Tanh(), nn.Linear(500, 1))\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      'Scale the weights feeding the activation for it, e.g.\n'
                      '``nn.init.kaiming_normal_(layer.weight, nonlinearity="tanh")`` or\n'
                      '``nn.init.xavier_normal_(layer.weight)``, or normalise before the activation.\n'
                      '\n'
                      '## Options\n'
                      '- ``max-saturated-fraction`` (default ``0.5``): flag a layer when more than this fraction\n'
                      '  of its outputs is saturated (the threshold SageMaker Debugger uses).\n'},
    'IL008': {'code': 'IL008',
              'name': 'symmetric-init',
              'severity': 'warning',
              'role': 'cause',
              'summary': 'constant or zero weights, and units that are exact copies of each other (weights and bias '
                         'compared in full)',
              'options': {},
              'option_ranges': {},
              'needs': ('graph',),
              'uses': (),
              'page': '# IL008 `symmetric-init`\n'
                      '\n'
                      'Severity: **warning**. Role: cause. Needs: graph.\n'
                      '\n'
                      '## What it does\n'
                      'Finds weight layers (Linear, Conv) whose weights cannot break symmetry: every value\n'
                      'equal (``nn.init.constant_``), all zero in a layer whose output feeds further weight\n'
                      'layers, or units that are exact copies of each other (the same weights and the same\n'
                      'bias).\n'
                      '\n'
                      'Copies are found exactly: each unit (its row of weights and its bias) is hashed to two\n'
                      'random projections, units whose hashes match are candidates, and every candidate pair is\n'
                      'then compared value by value. A count of copies is never an estimate, and units whose\n'
                      'weights agree but whose biases differ are not copies. Units of different groups of a\n'
                      'grouped convolution read different inputs and are never compared.\n'
                      '\n'
                      '## Why is this bad?\n'
                      'A unit that copies another computes the same output for every input: the layer has\n'
                      'fewer distinct units than it seems. As long as what lies downstream treats the copies\n'
                      'alike (the classic case: every layer initialised to one constant) they also receive the\n'
                      'same gradient and stay copies for the whole of training. An all-zero hidden layer\n'
                      'blocks the backward signal (``delta_{l-1} = W_l^T delta_l = 0``), so nothing below it\n'
                      'learns through it. It stays zero when its own gradient ``delta_l (x) x`` is zero too:\n'
                      'when it reaches the next weight layer through a ReLU (``ReLU(0) = 0`` with derivative 0),\n'
                      'or when that next layer is all zero as well. Through anything else (GELU, tanh, no\n'
                      'activation) it moves on its first step, and the layers below it wait for that one step\n'
                      'only: it is not flagged (Grounding DINO zeroes the last layer of its reference-point head,\n'
                      "which feeds its decoder's attention).\n"
                      '\n'
                      'A zero filter in front of a per-channel norm makes its channel constant over the batch.\n'
                      'Without a bias the norm outputs its shift ``beta`` there; ``ReLU(0) = 0`` with zero\n'
                      'gradient, so the channel is frozen under SGD and Adam alike. With a bias the channel is\n'
                      'its bias plus rounding noise of about ``1e-7``, which the norm divides by\n'
                      '``sqrt(var + eps) ~ sqrt(eps)``: some of those channels pass the ReLU with gradients\n'
                      "hundreds of times the live channels', the others stay frozen (13 zero filters of 16,\n"
                      "torch-audit's ``demo_cv``: 5-8 noisy channels with 200-400x gradients).\n"
                      '\n'
                      'Deliberate cases are not flagged. Normalisation scales and shifts are not weight\n'
                      'layers. A zero-initialised layer whose output is added to a residual stream before any\n'
                      "other weight layer (zero-init of a residual branch's last layer or last BatchNorm gamma,\n"
                      'Fixup, ReZero, SkipInit) or that produces the model output (a zero-initialised\n'
                      'classifier head) starts as the identity of the block or a uniform prediction, and its\n'
                      'gradient is not zero, because its input is not. So does a zero-initialised layer whose\n'
                      "output goes into a softmax: Deformable DETR's attention weights over its sampling points\n"
                      '(``constant_(attention_weights.weight, 0.0)``, kept by RT-DETR, D-FINE, DEIM and Grounding\n'
                      'DINO) start uniform, and the layer learns from its first step. A constant depthwise\n'
                      'convolution (one unit per group) is a fixed filter per channel, not a set of copies. Nor\n'
                      'is a sub-pixel convolution initialised as nearest-neighbour upsampling (ICNR; the\n'
                      "Nemotron diarizer's upsampler): its output is reshaped so that the units that copy each\n"
                      'other fill the same channel at different positions, where targets that differ by position\n'
                      'give them different gradients.\n'
                      '\n'
                      'A layer the model runs with autograd off (a ``torch.no_grad`` block of its own) gets no\n'
                      "gradient from the model's loss, so whether its units part is up to whatever else trains it:\n"
                      "the finding is information. GLM-5-Next's sparse-attention indexer\n"
                      'scores its keys under ``no_grad`` with a gate its ``_init_weights`` sets to ones; such\n'
                      'indexers are trained with a loss of their own.\n'
                      '\n'
                      '## Example\n'
                      '```python\n'
                      'def constant_and_zero_hidden_layers():\n'
                      '    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), '
                      'nn.Linear(64, 10))\n'
                      '    nn.init.constant_(model[0].weight, 0.1)  # every unit computes the same thing\n'
                      '    nn.init.zeros_(model[2].weight)\n'
                      '    return model\n'
                      '```\n'
                      'Flagged at ``0``, ``2``.\n'
                      '\n'
                      'Passed:\n'
                      '```python\n'
                      'def zero_initialised_classifier_head():\n'
                      '    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))\n'
                      '    nn.init.kaiming_normal_(model[0].weight, nonlinearity="relu")\n'
                      "    nn.init.zeros_(model[2].weight)  # deliberate: the head's gradient still differs per unit\n"
                      '    return model\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      'Draw the weights at random with the scale the next activation needs:\n'
                      '``nn.init.kaiming_normal_(hidden.weight, nonlinearity="relu")``. For an embedding, or an\n'
                      'output layer over a vocabulary or classes, small random values:\n'
                      "``nn.init.normal_(embedding.weight, std=0.02)``, or the layer's own\n"
                      '``reset_parameters()``.\n'
                      '\n'
                      '## Options\n'
                      'None.\n'},
    'IL009': {'code': 'IL009',
              'name': 'non-finite',
              'severity': 'error',
              'role': 'check',
              'summary': 'NaN/Inf in the forward or backward probe, at the first op where it appears',
              'options': {},
              'option_ranges': {},
              'needs': ('activations',),
              'uses': (),
              'page': '# IL009 `non-finite`\n'
                      '\n'
                      'Severity: **error**. Role: check. Needs: activations.\n'
                      '\n'
                      '## What it does\n'
                      "Looks for NaN or Inf in the forward probe (every op's output) and in the backward\n"
                      "probe (every weight's gradient), and names the first op where it appears together with\n"
                      "the largest magnitude of that op's input.\n"
                      '\n'
                      'Infinities used on purpose are not reported: ``-inf`` in attention masks flows through\n'
                      'additions and disappears in the softmax, and a ``log_softmax`` turns an entry masked with\n'
                      '``-inf`` into a log-probability of ``-inf``. An Inf counts only in the output of a weight\n'
                      'layer, activation, normalisation, softmax or attention (a ``log_softmax`` only when none of\n'
                      'its inputs held an Inf already), or in a gradient. NaN counts anywhere. Every value is\n'
                      "exact: NaN and Inf are read from each op's measured extremes and norm, which carry them.\n"
                      '\n'
                      '## Why is this bad?\n'
                      'A non-finite value spreads to everything computed from it; one NaN in the forward pass\n'
                      'makes the loss NaN and every gradient NaN, and training is over at step one. At\n'
                      'initialisation it means the signal overflowed (a float32 holds at most 3.4e38, reached\n'
                      'after some 40 layers of ``randn`` weights of width 100) or an op met an invalid input\n'
                      '(``log`` of a negative, ``0/0``).\n'
                      '\n'
                      '## Example\n'
                      '```python\n'
                      'def deep_linear_stack_with_randn_weights():\n'
                      '    model = nn.Sequential(*[nn.Linear(100, 100) for _ in range(50)])\n'
                      '    for layer in model:\n'
                      '        nn.init.normal_(layer.weight)  # std 1: the signal grows 10x per layer\n'
                      '    return model\n'
                      '```\n'
                      'Flagged at ``37``, ``49``.\n'
                      '\n'
                      'Passed:\n'
                      '```python\n'
                      'def deep_linear_stack_at_lecun_init():\n'
                      '    model = nn.Sequential(*[nn.Linear(100, 100) for _ in range(50)])\n'
                      '    for layer in model:\n'
                      '        nn.init.normal_(layer.weight, std=0.1)\n'
                      '    return model\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      'Initialise for the activations (IL001) so the signal stays bounded; for an invalid\n'
                      'input, guard the op (``clamp_min`` before ``log``/``sqrt``, an ``eps`` in divisions).\n'
                      '\n'
                      '## Options\n'
                      'None.\n'},
    'IL010': {'code': 'IL010',
              'name': 'unused-suppression',
              'severity': 'info',
              'role': 'meta',
              'summary': 'a suppression that silenced nothing',
              'options': {},
              'option_ranges': {},
              'needs': ('graph',),
              'uses': (),
              'page': '# IL010 `unused-suppression`\n'
                      '\n'
                      'Severity: **info**. Role: meta. Needs: graph.\n'
                      '\n'
                      '## What it does\n'
                      'Reports a suppression that silenced nothing: a ``per-module-ignores`` entry of the\n'
                      'configuration, or an ``@initlint.ignore(...)`` decorator (or a ``__initlint_ignore__``\n'
                      'attribute) on a module class or on the model, whose codes matched no finding. The\n'
                      'pipeline emits this finding itself, after the other rules ran and their findings were\n'
                      'filtered (``initlint.rules.suppress``); this class only documents the code, and its own check\n'
                      'finds nothing.\n'
                      '\n'
                      'A suppression is only judged when the rules it names ran: ignoring ``IL003`` while\n'
                      '``--select IL001`` is in force is not reported. The finding names the pattern or the\n'
                      'class and the codes that went unused, and points at the class definition for in-code\n'
                      'suppressions.\n'
                      '\n'
                      '## Why is this bad?\n'
                      'Suppressions outlive the problems they hid. Once the init is fixed, or the module is\n'
                      'renamed so that the pattern no longer matches, the ignore does nothing except hide the\n'
                      '*next* problem of that kind at that place, and a pattern with a typo never worked at\n'
                      "all. Reporting unused suppressions keeps the list honest, as ruff's ``RUF100`` does\n"
                      'for ``# noqa`` comments.\n'
                      '\n'
                      '## Example\n'
                      '```toml\n'
                      '[tool.initlint.per-module-ignores]\n'
                      '"decoder.*" = ["IL004"]    # the model has no module called decoder\n'
                      '```\n'
                      '```python\n'
                      '@initlint.ignore("IL001", reason="scaled later by the optimizer")\n'
                      'class Block(nn.Module):     # ... whose layers are all initialised correctly\n'
                      '    ...\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      'Delete the entry or the decorator (or drop the unused codes from it). If the pattern\n'
                      'was meant to match, compare it with the module paths in the report: patterns are\n'
                      'matched with ``fnmatch`` against the full dotted path of the module or any of its\n'
                      'ancestors, so ``encoder.layers.*`` silences ``encoder.layers.3.attn.out_proj`` too.\n'
                      '\n'
                      '## Options\n'
                      'None. The finding is informational and does not fail ``initlint check`` at the default\n'
                      '``--fail-on warning``; ``--ignore IL010`` turns it off.\n'},
    'IL011': {'code': 'IL011',
              'name': 'attention-saturation',
              'severity': 'warning',
              'role': 'symptom',
              'summary': 'Attention rows are near one-hot at initialisation (judged against the keys each query may see).',
              'options': {'min-entropy': 0.5, 'max-standard-score-std': 2.0},
              'option_ranges': {'min-entropy': (0, 1), 'max-standard-score-std': (0, None)},
              'needs': ('activations',),
              'uses': (),
              'page': '# IL011 `attention-saturation`\n'
                      '\n'
                      'Severity: **warning**. Role: symptom. Needs: activations.\n'
                      '\n'
                      '## What it does\n'
                      'Measures the attention rows of every attention op at initialisation: calls of\n'
                      '``F.scaled_dot_product_attention`` (with ``attn_mask``, ``is_causal``, ``scale`` and grouped\n'
                      'query heads), ``nn.MultiheadAttention``, and hand-written ``softmax(q @ k^T * scale + mask)``.\n'
                      "For a sample of heads and query rows it computes each row's entropy divided by\n"
                      '``ln(n)``, where ``n`` is the number of keys the row may attend to (the mask decides:\n'
                      'causal masks, padding masks, boolean masks and additive masks of ``-inf`` or large finite\n'
                      'negatives such as ``torch.finfo(dtype).min`` or ``-9e15`` all remove keys), and flags ops\n'
                      'whose mean is low: rows close to one-hot.\n'
                      '\n'
                      'It then names the cause from the scale of the scores, ``std(q . k) * scale``:\n'
                      '- the **scale**: it differs from ``head_dim ** -0.5`` and q and k are of the usual size\n'
                      '  (the scores would be fine with the usual scale), as with ``dim_head ** 0.5`` written\n'
                      '  for ``dim_head ** -0.5``;\n'
                      '- the **q/k projections**: their weights are far above ``1 / sqrt(fan_in)`` (gain above 2), or\n'
                      '  above it at all while their input is of about unit scale (rms at most 2, as after a norm),\n'
                      '  so that only the weights can make the scores large;\n'
                      '- the **signal feeding them**: the weights are normal but their input is large (no\n'
                      '  normalisation before the attention).\n'
                      '\n'
                      '## Why is this bad?\n'
                      'For ``q`` and ``k`` with i.i.d. entries of scale ``s_q`` and ``s_k``, ``q . k`` over\n'
                      '``d = head_dim`` dimensions has standard deviation ``sqrt(d) * s_q * s_k``; the usual scale\n'
                      '``d ** -0.5`` brings the scores to ``s_q * s_k``, about 1 when the projections keep their\n'
                      "input's scale. With score standard deviation ``sigma`` a row's entropy is about\n"
                      '``ln(n) - sigma^2 / 2`` while ``sigma`` is small, and falls to 0 (one-hot) once ``sigma`` is\n'
                      'several times ``sqrt(2 ln n)``. A one-hot row passes almost no gradient: the softmax\n'
                      'Jacobian ``diag(p) - p p^T`` vanishes when ``p`` is one-hot, so the queries and keys do not\n'
                      "learn and each token copies one other token's value. Entropy is judged against the keys a\n"
                      'query may see, so the first rows of causal attention (one or two keys) and padded keys are\n'
                      'never mistaken for saturation; rows left with a single key are not judged at all. Where the\n'
                      'softmax is written out (``softmax(q @ k^T + mask)``), a row whose other probabilities are\n'
                      'exactly 0 is either masked down to one key or saturated; with scores of std up to 3 a\n'
                      "gap between a row's two largest scores of 17, at which ``exp`` underflows in float16, has a\n"
                      "chance of 6e-5 per row, so such rows are a mask's (Grounding DINO's text self-attention on text "
                      'with no\n'
                      'phrase delimiters lets each token see only itself) and are not judged.\n'
                      '\n'
                      "How it depends on the sequence's length: the same scores look less saturated over more\n"
                      "keys, because the entropy's shortfall grows more slowly than ``ln(n)``. Gaussian scores of\n"
                      'std 3 give a mean normalised entropy of 0.41 over 16 keys, 0.44 over 64, 0.47 over 512\n'
                      'and 0.51 over 2048; std 2 gives 0.60 to 0.75 and std 4 0.31 to 0.35. A fixed limit on the\n'
                      'entropy would flag scores of std 2.8 at 16 tokens and pass them at 2048. So the limit is\n'
                      'stated at 64 keys (``min-entropy``, 0.5: Gaussian scores of std 2.62) and moved to the key\n'
                      "count of the rows judged (``exp`` of their mean ``ln(keys)``; a causal op's rows see 1 to\n"
                      '``n``): it is the entropy that scores of std 2.62 give there, from fixed Gaussian draws\n'
                      '(0.46 over 8 keys, 0.47 over 16, 0.55 over 512, 0.59 over 2048, 0.69 from 65536 on). The\n'
                      "verdict is then one of the scores' spread, whatever the probe's length. The finding gives\n"
                      'the limit it used and the key count.\n'
                      '\n'
                      'What the limit claims about training (``benchmarks/wide_init_proxy.py --inits\n'
                      'score=2,score=2.5,score=2.8,score=3.1``: the Llama proxy below with q and k drawn for the\n'
                      "scores' std asked for, audited on the task's 64 tokens): the slowdown grows smoothly with\n"
                      "the scores' std, with no step. The task was learnt at steps 74-77 with scores of std 1,\n"
                      '92-102 at std 2, 107-109 at 2.5 (not flagged), 116-120 at 2.8 and 121-124 at 3.1 (both\n'
                      'flagged), 126-127 at 3.3. The limit flags inits that learn 1.5x slower or more.\n'
                      '\n'
                      "At a width its init was not made for: Hugging Face's fixed std 0.02 in Llama-3-70B's shape\n"
                      '(hidden 8192, head dim 128) gives q and k a gain of 1.81 each (std x sqrt(fan_in)) on their\n'
                      'normalised input, and scores of std 3.3 (mean entropy 0.36-0.40 over 32 tokens; the 8B\n'
                      'shape, hidden 4096: std 1.6, not flagged). A Llama of the same head dimension at hidden 256\n'
                      'drawn with the same statistics (``benchmarks/wide_init_proxy.py``: a copy task, AdamW, two\n'
                      "seeds) learnt the task at steps 126-127, against 69-72 with its own width's init and 74-77\n"
                      'with q and k at std ``1 / sqrt(fan_in)`` and the rest unchanged; scores of std 6 took\n'
                      "159-168 steps and std 10 231-246; the 8B's statistics 74-80. The finding then names the\n"
                      'projections, not the input, and the std the width needs.\n'
                      '\n'
                      'The statistics come from at most 512 rows per op, 8 heads x 64 query rows (more heads where\n'
                      "the sequence is shorter than 64 tokens): a row's normalised entropy lies in [0, 1], so the\n"
                      "mean's standard error is below 0.022, and the heads of a layer are alike at initialisation\n"
                      '(i.i.d. weights).\n'
                      '\n'
                      'A layer the model runs with autograd off (a ``torch.no_grad`` block of its own) passes no\n'
                      "gradient of the model's loss either way: its finding is information.\n"
                      '\n'
                      '## Example\n'
                      '```python\n'
                      'def attention_with_its_scale_inverted():\n'
                      '    class Attention(nn.Module):\n'
                      '        def __init__(self, dim=256, heads=8, dim_head=32):\n'
                      '            super().__init__()\n'
                      '            self.heads, self.scale = heads, dim_head ** 0.5  # should be dim_head ** -0.5\n'
                      '            self.to_qkv = nn.Linear(dim, heads * dim_head * 3, bias=False)\n'
                      '\n'
                      '        def forward(self, x):\n'
                      '            q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in '
                      'self.to_qkv(x).chunk(3, dim=-1))\n'
                      '            attn = (q @ k.transpose(-1, -2) * self.scale).softmax(dim=-1)\n'
                      '            return (attn @ v).transpose(1, 2).flatten(2)\n'
                      '\n'
                      '    return Attention(), torch.randn(2, 32, 256)\n'
                      '```\n'
                      'Flagged at ``<model>``.\n'
                      '\n'
                      'Passed:\n'
                      '```python\n'
                      'def attention_scaled_by_dim_head_to_the_minus_half():\n'
                      '    model, x = attention_with_its_scale_inverted()\n'
                      '    model.scale = 32 ** -0.5\n'
                      '    return model, x\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      "Use the scale ``head_dim ** -0.5`` (or leave SDPA's ``scale`` at its default):\n"
                      '```python\n'
                      'self.scale = dim_head ** -0.5\n'
                      '```\n'
                      'For oversized projections, initialise them with ``std = 1 / sqrt(fan_in)`` (or a\n'
                      "transformer's usual 0.02) rather than ``N(0, 1)``; for a large input, normalise it\n"
                      '(``nn.LayerNorm``) before the projections. The value path is not the cause and is never\n'
                      'the fix.\n'
                      '\n'
                      '## Options\n'
                      '- ``min-entropy`` (default ``0.5``): flag when the mean row entropy divided by\n'
                      '  ``ln(admissible keys)`` is below this, over 64 keys; over other key counts, below the\n'
                      '  entropy that scores as spread give there (above). Healthy attention at init scores 0.85\n'
                      '  to 1; scores with standard deviation 3 over 64 keys about 0.44; one-hot rows 0.\n'
                      '- ``max-standard-score-std`` (default ``2``): the scores q and k would give under the usual\n'
                      '  scale ``head_dim ** -0.5``; at or below this the projections are of a normal size and a\n'
                      "  saturated op's cause is its scale.\n"},
    'IL012': {'code': 'IL012',
              'name': 'residual-growth',
              'severity': 'warning',
              'role': 'symptom',
              'summary': 'A residual branch dwarfs the stream it is added to at initialisation.',
              'options': {'max-post-norm-ratio': 1.0,
                          'max-branch-ratio': 4.0,
                          'max-embedding-ratio': 100.0,
                          'zero-branch-ends': False},
              'option_ranges': {'max-post-norm-ratio': (0, None),
                                'max-branch-ratio': (0, None),
                                'max-embedding-ratio': (0, None)},
              'needs': ('activations',),
              'uses': (),
              'page': '# IL012 `residual-growth`\n'
                      '\n'
                      'Severity: **warning**. Role: symptom. Needs: activations.\n'
                      '\n'
                      '## What it does\n'
                      '    Finds the residual additions of the model (``x + f(x)``: an ``add`` whose one input is\n'
                      '    computed from the other through at least one weight layer, and not only through the branch\n'
                      "    of an earlier residual addition: RT-DETR's next query, ``norm(h + attn(h + pos)) + pos``,\n"
                      '    is no residual of its positions ``pos``; nor is a sum read only as the queries or keys of\n'
                      "attentions, as SAM's ``attn(q=queries + pe, ...)`` while ``queries`` goes on as the stream) and "
                      'compares, at each, the\n'
                      '    scale (root mean square) of what the branch adds with the scale of the stream it is added\n'
                      '    to. It flags branches that dwarf the stream at initialisation, at the layer the excess comes\n'
                      '    from: a weight layer of the branch whose scale is more than 4x what a sound init gives it\n'
                      '    (``gain / sqrt(fan_in)`` for the activation after it) or 4x the same layer in the other\n'
                      "    blocks (``h.0.mlp.c_fc`` for ``h.1.mlp.c_fc``), else the branch's output projection.\n"
                      '    Three kinds of addition have\n'
                      '    their own limit: post-norm ones (``LN(x + f(x))`` on a normalised stream: BERT, the\n'
                      '    original Transformer), the first branch added to an embedding or to the model input, and\n'
                      '    all others (pre-norm blocks ``x + f(LN(x))`` as in GPT-2 and Llama, plain residuals). An\n'
                      '    embedding into which a vision-language model writes its image features\n'
                      "    (``masked_scatter``, as GOT-OCR2 and LLaVA do) is still an embedding: the vision tower's\n"
                      '    final norm does not make it a built-up stream.\n'
                      '\n'
                      '    A branch over the limit on a pre-norm stream is reported as information, not a warning,\n'
                      '    when a later branch on the same stream adds at least ``1 / max-branch-ratio`` of what it\n'
                      '    adds and none of its layers is out of scale against the same layer in the other blocks:\n'
                      "    the stream is then rebuilt at the branches' scale, as when every block is scaled alike,\n"
                      "    not drowned by one block (hybrids whose first mixer adds little at init: Nemotron-H's and\n"
                      "    Lara-mini's MLPs after a Mamba or linear-attention layer).\n"
                      '\n'
                      "    On sequences longer than 16 tokens, both scales are taken over each sequence's first 16\n"
                      '    positions. Causal attention at init spreads each query evenly over the tokens before it, so\n'
                      '    what it adds at position ``t`` shrinks as ``1 / sqrt(t)``: over a whole sequence of 512\n'
                      "    tokens, Llama's first attention branch adds 0.12 to an embedding of 0.02, over 16 tokens\n"
                      '    0.44, and the MLP branch after it (0.72 at any length) would be judged 5.7x the stream at\n'
                      '    512 tokens and 1.6x at 16. Training sharpens the attention within a few steps, so the\n'
                      '    averaged scale says nothing of the weights. Position ``t`` of a causal model sees only the\n'
                      '    tokens up to ``t``, so the first 16 positions give the same ratio at 16, 512 or 2048\n'
                      '    tokens. Bidirectional attention averages over the whole sequence at every position; there\n'
                      '    the attention branches shrink with the length at all positions, and what follows them is\n'
                      "    compared with a smaller stream (ModernBERT and x-transformers' ``Encoder`` audit clean at\n"
                      '    16, 512 and 2048 tokens, BERT at 16 and 512).\n'
                      '\n'
                      '    ## Why is this bad?\n'
                      '    After ``x_{l+1} = x_l + f_l(x_l)`` with a branch independent of the stream,\n'
                      '    ``Var(x_{l+1}) = Var(x_l) + Var(f_l)``: the stream is the sum of the embedding and every\n'
                      "    earlier branch. A branch ``r`` times larger than the stream leaves the stream's earlier\n"
                      '    content (the embedding, the earlier blocks) a share ``1 / (1 + r^2)`` of the variance: the\n'
                      '    skip connection, whose point is to carry the input and the gradient through depth, is\n'
                      '    drowned. In a post-norm block the norm then rescales everything, so the identity path\n'
                      '    shrinks by ``sqrt(1 + r^2)`` at every block and compounds. In a pre-norm stack, scaling\n'
                      "    every branch alike changes nothing but the embedding's share (each branch sees a\n"
                      '    normalised input, and the final norm undoes the scale); a single block that dwarfs what\n'
                      '    the stream gathered before it does matter.\n'
                      '\n'
                      '    Calibration. ``benchmarks/residual_training.py`` trains a small GPT (width 128, 4 blocks,\n'
                      "    GPT-2's init) on a copy task, with output projections scaled up, 2 seeds each, 250 AdamW\n"
                      '    steps; the unscaled model learns the copy (loss below 1) after about 85-110 steps:\n'
                      '    - post-norm, every block scaled: learning slows as the ratio grows (0.02 unscaled: 85\n'
                      '      steps; 0.19: 108-118; 0.6: 192 steps in one seed, never in the other) and stops from\n'
                      "      ratio 2 (x100) on. BERT-base's default (0.37) and ``nn.TransformerEncoder``'s (0.26) lie\n"
                      '      in the range where this model still learns; the limit 1 sits between them and the\n'
                      '      ratio at which it never learns (2);\n'
                      '    - pre-norm, one block (the third of four) scaled: ratio 2.6 (x10) learns 25-45% later and\n'
                      '      its loss spikes afterwards; ratio 5 (x30) takes 1.5-2x as long, ratio 16 (x100) 1.5-2.3x;\n'
                      '    - pre-norm, every block scaled: no harm up to x1000 (the first branch 193x the\n'
                      '      embedding); it even learns sooner (69 steps);\n'
                      "    - pre-norm, only the MLP's output projection of every block scaled (``--branch mlp``,\n"
                      '      3 seeds), so that the first MLP dwarfs a stream of the embedding and one small attention\n'
                      '      branch and every later MLP matches it: ratio 6.6 (x10), 20 (x30) and 66 (x100) learned\n'
                      '      at steps 84-90, the unscaled model at 96-109. A branch that later branches match is\n'
                      '      therefore information; one that stands out (the single scaled block above) warns.\n'
                      '    On 255 tokens (the 32 tokens repeated 8 times, batch 8) every model the limits flag failed\n'
                      '    to learn in 250 steps (post-norm x100, one pre-norm block x30), and so did post-norm x30\n'
                      '    (ratio 0.58) below them; the unscaled pre-norm model learned it in one seed of two, too few\n'
                      '    to move the limits.\n'
                      '    Post-norm recipes train with a learning-rate warm-up (BERT, ALBERT), so the post-norm runs\n'
                      '    were repeated with one (``--warmup``): over 25 of the 250 steps, x30 (ratio 0.59) learned at\n'
                      '    steps 124-126 (without: 192 in one seed, never in the other) and x100 (ratio 1.95) never did;\n'
                      '    over 100 steps, x100 learned in one seed of two, at step 239. The limit holds with a warm-up.\n'
                      "    ALBERT's default config (xxlarge: hidden 4096, feed-forward 16384, std 0.02) is flagged at\n"
                      '    2.2x; it was pre-trained from that init with LAMB and a 3125-step warm-up, a recipe these\n'
                      '    runs do not reproduce.\n'
                      '    Default initialisations stay below the limits with room to spare, measured at real width\n'
                      '    and depth: post-norm BERT-base at most 0.37, ``nn.TransformerEncoder`` 0.26; pre-norm GPT-2\n'
                      '    (12 x 768) at most 2.0 (its first MLP on 32 tokens; 2.55 on 1024), Llama (hidden 1024, 32\n'
                      "    layers) 1.5, T5-small 0.72, ViT-B/16 0.65, x-transformers' ``Decoder`` 1.34; first branches\n"
                      '    on the embedding: Llama 7.7, x-transformers 1.6, GPT-2 0.8. An embedding drowned beyond\n'
                      '    ``max-embedding-ratio`` is reported as information only, since the experiment found no\n'
                      '    harm in it.\n'
                      '\n'
                      '    One layer out of scale inside a branch. ``benchmarks/gpt2_corrupt_layer.py`` redraws one\n'
                      '    weight of Hugging Face GPT-2 (width 768, 2 blocks) at std 1 (27.7x ``1/sqrt(768)``) and\n'
                      '    trains a copy task, 3 seeds, 100 AdamW steps; the intact model learns it after 37-41\n'
                      "    steps. The last block's ``c_fc`` (branch 47x the stream) learns it after 48-49 steps, 25%\n"
                      "    later, like the calibration's single over-scaled block; the first block's ``c_fc`` (151x)\n"
                      '    and its ``c_proj`` scaled x50 (127x) learn it sooner (27-34 steps); ``c_attn`` at std 1\n'
                      '    never learns it (IL011). So the branch keeps its warning, located at the layer whose\n'
                      '    scale is off, and that layer gets no separate IL001 finding (the norm after the branch\n'
                      "    undoes its scale, and what harm there is is the branch's).\n"
                      '\n'
                      '    ## Example\n'
                      '```python\n'
                      'def pre_norm_transformer_with_one_output_projection_times_thirty():\n'
                      '    layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True, '
                      'norm_first=True)\n'
                      '    model = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)\n'
                      '    with torch.no_grad():\n'
                      "        model.layers[2].linear2.weight.mul_(30)  # the third block's MLP output projection\n"
                      '    return model, torch.randn(2, 32, 256)\n'
                      '```\n'
                      'Flagged at ``layers.2.linear2``.\n'
                      '\n'
                      'Passed:\n'
                      '```python\n'
                      'def pre_norm_transformer_at_default_init():\n'
                      '    layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True, '
                      'norm_first=True)\n'
                      '    return nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False), torch.randn(2, '
                      '32, 256)\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      '    When one layer of the branch is out of scale (a weight drawn with ``randn``, a layer\n'
                      '    multiplied by mistake), re-initialise that layer, at the scale of the same layer in the\n'
                      '    other blocks or of a sound init for its fan-in; shrinking the healthy output projection to\n'
                      '    compensate would hide it:\n'
                      '    ```python\n'
                      '    nn.init.normal_(model.transformer.h[1].mlp.c_fc.weight, std=0.02)  # as '
                      'transformer.h.0.mlp.c_fc\n'
                      '    ```\n'
                      "    When every layer is at a sound scale, initialise the branch's output projection smaller,\n"
                      '    so that what the branch adds is at most comparable with the stream (GPT-2 and nanoGPT use\n'
                      '    ``0.02 / sqrt(2 * n_layers)``):\n'
                      '    ```python\n'
                      '    nn.init.normal_(block.output.dense.weight, std=0.02)\n'
                      '    ```\n'
                      '\n'
                      '    ## Options\n'
                      '    - ``max-post-norm-ratio`` (default ``1``): flag a post-norm block whose branch is larger\n'
                      '      than the normalised stream it is added to.\n'
                      '    - ``max-branch-ratio`` (default ``4``): flag any other residual branch that exceeds the\n'
                      '      stream by more than this factor.\n'
                      '    - ``max-embedding-ratio`` (default ``100``): report (as information) a first branch that\n'
                      '      exceeds the embedding or model input it is added to by more than this factor.\n'
                      '    - ``zero-branch-ends`` (default ``false``): when no layer of the branch is out of scale,\n'
                      "      ``initlint fix`` zeroes the branch's last layer (weight and bias; the block starts as the\n"
                      "      identity, as in Fixup, SkipInit and DiT's adaLN-Zero) instead of drawing it at the\n"
                      "      depth-aware scale, where that layer's output goes to the addition and nowhere else and its\n"
                      "      weight is not shared. The branch's earlier layers then get no gradient in the first step\n"
                      '      only. ``benchmarks/bench_trainability.py`` trains both repairs (column ``fix, zero '
                      'ends``).\n'},
    'IL013': {'code': 'IL013',
              'name': 'token-collapse',
              'severity': 'warning',
              'role': 'symptom',
              'summary': 'The tokens of a sequence become near-identical through depth (rank collapse).',
              'options': {'max-cosine': 0.95, 'min-rise': 0.3},
              'option_ranges': {'max-cosine': (0, 1), 'min-rise': (0, 1)},
              'needs': ('activations',),
              'uses': (),
              'page': '# IL013 `token-collapse`\n'
                      '\n'
                      'Severity: **warning**. Role: symptom. Needs: activations.\n'
                      '\n'
                      '## What it does\n'
                      'Follows how similar the tokens of one sequence are as the signal goes through depth:\n'
                      'at every block output (the residual stream after each residual addition, or, in a stack\n'
                      'without residual connections, the output of each attention layer) it measures the mean\n'
                      'pairwise cosine similarity of the token vectors, and flags a sequence whose tokens have\n'
                      'become near-identical by the last block although they were not at the start.\n'
                      '\n'
                      '## Why is this bad?\n'
                      'At initialisation attention is close to uniform, so an attention layer replaces every\n'
                      'token by nearly the same average of all tokens: ``softmax(Q K^T) V ~ (1/n) 1 1^T V``.\n'
                      "Without a residual path that carries each token's own vector, the tokens' differences\n"
                      'shrink with every layer, doubly exponentially in depth for pure attention (Dong et al.\n'
                      '2021, "Attention is not all you need: pure attention loses rank doubly exponentially with\n'
                      'depth"): the representation collapses to rank one. Then every token gets the same output,\n'
                      'and the gradients of the queries and keys vanish (Noci et al. 2022, "Signal propagation in\n'
                      'transformers: theoretical perspectives and the role of rank collapse"), so the attention\n'
                      'cannot learn to tell the tokens apart. The mean pairwise cosine of the token vectors is 1\n'
                      'exactly when they are all parallel.\n'
                      '\n'
                      'Healthy transformers drift towards it slowly at init (near-uniform attention adds the\n'
                      'same vector to every token): GPT-2 (12 layers) ends near 0.6, Llama (32 layers) near 0.8,\n'
                      'the T5 decoder near 0.85; attention-only stacks reach 0.99 within a few layers. A stream\n'
                      "that attends to another sequence (a decoder's cross-attention to the encoder output) is\n"
                      'not judged from that block on: near-uniform cross-attention adds the same summary of the\n'
                      "other sequence to every token by design (``nn.Transformer``'s post-norm decoder reaches\n"
                      '0.98 at its default init and trains). Each residual stream is judged from where it\n'
                      "begins (an encoder's and a decoder's, a backbone's patches and a DETR-style decoder's\n"
                      'object queries), and a stream that begins at a tensor the forward creates is not judged:\n'
                      "DETR's and MaskFormer's queries start as one zero vector (``torch.zeros_like``), told\n"
                      'apart only by the positions added to their queries and keys; nor is one that begins as\n'
                      "copies of one token (OneFormer's task token, repeated for every query). Where every\n"
                      "residual block also attends to another sequence (LightGlue's self- and cross-attention\n"
                      'between two images), no stream is judged, and the one attention layer of each block is\n'
                      'not read as a stack without residual connections. The\n'
                      'similarity is measured on 2 sequences of the probe batch, 64 tokens each (2016 pairs per\n'
                      'sequence), cheap next to the layer itself.\n'
                      '\n'
                      "How it depends on the sequence's length: the 64 tokens are spread evenly over the\n"
                      'sequence. Uniform attention over more tokens gives each token an average of more values,\n'
                      'and those averages of independent values are smaller, so in a model with residual paths\n'
                      'they move each token less and the similarity falls as the sequence grows: GPT-2 124M at\n'
                      'default init ends at 0.55 on 64 tokens, 0.46 on 512 and 0.44 on 1024. A stack without\n'
                      'residual paths collapses at any length. The real-size zoo audits clean at 16 and 512 tokens\n'
                      'and, for the models whose positions and depth allow it, at 2048.\n'
                      '\n'
                      '## Example\n'
                      '```python\n'
                      'def attention_only_stack():\n'
                      '    class AttentionOnly(nn.Module):\n'
                      '        def __init__(self, dim=256, heads=8, depth=6):\n'
                      '            super().__init__()\n'
                      '            self.layers = nn.ModuleList(nn.MultiheadAttention(dim, heads, batch_first=True) for _ '
                      'in range(depth))\n'
                      '\n'
                      '        def forward(self, x):\n'
                      '            for attn in self.layers:\n'
                      '                x = attn(x, x, x, need_weights=False)[0]  # no residual path\n'
                      '            return x\n'
                      '\n'
                      '    return AttentionOnly(), torch.randn(2, 32, 256)\n'
                      '```\n'
                      'Flagged at ``layers.1``.\n'
                      '\n'
                      'Passed:\n'
                      '```python\n'
                      'def attention_stack_with_residuals_and_norms():\n'
                      '    class Residual(nn.Module):\n'
                      '        def __init__(self, dim=256, heads=8, depth=6):\n'
                      '            super().__init__()\n'
                      '            self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(depth))\n'
                      '            self.layers = nn.ModuleList(nn.MultiheadAttention(dim, heads, batch_first=True) for _ '
                      'in range(depth))\n'
                      '\n'
                      '        def forward(self, x):\n'
                      '            for norm, attn in zip(self.norms, self.layers):\n'
                      '                h = norm(x)\n'
                      '                x = x + attn(h, h, h, need_weights=False)[0]\n'
                      '            return x\n'
                      '\n'
                      '    return Residual(), torch.randn(2, 32, 256)\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      'Keep a residual path around every attention layer (and normalise the branch input):\n'
                      '```python\n'
                      'x = x + attn(norm(x), norm(x), norm(x), need_weights=False)[0]\n'
                      '```\n'
                      'When the model has residual connections and still collapses, its branches dwarf the\n'
                      "stream (see IL012): scale each block's output projection down, for example by\n"
                      '``1 / sqrt(2 * n_layers)``.\n'
                      '\n'
                      '## Options\n'
                      '- ``max-cosine`` (default ``0.95``): flag when the mean pairwise cosine of the tokens at\n'
                      '  the last block output is above this.\n'
                      '- ``min-rise`` (default ``0.3``): and it rose by at least this much from the start of the\n'
                      "  network (inputs that are already alike are not a collapse of the network's making).\n"},
    'IL014': {'code': 'IL014',
              'name': 'init-not-applied',
              'severity': 'warning',
              'role': 'cause',
              'summary': "parameters still at PyTorch's default, or never initialised, where the model declares an init "
                         'of its own',
              'options': {'std-tolerance': 0.05},
              'option_ranges': {'std-tolerance': (0.01, 1.0)},
              'needs': ('graph',),
              'uses': (),
              'page': '# IL014 `init-not-applied`\n'
                      '\n'
                      'Severity: **warning**. Role: cause. Needs: graph.\n'
                      '\n'
                      '## What it does\n'
                      "Compares every parameter with what the model's own declared init would make it. The\n"
                      "declared init is found in the model: a Hugging Face ``PreTrainedModel``'s\n"
                      '``_init_weights``, applied to each module the way the installed transformers applies it\n'
                      '(children first, the nearest ``PreTrainedModel`` dispatching); a ``_init_weights(module)``\n'
                      'method applied through ``self.apply`` (nanoGPT); an ``init_weights()`` or\n'
                      '``reset_parameters()`` written for the model or one of its blocks (torchtitan,\n'
                      'Megatron-style code). It is run on private copies of the modules, one block at a time,\n'
                      'from a random stream of its own: the model, its parameters and the global random state\n'
                      'are not touched, and the extra memory is at most one block. A private parameter holds the\n'
                      "original's values only once the init reads them, and a random fill of a large one stands for\n"
                      'the whole tensor with 65521 values, drawn only if a later step of the init reads them (a\n'
                      'smaller one is drawn in full, and only then: a fill that a second fill overwrites is never\n'
                      'drawn); a parameter that only a ``normal_`` or ``uniform_`` fill wrote is compared with that\n'
                      "distribution's exact statistics. So the declared init costs neither a copy nor a draw of\n"
                      'the model. An init that writes a tensor outside its private copy (a layer the model keeps\n'
                      'in a plain list, reached through the original module) is stopped before the write and\n'
                      'declares nothing.\n'
                      '\n'
                      'A parameter is flagged when the declared init would change it (its std, mean, fraction\n'
                      'of exact zeros and ones, or distribution family: uniform and normal are told apart by\n'
                      'their kurtosis) and it is still where the declared init was meant to take it from:\n'
                      '\n'
                      "- **PyTorch's default**: it matches the module's own ``reset_parameters()`` (``Linear``:\n"
                      '  uniform, std ``1/sqrt(3 fan_in)``; ``Embedding``: normal, std 1) where the model\n'
                      '  declares, say, ``normal(std=0.02)``;\n'
                      "- **the init of its own module without the scaling a block applies**: GPT-2's\n"
                      "  ``_init_weights`` draws every ``Conv1D`` at std 0.02 and then rescales each block's\n"
                      '  ``c_proj`` to ``0.02 / sqrt(2 n_layer)``; a ``c_proj`` at 0.02 lost the scaling;\n'
                      '- **never initialised**: denormal values, or magnitudes of ``1e20`` and more, that no\n'
                      '  init draws (the memory of ``torch.empty`` / ``module.to_empty()``; a huge value is found\n'
                      "  through the tensor's norm, denormals through a sample of 16384 elements in 256 runs,\n"
                      '  and a tensor showing either is then read in full), or exact zeros\n'
                      "  where the declared init draws at random and the layer's output feeds further weight\n"
                      '  layers (a zero-initialised residual output or head is deliberate; see IL008).\n'
                      '  Non-finite values are left to IL009.\n'
                      '\n'
                      'A parameter that differs from both the default and the declared init (re-initialised on\n'
                      "purpose after ``post_init``, nanoGPT's ``c_proj`` rescaled after ``self.apply``) is not\n"
                      'flagged. Tensors on the ``meta`` device hold no values and are not judged.\n'
                      '\n'
                      '## Why is this bad?\n'
                      'The model trains, but not with the init its authors validated. A custom Hugging Face\n'
                      "model without ``post_init()`` keeps PyTorch's defaults (a width-128 ``Linear`` at std\n"
                      '0.051 instead of 0.02, its embedding at std 1 instead of 0.02); a nanoGPT whose\n'
                      '``self.apply(self._init_weights)`` line is missing ends 150 AdamW steps at a loss of\n'
                      '6.16-6.19 against 3.30-3.38 with its declared init (``benchmarks/declared_training.py``,\n'
                      '``ln V = 6.24``); a model moved with ``to_empty()`` and never initialised holds zeros or\n'
                      'stale memory (denormals, values up to 3e38, NaN).\n'
                      '\n'
                      '## Example\n'
                      '```python\n'
                      'def model_whose_declared_init_never_ran():\n'
                      '    model = _TinyLM(init=False)  # self.apply(self._init_weights) is missing\n'
                      '    return model, torch.randint(0, 512, (4, 16))\n'
                      '```\n'
                      'Flagged at ``blocks.0.fc``, ``blocks.0.proj``, ``blocks.1.fc``, ``blocks.1.proj``, ``embed``, '
                      '``head``.\n'
                      '\n'
                      'Passed:\n'
                      '```python\n'
                      'def model_whose_declared_init_ran():\n'
                      '    model = _TinyLM()\n'
                      '    nn.init.kaiming_normal_(model.blocks[0].fc.weight, nonlinearity="relu")  # a deliberate '
                      're-init: not flagged\n'
                      '    return model, torch.randint(0, 512, (4, 16))\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      'Run the declared init on the flagged modules, with the scalings it applies at block\n'
                      'level: ``model.transformer.h[0].attn.apply(model._init_weights)`` (the Hugging Face\n'
                      '``_init_weights`` of the model that owns them), ``model.layers[0].init_weights()``, or\n'
                      'call ``post_init()`` at the end of a custom ``PreTrainedModel.__init__`` and\n'
                      '``model.init_weights()`` after ``to_empty()``. ``initlint fix`` does this for you.\n'
                      '\n'
                      '## Options\n'
                      '- ``std-tolerance`` (default ``0.05``): two draws have the same std when the ratio is\n'
                      "  within ``1 +- std-tolerance`` (on top of the sampling noise of the tensors' sizes).\n"
                      '  Two draws of one init differ by sampling noise only; ``xavier_uniform_`` on a 4x\n'
                      "  wider layer is 9.5% away from PyTorch's ``Linear`` default, which 0.05 tells apart.\n"
                      "  PyTorch's ``Linear`` default and ``normal(std=0.02)`` differ by 4% at width 768: the\n"
                      '  distribution family, not the std, tells those apart.\n'},
    'IL015': {'code': 'IL015',
              'name': 'update-scale',
              'severity': 'warning',
              'role': 'cause',
              'summary': "the optimizer's first step moves a weight by a large share of its size",
              'options': {'limit': 0.5},
              'option_ranges': {'limit': (0.0, None)},
              'needs': ('step',),
              'uses': (),
              'page': '# IL015 `update-scale`\n'
                      '\n'
                      'Severity: **warning**. Role: cause. Needs: step.\n'
                      '\n'
                      '## What it does\n'
                      'Takes one real step of the optimizer the model will train with (``initlint.audit(model, x,\n'
                      'optimizer=...)``, ``--optimizer``, or ``initlint_optimizer(model)`` in the target file) on a\n'
                      "private copy of the parameters and of the optimizer's state, and measures, for every weight\n"
                      'tensor (two or more dimensions; biases and norm gains are not judged), the ratio\n'
                      '``rms(first update) / rms(weight)``. A weight initialised to zero (a deliberate head, a\n'
                      "residual branch's last layer) is judged against the scale a sound init gives it,\n"
                      '``1 / sqrt(fan_in)``, not against 0. It reports the weights whose ratio is above ``limit``,\n'
                      "with the param group's lr. A weight whose output goes straight into a BatchNorm or\n"
                      'InstanceNorm in training mode (through views and elementwise ops, as IL002 follows a bias) is\n'
                      'not judged: the norm divides each channel by its batch statistics, so the loss does not\n'
                      "depend on the weight's scale.\n"
                      '\n'
                      '## Why is this bad?\n'
                      "The first steps of Adam move every entry by about ``lr`` whatever the gradient's size\n"
                      '(``m / sqrt(v) = sign(g)`` at step one). On a weight of std 0.02, the usual GPT init, lr 1e-2\n'
                      'moves each entry by half its typical size: one step rewrites the layer, the carefully\n'
                      "chosen init is gone, and the loss jumps or diverges before any warm-up helps. nanoGPT's\n"
                      'usual Adam lr 1e-3 gives a ratio near 0.14 on its output projections and is the best lr on a\n'
                      'small task, while 1e-2 (ratio 0.5) ends 2.3x worse. For SGD the ratio is ``lr * rms(grad) /\n'
                      'rms(weight)``, and the same limit holds.\n'
                      '\n'
                      'A weight that feeds a BatchNorm is another matter. Its scale cannot change the loss, and its\n'
                      'gradient is orthogonal to it, so a large step only grows its norm, which shrinks the next\n'
                      'steps relative to it: the step size corrects itself. In ``benchmarks/bench_first_step.py``\n'
                      'the conv-BatchNorm CNN trains best at Adam lr 2e-2, where its convs move by 0.59 of their\n'
                      'rms, and still trains at lr 0.1 (2.9); counting those convs cost 20 false alarms out of 160\n'
                      "findings and caught no troubled run that the other weights did not. ResNet-50's stem conv\n"
                      "moves by 2.2 of its rms in the first step of He et al.'s SGD (lr 0.1, momentum 0.9), a\n"
                      "recipe that trains. Judged without them, the calibration's limit 0.5 has precision 67% and\n"
                      'recall 100% for Adam (40 of 40 troubled runs flagged), 63% and 100% for AdamW, 95% and 46%\n'
                      'for SGD (its trouble builds up with momentum after the first step).\n'
                      '\n'
                      'A run with gradient accumulation, or data-parallel over several ranks, steps on the mean gradient\n'
                      'of several batches, and the training callbacks audit one of them (``batches_per_step=``, which\n'
                      "they pass as accumulation steps x ranks). Adam's first step moves each element its gradient\n"
                      "reaches by about lr, on one batch as on their mean (an embedding's rows one batch does not use\n"
                      "stay put: the run moves more of them). SGD's step is the gradient: the noise of one batch is\n"
                      "``sqrt(k)`` times that of the mean of ``k``, so one batch's step is larger than the run's, up to\n"
                      '``sqrt(k)`` times in expectation. For SGD the rule warns when the ratio divided by\n'
                      "``sqrt(batches_per_step)``, the least the run's step is expected to be, is above the limit, and\n"
                      "reports the ratios between as information. Where norm clipping scaled the probe's gradients by\n"
                      "``c``, the run's, smaller, are scaled less: the divisor is ``max(1, c sqrt(k))``, and a step\n"
                      'whose elements were clamped (``clip_grad_value_``) is judged as the probe took it. In\n'
                      '``benchmarks/bench_micro_batch.py`` (the 160 SGD runs of the calibration, each audited again on\n'
                      "1/8 of its first batch), one micro-batch's ratio flagged 33 runs, 13 of them clean on the run's\n"
                      "own batch, at 73% precision; divided by ``sqrt(8)`` it flagged 15, none clean on the run's\n"
                      'batch, at 93% precision.\n'
                      '\n'
                      '## Example\n'
                      '```python\n'
                      'def gpt_init_mlp_trained_with_adam_at_3e_2():\n'
                      "    # every weight has std 0.02; Adam's first step moves each entry by about lr = 0.03\n"
                      '    return mlp_at_gpt_init(), torch.randn(16, 256)\n'
                      '```\n'
                      'Flagged at ``0``, ``2``.\n'
                      '\n'
                      'Passed:\n'
                      '```python\n'
                      'def gpt_init_mlp_trained_with_adam_at_1e_3():\n'
                      '    return mlp_at_gpt_init(), torch.randn(16, 256)\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      "Lower the param group's lr to the value the finding names (the first step is proportional\n"
                      'to lr, so ``lr * limit / ratio`` brings the worst weight of the group to the limit), add a\n'
                      'warm-up that starts there, or give the weight a larger init if its scale is the odd one out.\n'
                      '\n'
                      '## Options\n'
                      "- `limit` (default 0.5): the largest ratio of the first update's rms to the weight's rms.\n"},
    'IL016': {'code': 'IL016',
              'name': 'not-optimized',
              'severity': 'warning',
              'role': 'check',
              'summary': 'a trainable parameter no param group holds, one held twice or stale, or a module the forward '
                         'never uses',
              'options': {},
              'option_ranges': {},
              'needs': ('activations',),
              'uses': (),
              'page': '# IL016 `not-optimized`\n'
                      '\n'
                      'Severity: **warning**. Role: check. Needs: activations.\n'
                      '\n'
                      '## What it does\n'
                      'With the optimizer the model will train with (``optimizer=``, ``--optimizer`` or\n'
                      '``initlint_optimizer(model)``), compares its param groups with the model: a parameter that\n'
                      'requires grad and gets a nonzero gradient from the loss but that no group holds, a parameter\n'
                      'held by two groups (or twice by one), a frozen parameter held (information) and tensors held\n'
                      "that are not parameters of the model any more (a replaced head's old weights).\n"
                      '\n'
                      'With or without an optimizer, it also reports modules whose parameters require grad but\n'
                      'that the forward pass never uses (a leftover layer): as information, or as a warning when\n'
                      'the audited model is wrapped in ``DistributedDataParallel``.\n'
                      '\n'
                      '## Why is this bad?\n'
                      'A parameter no group holds keeps its init for the whole run: a head added after the\n'
                      'optimizer was built, or ``optimizer = Adam(model.encoder.parameters())``, trains the\n'
                      'encoder under a random, frozen head, and nothing fails. A parameter held twice is stepped\n'
                      'twice (torch refuses it only at construction; ``group["params"].append`` slips past). A\n'
                      "replaced module's old parameters still held cost optimizer memory and, with weight decay,\n"
                      'are decayed for nothing. An unused module gets no gradient: ``DistributedDataParallel``\n'
                      'stops with "Expected to have finished reduction in the prior iteration" unless\n'
                      '``find_unused_parameters=True`` (which costs a graph walk every step).\n'
                      '\n'
                      '## Example\n'
                      '```python\n'
                      'def optimizer_built_over_the_body_only():\n'
                      '    # the optimizer was built before the head existed, or over model.body.parameters()\n'
                      '    return Classifier(), torch.randn(8, 32)\n'
                      '```\n'
                      'Flagged at ``head``.\n'
                      '\n'
                      'Passed:\n'
                      '```python\n'
                      'def optimizer_over_every_parameter():\n'
                      '    return Classifier(), torch.randn(8, 32)\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      'Build the optimizer once the model is complete, over ``model.parameters()`` (or param\n'
                      'groups that together cover them); freeze on purpose with ``requires_grad_(False)`` and\n'
                      'leave frozen parameters out of the groups; delete a leftover module (or call it).\n'
                      '\n'
                      '## Options\n'
                      'None.\n'},
    'IL017': {'code': 'IL017',
              'name': 'precision-headroom',
              'severity': 'warning',
              'role': 'check',
              'summary': 'An activation or gradient overflows or underflows at the precision training uses.',
              'options': {'headroom': 8.0, 'flush': 0.25, 'lost-update': 0.5},
              'option_ranges': {'headroom': (1, None), 'flush': (0, 1), 'lost-update': (0, 1)},
              'needs': ('activations', 'precision'),
              'uses': (),
              'page': '# IL017 `precision-headroom`\n'
                      '\n'
                      'Severity: **warning**. Role: check. Needs: activations, precision.\n'
                      '\n'
                      '## What it does\n'
                      'Runs only when the audit is given the precision training will use (``precision="fp16"`` or\n'
                      '``"bf16"``, ``--precision``). The probe then runs the forward and backward pass once more under\n'
                      "``torch.autocast`` at that dtype, with a training loss (the model's own, cross-entropy against\n"
                      'random labels for logits, else a mean squared error), and checks:\n'
                      "- fp16: an op whose output (or the gradient reaching it, or a weight's gradient) overflows to\n"
                      '  ``inf`` under autocast while it is finite in float32 (error), or comes within ``headroom``\n'
                      "  of float16's largest value 65504 (warning); the first layer where it happens is named;\n"
                      "- fp16: the share of each weight's gradient entries that are nonzero in float32 and exactly\n"
                      "  zero under autocast: lost to underflow (float16's smallest subnormal is 6e-8). Without a\n"
                      '  ``GradScaler`` the loss is unscaled; with one (``grad_scaler=True``, ``--grad-scaler``) it is\n'
                      "  judged at the scaler's initial scale, 65536;\n"
                      '- bf16 (and fp16) residual additions made in the half dtype (a model stored in bfloat16)\n'
                      "  whose branch is below the stream's resolution: branch rms < stream rms x 2^-9 in bfloat16\n"
                      '  (2^-12 in float16), so most of what the branch adds rounds away (information: see the\n'
                      '  calibration). Branches that start at zero or behind a near-zero gate (ReZero, LayerScale,\n'
                      '  zero-initialised ends) are deliberate and passed over;\n'
                      "- with an optimizer of Adam's family (its first step taken on a private copy), weight tensors\n"
                      '  stored in bfloat16 or float16 whose first update is mostly below half a unit in the last\n'
                      '  place of the weight: the step is lost to rounding.\n'
                      '\n'
                      '## Why is this bad?\n'
                      'float16 keeps 5 exponent bits: values above 65504 become ``inf``, and the loss, every\n'
                      'gradient and then every weight become NaN at the first step. A model that sits within a\n'
                      'small factor of the limit at initialisation crosses it once training grows its weights\n'
                      '(trained T5 checkpoints do: their FFN output ``DenseReluDense.wo`` exceeds 65504, which is\n'
                      'why Hugging Face keeps ``wo`` in float32). At the other end, gradients below 6e-8 flush to\n'
                      'zero: a mean-reduced loss over many outputs, a small output layer or a deep stack with\n'
                      'shrinking gradients leaves whole layers with no gradient in float16, which is what a loss\n'
                      "scaler is for. bfloat16 has float32's range but 8 significant bits: ``x + f(x)`` with\n"
                      '``|f(x)|`` under half a unit in the last place of ``x`` returns ``x``, so a branch that small\n'
                      'does not change the stream at all. The same holds for a weight stored in bfloat16: a weight\n'
                      'of 0.02 has a unit in the last place of 1.2e-4, so an Adam update of lr 5e-5 leaves it as it\n'
                      'was, step after step (mixed precision keeps float32 master weights for that reason).\n'
                      '\n'
                      'Calibration. ``benchmarks/bench_precision.py`` (table in ``benchmarks/results/precision.md``)\n'
                      'trains a small classifier (64-256-32, a LayerNorm, 10 classes; Adam, 200 steps, 5 seeds) from\n'
                      'the same init in float32 and under fp16 autocast, with and without a ``GradScaler``. Trouble:\n'
                      "a non-finite loss, the scaler skipping most steps, or less than half the float32 run's\n"
                      'progress. Activations were pushed towards 65504 by unnormalised inputs: at Adam lr 1e-3 the\n'
                      'runs whose largest activation sat at 0.6 of the limit overflowed in 3 of 5 seeds and from\n'
                      '0.7 on (already inf under fp16 arithmetic at init) in all; at lr 1e-2, where the weights\n'
                      'and activations grow faster, every run from 1/8 of the limit up overflowed within 200 steps\n'
                      'and none at 1/16: hence ``headroom`` 8. Gradients were shrunk by a loss weight (every\n'
                      "gradient small for good: at 1e-5 and 1e-6, 94-100% of the first layer's gradient flushes and\n"
                      'the runs learn nothing; at 1e-4, 4.7% flushes and they learn) and by a small output layer\n'
                      "(at 1e-6 the earlier layers' gradients flush entirely at init, but Adam grows the head\n"
                      "within a few steps and the run learns as in float32: the finding's known false alarm).\n"
                      'Over the 250 runs: a finding came before trouble in 89 of 127 flagged runs (all 50 errors\n'
                      'did), a clean audit in 4 of 123 (an activation at 0.12 of the limit, just under 1/8, with\n'
                      'lr 1e-2); the flushed shares of untroubled runs stay at 0.05 and below, of troubled ones at\n'
                      '0.94 and above, hence ``flush`` 0.25.\n'
                      '\n'
                      'Lost updates. ``benchmarks/bench_lost_updates.py`` (table in\n'
                      '``benchmarks/results/lost_updates.md``) trains an MLP on a teacher task and a small nanoGPT (0.02\n'
                      'init) on a token task for 200 steps, stored in bfloat16 and, from the same init and batches, in\n'
                      'float32, with Adam and AdamW at 9 lrs from 1e-5 to 3e-3 and SGD (momentum 0.9) at 6 from 1e-3\n'
                      "to 0.3, 3 seeds; trouble: the bfloat16 run made less than half the float32 run's progress. The\n"
                      'figure is the largest share, over the weight tensors, of the elements whose gradient moves them\n'
                      'and whose first update leaves the stored value unchanged. For Adam and AdamW (108 runs, 28 in\n'
                      'trouble) a figure above 0.5 came before trouble in 78% of the flagged runs (28 of 36) and in\n'
                      'every troubled one, and no clean audit came before trouble; the troubled runs had figures of\n'
                      '0.746 and above (the MLP at lr 1e-4 and below, the GPT at 1e-5), the flagged runs that still\n'
                      "learnt 0.70-0.75 (the GPT at 2e-5, which made 66% of float32's progress, and one MLP seed at\n"
                      "1e-4). SGD's first step is the smallest of its run (momentum grows the later ones up to tenfold):\n"
                      'its figures were 0.63-1.0 at every lr, and none of its 36 runs was in trouble (59% to 142% of\n'
                      "float32's progress), so it is not judged, nor are other optimizers\n"
                      'whose step scales with the gradient. Two things that look lost are not counted: elements without\n'
                      'a gradient (embedding rows the batch does not use) move by weight decay alone, and norm gains\n'
                      'and biases are not weight tensors (a LayerNorm gain of 1.0 cannot move by less than 0.004 in\n'
                      "bfloat16; the GPT's were stuck in every bfloat16 run at these rates, and at lr 2e-4 and above it\n"
                      'learnt as in float32).\n'
                      '\n'
                      '``benchmarks/bench_precision.py`` also trains a pre-norm residual MLP stored in bfloat16 (no\n'
                      'float32 master weights) with its branch ends scaled down: from x1e-3 on its branches round away at '
                      'init,\n'
                      "yet it learns as well as at x1e-2 (the gradient reaches the branch's weights whatever the\n"
                      'rounding, and Adam grows them out of it), so a branch that rounds away is reported as\n'
                      'information.\n'
                      '\n'
                      '## Example\n'
                      '```python\n'
                      'def mlp_whose_first_layer_outputs_exceed_fp16():  # audited with precision="fp16"\n'
                      '    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))\n'
                      '    with torch.no_grad():\n'
                      '        model[0].weight.mul_(3e4)  # hidden activations reach ~1e5; float16 holds at most 65504\n'
                      '        model[2].weight.div_(3e4)  # the function is unchanged in float32\n'
                      '    return model, torch.randn(32, 64)\n'
                      '```\n'
                      'Flagged at ``0``.\n'
                      '\n'
                      'Passed:\n'
                      '```python\n'
                      'def mlp_at_default_init():  # audited with precision="fp16", and "bf16"\n'
                      '    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)), torch.randn(32, 64)\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      "Overflow: train in bfloat16 (float32's range), keep the overflowing layer in float32, or\n"
                      'bring its scale down (a norm before it, a clamp, a smaller init):\n'
                      '```python\n'
                      'with torch.autocast("cuda", dtype=torch.bfloat16):\n'
                      '    loss = model(x)\n'
                      '```\n'
                      'Gradient underflow in fp16: use a loss scaler, which scales the loss before ``backward`` and\n'
                      'unscales the gradients before the step:\n'
                      '```python\n'
                      'scaler = torch.amp.GradScaler()\n'
                      'scaler.scale(loss).backward()\n'
                      'scaler.step(optimizer)\n'
                      'scaler.update()\n'
                      '```\n'
                      'A branch that rounds away in bfloat16: keep float32 master weights and compute under\n'
                      'autocast (the stream stays float32), or initialise the branch at a scale the stream can\n'
                      'resolve.\n'
                      '\n'
                      '## Options\n'
                      '- ``headroom`` (default ``8``): warn when an fp16 activation or gradient comes within this\n'
                      '  factor of 65504 (its largest magnitude above 65504 / headroom = 8188).\n'
                      '- ``flush`` (default ``0.25``): flag a weight when more than this share of its nonzero float32\n'
                      '  gradient entries are zero under fp16 autocast.\n'
                      "- ``lost-update`` (default ``0.5``): with an optimizer of Adam's family, flag a weight tensor\n"
                      '  stored in bfloat16 or float16 when more than this share of the entries its gradient moves are\n'
                      '  left unchanged by the first update (calibrated above).\n'},
    'IL018': {'code': 'IL018',
              'name': 'width-unstable',
              'severity': 'warning',
              'role': 'symptom',
              'summary': "a layer whose activation scale grows with the model's width, at init or after a few optimizer "
                         'steps (a sweep)',
              'options': {'limit': 0.2},
              'option_ranges': {'limit': (0, None)},
              'needs': ('sweep',),
              'uses': (),
              'page': '# IL018 `width-unstable`\n'
                      '\n'
                      'Severity: **warning**. Role: symptom. Needs: sweep.\n'
                      '\n'
                      '## What it does\n'
                      'Runs on a sweep (``initlint.sweep`` or ``initlint sweep``): the model is built at several\n'
                      "widths, and each layer's output rms, and the rms of the attention logits ``q . k * scale``\n"
                      'where the model has attention, is measured at initialisation and after each of a few\n'
                      'optimizer steps on the same batch (a coordinate check, as in the muP work). Layers are\n'
                      'matched across widths by module path, the numbered blocks of a stack pooled by role\n'
                      '(``h.{i}.mlp.c_fc``). For each layer and step the rule fits ``rms ~ width^alpha`` by least\n'
                      'squares on log-log axes and flags a layer whose exponent is above the limit, at\n'
                      'initialisation or after any step. The message gives the exponent, its fit error and the\n'
                      'scale the fit predicts at the target width (``--target-width``, default 8x the largest\n'
                      'width tried).\n'
                      '\n'
                      'Only growth is judged. A scale that shrinks with width, or that is exactly zero (muP starts\n'
                      'the attention logits at 0 with a zero query projection, and its readout shrinks slightly),\n'
                      'is what a parametrization that transfers across widths does, not a finding.\n'
                      '\n'
                      '## Why is this bad?\n'
                      'A width-stable model keeps every activation at a scale independent of the width, at\n'
                      'initialisation and through training: that is what lets a learning rate tuned at a small\n'
                      'width work at a large one (Tensor Programs V, Yang et al., 2022). In the standard\n'
                      'parametrization two things break it. At initialisation, a weight drawn at a fixed std\n'
                      "(nanoGPT's 0.02) gives ``W x`` an rms that grows as ``sqrt(width)``; and with Adam, every\n"
                      'entry of a weight moves by about the learning rate in the first steps whatever the width,\n'
                      'so the update ``dW x`` sums ``fan_in`` aligned terms and grows linearly with the width.\n'
                      'The readout and the attention logits (``q . k / sqrt(d)`` sums ``d`` correlated terms once\n'
                      'q and k have learned) show it first. Measured on a small GPT trained with Adam at widths\n'
                      "64-512: at nanoGPT's fixed 0.02 init the output grows at +0.47 at init and +0.6 to +0.8\n"
                      "after steps, the attention logits at +1.0 and up to +2.3; at PyTorch's default init the\n"
                      'model is flat at init but its output grows at +0.40 to +0.46 after steps. Both lose their\n'
                      'best learning rate at 8x the width; a muP twin keeps it. A growth exponent of ``alpha``\n'
                      "multiplies the scale by ``8^alpha`` at 8x the width: 2.3x for the default-init GPT's 0.4.\n"
                      '\n'
                      '## Example\n'
                      '```python\n'
                      'def mlp_at_fixed_std(width=32):\n'
                      '    model = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),\n'
                      '                          nn.Linear(width, 10))\n'
                      '    for layer in model[::2]:\n'
                      '        nn.init.normal_(layer.weight, std=0.02)  # the same std at every width: W x grows as '
                      'sqrt(width)\n'
                      '        nn.init.zeros_(layer.bias)\n'
                      '    return model\n'
                      '```\n'
                      'Flagged at ``2``, ``4``.\n'
                      '\n'
                      'Passed:\n'
                      '```python\n'
                      'def mlp_at_default_init(width=32):\n'
                      '    return nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), '
                      'nn.Linear(width, 10))\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      'Use the maximal-update parametrization (muP) for the layers that grow:\n'
                      '```python\n'
                      '# readout: a multiplier 1/width (or a zero-initialised readout)\n'
                      'logits = self.lm_head(x) * (base_width / width)\n'
                      'nn.init.zeros_(self.lm_head.weight)\n'
                      '# attention: scale the scores by 1/d instead of 1/sqrt(d)\n'
                      'y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / q.size(-1))\n'
                      "# hidden matrices: Adam's learning rate scaled by 1/fan_in\n"
                      'groups = [{"params": hidden_weights, "lr": base_lr * base_width / width},\n'
                      '          {"params": other_params, "lr": base_lr}]\n'
                      '```\n'
                      'The ``mup`` package (``MuReadout``, ``MuAdam``, ``set_base_shapes``) does all three.\n'
                      '\n'
                      '## Options\n'
                      '- ``limit`` (default ``0.2``): the largest growth exponent accepted. Calibrated on five\n'
                      '  width pairs trained at width 64 and 512 (``benchmarks/bench_sweep.py``, README "Sweep\n'
                      '  calibration"): at the sweep\'s default (Adam lr 1e-3, 3 steps) only 0.2 flags every\n'
                      '  model that lost its best learning rate at 8x the width and passes the one that kept it\n'
                      '  (muP, +0.04); the default-init GPT grows at +0.24 there, and a limit of 0.3 misses it.\n'
                      '  Swept at the lr training uses, every limit from 0.2 to 0.5 agrees with training.\n'},
    'IL019': {'code': 'IL019',
              'name': 'depth-unstable',
              'severity': 'warning',
              'role': 'symptom',
              'summary': "the residual stream or the input layer's gradient growing or shrinking with the model's depth "
                         '(a sweep)',
              'options': {'limit': 0.5},
              'option_ranges': {'limit': (0, None)},
              'needs': ('sweep',),
              'uses': (),
              'page': '# IL019 `depth-unstable`\n'
                      '\n'
                      'Severity: **warning**. Role: symptom. Needs: sweep.\n'
                      '\n'
                      '## What it does\n'
                      'Runs on a sweep over depth (``initlint.sweep(..., depth={"n_layer": [...]})`` or\n'
                      '``initlint sweep --depth n_layer=...``): the model is built at several depths, and two\n'
                      'scales are measured at initialisation and after each of a few optimizer steps on the same\n'
                      "batch: the residual stream (the input of the normalisation that follows the model's main\n"
                      "stack of numbered blocks, a pre-norm transformer's final norm, else the output of the\n"
                      "stack's last block; reported at the stack, ``transformer.h``) and the norm of the gradient\n"
                      'of the input layer (the first layer to run, such as the token\n'
                      'embedding). For each, it fits ``scale ~ depth^alpha`` on log-log axes and flags an\n'
                      'exponent whose size is above the limit, growing or shrinking. The message gives the\n'
                      'exponent and the depth budget: the depth at which the fitted trend has moved the scale by\n'
                      "the signal-drift rule's ``max-scale-ratio`` (IL005; default 100) from the smallest depth\n"
                      'tried.\n'
                      '\n'
                      '## Why is this bad?\n'
                      'In a residual network every block adds its branch to the stream. With branches of unit\n'
                      "scale the stream's variance grows with the number of blocks: measured on a pre-LN stack,\n"
                      'the stream grows at depth^+0.46 at init and +0.58 after 3 Adam steps. The final norm hides\n'
                      'the forward scale, but each branch then reads an ever smaller fraction of the stream, and\n'
                      'the gradient reaching the input layer shrinks or grows with depth, so the learning rate\n'
                      "tuned at a small depth does not transfer. GPT-2's ``1/sqrt(2L)`` scaling of the branch\n"
                      'ends *at init*, or zero-initialised branch ends, are flat at init only: Adam moves every\n'
                      'weight by about the learning rate whatever its init, so after 3 steps these stacks grow at\n'
                      '+0.44 and +0.62. A ``1/sqrt(2L)`` multiplier in the forward (the depth-muP recipe) stays\n'
                      "flat. It also shrinks the branch weights' gradients with depth, which is harmless under\n"
                      'Adam, so the rule judges the gradient at the input layer, not the branch weights.\n'
                      '\n'
                      '## Example\n'
                      '```python\n'
                      'def residual_stack_without_block_norms(n_layer=4):\n'
                      "    # every block adds a branch of the stream's own scale to it: the stream doubles its variance "
                      'per block\n'
                      '    return PreNormStack(n_layer, norm=False)\n'
                      '```\n'
                      'Flagged at ``blocks``.\n'
                      '\n'
                      'Passed:\n'
                      '```python\n'
                      'def pre_norm_stack_with_branch_multiplier(n_layer=4):\n'
                      '    return PreNormStack(n_layer, multiplier=1 / math.sqrt(2 * n_layer))  # the depth-muP forward '
                      'multiplier\n'
                      '```\n'
                      '\n'
                      '## Fix\n'
                      'Multiply each residual branch by ``1/sqrt(2 L)`` in the forward pass (``L`` blocks, two\n'
                      'branches each), so that the scaling holds after training starts:\n'
                      '```python\n'
                      'x = x + self.attn(self.ln_1(x)) / math.sqrt(2 * n_layer)\n'
                      'x = x + self.mlp(self.ln_2(x)) / math.sqrt(2 * n_layer)\n'
                      '```\n'
                      'A scaling applied to the init only (``std = 0.02 / sqrt(2 * n_layer)`` on ``c_proj``, or a\n'
                      'zero-initialised branch end) holds at init only.\n'
                      '\n'
                      '## Options\n'
                      '- ``limit`` (default ``0.5``): the largest exponent (either sign) accepted. Calibrated on\n'
                      '  pre-LN stacks of depth 2 to 16 (``benchmarks/bench_sweep.py``, README "Sweep\n'
                      '  calibration"): none of the four recipes lost its best learning rate at depth 16, the\n'
                      '  unscaled stack included (its stream grows at +0.20 at init and up to +0.50 after 3 Adam\n'
                      '  steps at lr 1e-3), so the limit sits above every exponent measured there. A pre-norm\n'
                      '  stream grows at most as ``sqrt(depth)`` at init; a stack whose blocks are not\n'
                      '  normalised grows exponentially (``residual_stack_without_block_norms``: +1.5).\n'},
}
