"""Probe inputs for a Hugging Face model, from its config, its sub-configs and its forward's signature.

A multimodal model's sizes live in sub-configs (``text_config``, ``vision_config``,
``audio_config``, ``encoder``/``decoder``), so each modality is read from the config that
describes it. The model gets every modality its forward takes and its config sizes: token ids
and images for CLIP or LLaVA, ids and spectrograms for a speech LLM. Where the ids must hold one
placeholder token per image (or audio) feature (``image_token_id``), the number of features is
counted by running the model's own ``get_image_features`` on one example, without gradients, with
the RNG and the training flags restored.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn

from ..errors import LoadError
from ..probe import draw

HF_TOKENS = 16
"""Sequence length of the token ids built for a Hugging Face model (text tokens, placeholders excluded)."""
AUDIO_SAMPLES = 4000
"""Length of a raw waveform (``input_values``)."""
PATCH_GRID = 16
"""Patches a side of the image built for a model that takes flattened patches with their grid positions
(Pix2Struct): 256 patches, within its ``seq_len`` of 4096."""
VISUAL_REGIONS = 36
"""Regions an image of a region-feature model (LXMERT) is given: the 36 boxes its object detector keeps."""
FEATURE_FRAMES = 64
"""Frames of a ``frames x features`` spectrogram whose config names no length (Speech2Text, Parakeet)."""
CLAP_FRAMES = 1001
"""Frames of CLAP's log-mel features: its feature extractor's 10-second clip at 48 kHz, 480 samples a hop."""
DECISION_STEPS = 20
"""Timesteps of a Decision Transformer's trajectory: the context ``K = 20`` its paper trains with on Gym."""
VIDEO_FRAMES = 8
"""Frames of the clips built for a video input whose config names no frame count."""
IMAGE_SIDE = 224
"""Side of the images built for a vision model whose config gives no ``image_size`` (ResNet, ConvNeXt,
HGNetV2 and most convolutional backbones): ImageNet's, at which nearly all were published. At 32 x 32 a
backbone of stride 32 ends on 1 x 1 maps, where BatchNorm normalises 2 values per channel at batch 2
(HGNetV2 then got an IL006 that 224 x 224 images do not give)."""

# Modalities that fill placeholder tokens in the ids: the pixel or feature input, the config keys of
# the placeholder token, the method that encodes it, and the method of a model that instead expands one
# placeholder into its features itself (the merge LLaVA-era models did before their processors expanded them).
PLACEHOLDERS = (
    ("pixel_values", ("image_token_id", "image_token_index"), "get_image_features",
     "_merge_input_ids_with_image_features"),
    ("input_features", ("audio_token_id", "audio_token_index"), "get_audio_features",
     "_merge_input_ids_with_audio_features"),
)
VISION_KEYS = ("vision_config", "vision_tower_config", "visual", "image_config", "encoder")
AUDIO_KEYS = ("audio_config", "encoder_config", "audio_encoder_config", "speech_config", "encoder")
MODALITIES = ("input_ids", "pixel_values", "input_features", "input_values")
"""The inputs built for a Hugging Face model besides its main one: those its forward takes and its config
sizes, and those its forward cannot run without."""
FRAME_MASKS = ("input_features_mask", "feature_attention_mask")
"""The masks over a spectrogram's frames a forward takes beside it."""
SPECIAL_KEYS = ("image_token_id", "image_token_index", "video_token_id", "video_token_index", "audio_token_id",
                "audio_token_index", "boi_token_id", "eoi_token_id", "boi_token_index", "eoi_token_index",
                "image_start_token_id", "image_end_token_id", "vision_start_token_id", "vision_end_token_id",
                "audio_start_token_id", "audio_end_token_id")


def transformers_inputs(model: nn.Module, batch: int, gen: torch.Generator,
                        dtype: torch.dtype) -> Optional[Dict[str, Any]]:
    """Keyword inputs for a Hugging Face model (None for a model that is not one, or whose main input
    cannot be shaped from its config); an encoder-decoder model also gets ``decoder_input_ids``."""
    config = getattr(model, "config", None)
    main = getattr(model, "main_input_name", None)
    if isinstance(main, (list, tuple)) and main and isinstance(main[0], str):  # OneFormer: images, then task tokens
        main = main[0]
    if config is None or not isinstance(main, str):
        return None
    accepts = forward_parameters(model)
    grid = "grid_thw" if "grid_thw" in accepts else "image_grid_thw"
    if grid in accepts and (grid == "grid_thw" or grid in required_parameters(model)):
        patches = _patch_inputs(model, config, accepts, batch, gen, dtype, grid)  # a Qwen-VL-style vision tower
        if patches is not None:
            return patches
    if "target_sizes" in accepts and "pixel_values" in accepts:  # MiniCPM-V's vision tower: packed images
        packed = _packed_images(config, batch, gen, dtype)
        if packed is not None:
            return packed
    encoder = getattr(getattr(model, "encoder", None), "main_input_name", None)
    if main == "inputs" and isinstance(encoder, str):  # a speech encoder-decoder: its encoder's input, by name
        main = encoder
    required = required_parameters(model)
    if main not in accepts:  # a main input the forward does not name (GraniteDocling's vision tower): the one it needs
        main = next((n for n in MODALITIES if n in required), main)
    if main not in accepts and required - set(MODALITIES):  # its input under another name (VibeVoice's hidden_states)
        return _renamed_waveform(model, config, main, batch, gen, dtype)
    inputs: Dict[str, Any] = {}
    for name in [main] + [n for n in MODALITIES if n != main]:
        if name != main and (name not in accepts or not (_describes(config, name) or name in required)):
            continue
        made = _one_input(config, name, batch, gen, dtype)
        if made is None and name == "input_features" and (name == main or name in required):
            made = _features_from_first_layer(model, batch, gen, dtype)
        if made is None and name == main and name not in MODALITIES:
            made = _named_spectrogram(model, config, batch, gen, dtype)
        if made is None and name == main:
            return None
        if made is not None:
            inputs[name] = made
    if "past_values" in inputs and "past_time_features" in accepts:
        inputs.update(_series_features(config, accepts, inputs["past_values"], gen, dtype))
    elif "past_values" in inputs and inputs["past_values"].dim() == 2:  # TimesFM: no padding, a frequency class
        if "past_values_padding" in accepts:
            inputs["past_values_padding"] = torch.zeros_like(inputs["past_values"])
        if "freq" in accepts:
            inputs["freq"] = torch.zeros(batch, 1, dtype=torch.long, device=gen.device)
    if "states" in inputs and _count(config, "act_dim"):
        inputs.update(_trajectory(config, inputs["states"], gen, dtype))
    if "input_ids" in inputs and "bbox" in accepts and (_count(config, "dim_bbox") or "visual_bbox" in accepts):
        inputs["bbox"] = _boxes(inputs["input_ids"], gen, dtype)
    if "pixel_values" in inputs and "spatial_shapes" in accepts:
        inputs.update(_native_patches(vision_config(config), batch, gen, dtype))
    if "pixel_values" in inputs and "aspect_ratio_ids" in accepts and _count(vision_config(config), "max_num_tiles"):
        text = inputs["input_ids"].shape[-1] if "input_ids" in inputs else 0
        inputs.update(_tiled_images(vision_config(config), inputs["pixel_values"], accepts, text))
    if "pixel_values" in inputs and "pixel_position_ids" in required:
        inputs.update(_positioned_patches(vision_config(config), batch, gen, dtype))
    if "input_values" in inputs and main == "input_values" and _reads_hidden_states(model, config):
        inputs.update(_hidden_states(config, accepts, batch, gen, dtype))
    if "input_features" in inputs and "input_ids" in inputs and _count(config, "audio_length_per_tok"):
        inputs["input_features"] = _streamed_features(model, config, inputs["input_features"], gen)
    if "input_features" in inputs and "input_values" in inputs:
        inputs["input_values"] = _aligned_waveform(model, config, inputs["input_values"], inputs["input_features"], gen)
    for mask in FRAME_MASKS:  # every frame real (Qwen2-Audio, AF3 read it)
        if "input_features" in inputs and mask in accepts:
            inputs[mask] = _frames_mask(audio_config(config), inputs["input_features"], model)
    own = f"{main}_mask"
    if main in inputs and own in required and own not in inputs:
        inputs[own] = _own_mask(model, own, inputs[main])
    if "qformer_input_ids" in required:
        inputs["qformer_input_ids"] = _qformer_ids(config, batch, gen)
    inputs.update(_companions(config, accepts, required, inputs, batch, gen, dtype))
    if "input_ids" in inputs:
        inputs["input_ids"] = _with_placeholders(model, config, inputs, gen)
        inputs.update(_training_inputs(config, accepts, inputs["input_ids"], gen, dtype))
    if getattr(config, "is_encoder_decoder", False) and (not accepts or "decoder_input_ids" in accepts):
        decoder = decoder_input_ids(model, config, batch, gen)
        if decoder is None:
            raise LoadError(f"{type(model).__name__} is an encoder-decoder model and its config names no decoder start, "
                            f"pad or bos token (nor a vocabulary size); pass "
                            f"example_inputs={{'{main}': ..., 'decoder_input_ids': ...}}")
        inputs["decoder_input_ids"] = decoder
    return inputs


def _renamed_waveform(model: nn.Module, config: Any, main: str, batch: int, gen: torch.Generator,
                      dtype: torch.dtype) -> Optional[Dict[str, Any]]:
    """The input of a forward that does not name its model's main input (a class inherits ``input_values``
    and its forward takes ``hidden_states``): a waveform of ``channels x samples`` where the first layer, a
    convolution, reads the config's audio channels (VibeVoice's acoustic encoder; whole ``downsampling_ratios``
    strides, at least two, so that it gives two latents or more), under the name of the
    forward's first parameter; else None, and the input is shaped from that first layer as for a plain module
    (VibeVoice's decoder, whose convolution reads latents)."""
    first = first_consumer(model)
    channels = _count(config, "audio_channels") or _count(config, "channels")
    name = next(iter(inspect.signature(model.forward).parameters), None)
    if main != "input_values" or not isinstance(first, nn.Conv1d) or first.in_channels != channels or name is None:
        return None
    strides = getattr(config, "downsampling_ratios", None)  # whole strides of the codec, at least two
    hop = math.prod(strides) if isinstance(strides, (list, tuple)) and all(isinstance(v, int) and v > 0
                                                                          for v in strides) else 1
    samples = hop * max(2, math.ceil(AUDIO_SAMPLES / hop))
    return {name: torch.randn(batch, channels, samples, generator=gen, device=gen.device, dtype=dtype)}


def _patch_inputs(model: nn.Module, config: Any, accepts: set, batch: int, gen: torch.Generator,
                  dtype: torch.dtype, grid: str = "grid_thw") -> Optional[Dict[str, Any]]:
    """A vision tower that takes its images as flattened patches and a ``grid_thw`` (Qwen2-VL and the models
    built on it; ``image_grid_thw`` where the forward requires it under that name: Inkling 2): each image a grid
    of ``2 x spatial_merge_size`` patches a side, one frame; the patches, of
    ``channels x temporal_patch_size x patch_size**2`` values each (Muse Glimmer's ``patch_temporal`` and
    ``merge_size``), under the forward's first parameter's
    name (its ``main_input_name`` is often the text default). None where the config has no ``patch_size``."""
    patch = getattr(config, "patch_size", None)
    if not isinstance(patch, int) or isinstance(patch, bool):
        return None
    first = next((n for n in inspect.signature(model.forward).parameters if n not in ("self", grid)), None)
    if first is None:
        return None
    temporal = getattr(config, "temporal_patch_size", None) or getattr(config, "patch_temporal", None) or 1
    channels = getattr(config, "in_channels", None) or getattr(config, "num_channels", None) or 3
    merge = getattr(config, "spatial_merge_size", None) or getattr(config, "merge_size", None) or 1
    if isinstance(merge, (list, tuple)):  # Muse Glimmer's (height, width) merge kernel: square in every config
        merge = merge[0] if merge and all(m == merge[0] for m in merge) else 1
    side = 2 * int(merge)
    values = int(channels) * int(temporal) * patch * patch
    inputs: Dict[str, Any] = {
        first: torch.randn(batch * side * side, values, generator=gen, device=gen.device, dtype=dtype),
        grid: torch.tensor([[1, side, side]] * batch, dtype=torch.long, device=gen.device)}
    if "merge_sizes" in accepts:
        inputs["merge_sizes"] = torch.full((batch,), int(merge), dtype=torch.long, device=gen.device)
    return inputs


def _packed_images(config: Any, batch: int, gen: torch.Generator, dtype: torch.dtype) -> Optional[Dict[str, Any]]:
    """Images as MiniCPM-V's vision tower takes them (``target_sizes``, each image's patch grid): packed into one
    row of patches, ``1 x channels x patch_size x (patches * patch_size)``, each image a square grid of 4 window
    kernels a side (``window_kernel_size``, which its merger pools twice). None where the config has no
    ``patch_size``."""
    patch = _count(config, "patch_size")
    if not patch:
        return None
    kernel = getattr(config, "window_kernel_size", None)
    side = 4 * (int(kernel[0]) if isinstance(kernel, (list, tuple)) and kernel else 1)
    channels = _count(config, "num_channels") or 3
    row = torch.randn(1, channels, patch, batch * side * side * patch, generator=gen, device=gen.device, dtype=dtype)
    return {"pixel_values": row,
            "target_sizes": torch.tensor([[side, side]] * batch, dtype=torch.long, device=gen.device)}


def forward_parameters(model: nn.Module) -> set:
    """The names the model's forward takes (empty when its signature cannot be read)."""
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def required_parameters(model: nn.Module) -> set:
    """The names the model's forward cannot run without: those with no default."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return set()
    return {p.name for p in params if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def _native_patches(vis: Any, batch: int, gen: torch.Generator, dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    """Images as a NaFlex vision tower takes them (SigLIP 2): each a square grid of its ``num_patches``
    flattened patches of ``channels x patch_size**2`` values, the grid's shape, and a mask of the
    patches that are real (all of them)."""
    patches = _count(vis, "num_patches") or 256
    side = max(1, int(round(patches ** 0.5)))
    patch = _count(vis, "patch_size") or 16
    channels = _count(vis, "num_channels") or 3
    return {"pixel_values": torch.randn(batch, side * side, channels * patch * patch, generator=gen,
                                        device=gen.device, dtype=dtype),
            "spatial_shapes": torch.tensor([[side, side]] * batch, dtype=torch.long, device=gen.device),
            "pixel_attention_mask": torch.ones(batch, side * side, dtype=torch.long, device=gen.device)}


def _companions(config: Any, accepts: set, required: set, inputs: Dict[str, Any], batch: int,
                gen: torch.Generator, dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    """What a forward takes beside its main modality, where its config sizes it: LXMERT's region features and
    boxes (``visual_feat_dim``, ``visual_pos_dim``; 36 regions an image, as its object detector gives), X-MOD's
    language (the first of its ``languages``), Kosmos-2's places for its ``latent_query_num`` image embeddings
    before the text (``image_embeds_position_mask``), OneFormer's task tokens (``task_seq_len`` of its text
    encoder's vocabulary) and SegGPT's prompt image and mask (its ``image_size`` is the two stacked: the image,
    the prompt and its mask are each half its height)."""
    made: Dict[str, torch.Tensor] = {}
    ids, images = inputs.get("input_ids"), inputs.get("pixel_values")
    feat, pos = _count(config, "visual_feat_dim"), _count(config, "visual_pos_dim")
    if "visual_feats" in accepts and feat and pos and ids is not None:
        made["visual_feats"] = torch.randn(batch, VISUAL_REGIONS, feat, generator=gen, device=gen.device, dtype=dtype)
        corners = torch.rand(batch, VISUAL_REGIONS, 2, pos // 2, generator=gen, device=gen.device, dtype=dtype)
        made["visual_pos"] = corners.sort(dim=-2).values.reshape(batch, VISUAL_REGIONS, -1)
    if "lang_ids" in accepts and getattr(config, "languages", None) and ids is not None:
        made["lang_ids"] = torch.zeros(batch, dtype=torch.long, device=gen.device)
    tokens, length = _count(config, "text_encoder_vocab_size"), _count(config, "task_seq_len")
    if "task_inputs" in required and tokens and length:
        made["task_inputs"] = torch.randint(0, tokens, (batch, length), generator=gen, device=gen.device)
    latent = _count(config, "latent_query_num")
    if "image_embeds_position_mask" in accepts and latent and ids is not None and images is not None:
        room = torch.randint(0, vocab(text_config(config)) or 1, (batch, latent + 2), generator=gen, device=gen.device)
        made["input_ids"] = torch.cat([room, ids], dim=1)  # <image>, a place per image embedding, </image>, text
        mask = torch.zeros_like(made["input_ids"])
        mask[:, 1:1 + latent] = 1
        made["image_embeds_position_mask"] = mask
    if images is not None and images.dim() == 4 and {"prompt_pixel_values", "prompt_masks"} <= required:
        half = (*images.shape[:2], images.shape[2] // 2, images.shape[3])  # its image_size stacks prompt and image
        for name in ("pixel_values", "prompt_pixel_values", "prompt_masks"):
            made[name] = torch.randn(half, generator=gen, device=gen.device, dtype=images.dtype)
    return made


def _tiled_images(vis: Any, images: torch.Tensor, accepts: set, text: int) -> Dict[str, torch.Tensor]:
    """Images as Mllama (Llama 3.2 Vision) takes them: one image a sequence, cut into at most ``max_num_tiles``
    tiles of ``image_size`` a side, here one tile (aspect ratio 1:1, its id 1) and the other tiles zero and
    masked out, as its processor pads them; the text (``text`` tokens, 0 for none) sees that one tile
    (``cross_attention_mask``)."""
    tiles = _count(vis, "max_num_tiles")
    batch = images.shape[0]
    padded = torch.zeros(batch, 1, tiles, *images.shape[1:], device=images.device, dtype=images.dtype)
    padded[:, 0, 0] = images
    mask = torch.zeros(batch, 1, tiles, dtype=torch.long, device=images.device)
    mask[..., 0] = 1
    made = {"pixel_values": padded, "aspect_ratio_ids": torch.ones(batch, 1, dtype=torch.long, device=images.device),
            "aspect_ratio_mask": mask}
    if text and "cross_attention_mask" in accepts:
        made["cross_attention_mask"] = mask[:, None].expand(batch, text, 1, tiles).contiguous()
    return made


def _positioned_patches(vis: Any, batch: int, gen: torch.Generator, dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    """Images as Gemma 4's vision tower takes them: each a square grid of flattened patches of
    ``channels x patch_size**2`` values, and each patch's ``(x, y)`` position in its grid. The grid is
    4 pooling kernels a side (``pooling_kernel_size``), so that the tower's pooler gives 16 tokens."""
    patch = _count(vis, "patch_size") or 16
    channels = _count(vis, "num_channels") or 3
    side = 4 * (_count(vis, "pooling_kernel_size") or 1)
    y, x = torch.meshgrid(torch.arange(side, device=gen.device), torch.arange(side, device=gen.device), indexing="ij")
    positions = torch.stack([x.flatten(), y.flatten()], dim=-1)
    return {"pixel_values": torch.rand(batch, side * side, channels * patch * patch, generator=gen, device=gen.device,
                                       dtype=dtype),
            "pixel_position_ids": positions.unsqueeze(0).expand(batch, -1, -1).contiguous()}


def first_consumer(model: nn.Module) -> Optional[nn.Module]:
    """The first module, in definition order, that can tell the input's shape."""
    kinds = (nn.Linear, nn.modules.conv._ConvNd, nn.Embedding, nn.RNNBase, nn.MultiheadAttention,
             nn.TransformerEncoderLayer)
    for module in model.modules():
        if isinstance(module, kinds):
            return module
    return None


def _features_from_first_layer(model: nn.Module, batch: int, gen: torch.Generator,
                               dtype: torch.dtype) -> Optional[torch.Tensor]:
    """Frames x features for a model that needs ``input_features`` and whose config does not size them
    (Wav2Vec2-BERT's 160-wide stacked filterbanks, read by its first layer, a Linear): 64 frames as wide as
    that Linear reads. None where the first layer is not a Linear."""
    first = first_consumer(model)
    if not isinstance(first, nn.Linear):
        return None
    return torch.randn(batch, FEATURE_FRAMES, first.in_features, generator=gen, device=gen.device, dtype=dtype)


def other_layouts(model: nn.Module, kwargs: Dict[str, Any], seed: int) -> Iterator[Tuple[str, Dict[str, Any]]]:
    """Other layouts of inferred inputs, to try in turn where the model's forward refuses them (each made
    only when it is reached).

    A config names the sizes of an audio input, not its layout, and models of one kind disagree:
    a waveform is ``batch x samples`` for Wav2Vec2 and ``batch x 1 x samples`` for a codec or
    OmniASR, whose first convolution reads it as is; a spectrogram is ``frames x mel bins`` for
    Parakeet and ``mel bins x frames`` for a Whisper-style convolution stem (GLM-ASR, Voxtral
    Realtime); a front end that stacks frames (Fun-ASR's 7, Granite Speech's) reads features several
    times the mel bins wide, which its first layer, a Linear, gives. A keypoint matcher (SuperGlue,
    LightGlue, EfficientLoFTR) takes its images in pairs: ``batch x 2 x channels x H x W``; after that,
    IDEFICS takes an axis of images (one each here, with an ``image_attention_mask`` that lets every token see
    it) and InstructBLIP-Video an axis of frames: ``batch x 1 x channels x H x W``. A vision tower fed
    flattened patches with their ``grid_thw`` may read each patch as an image (Kimi K2.5's convolution
    stem): ``patches x channels x patch x patch``. Each entry
    is a description (``"input_values as (2, 1, 4000)"``) and the inputs with that one changed. No layout
    changes the number of frames, so a mask over them stays as it is."""
    def described(name: str, changed: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
        return f"{name} as {tuple(changed[name].shape)}", changed

    wave = kwargs.get("input_values")
    if isinstance(wave, torch.Tensor) and wave.is_floating_point() and wave.dim() == 2:
        yield described("input_values", {**kwargs, "input_values": wave.unsqueeze(1)})
    images = kwargs.get("pixel_values")
    if isinstance(images, torch.Tensor) and images.is_floating_point() and images.dim() == 4:
        other = _randn(tuple(images.shape), images, seed + 1)  # the inputs' own seed drew the first image
        yield described("pixel_values", {**kwargs, "pixel_values": torch.stack([images, other], dim=1)})
        one = {**kwargs, "pixel_values": images.unsqueeze(1)}  # images (IDEFICS) or frames (InstructBLIP-Video)
        ids = kwargs.get("input_ids")
        if isinstance(ids, torch.Tensor) and ids.dim() == 2 and "image_attention_mask" in forward_parameters(model):
            one["image_attention_mask"] = torch.ones(*ids.shape, 1, dtype=torch.long, device=ids.device)  # all see it
        yield described("pixel_values", one)
    patch = getattr(getattr(model, "config", None), "patch_size", None)
    grid = next((g for g in ("grid_thw", "image_grid_thw") if isinstance(kwargs.get(g), torch.Tensor)), None)
    if grid is not None and isinstance(patch, int) and patch > 0:
        for name, flat in kwargs.items():  # flattened patches as images of one patch each (Kimi K2.5's conv stem)
            if isinstance(flat, torch.Tensor) and flat.is_floating_point() and flat.dim() == 2 \
                    and flat.shape[1] % (patch * patch) == 0:
                square = flat.reshape(flat.shape[0], flat.shape[1] // (patch * patch), patch, patch)
                yield described(name, {**kwargs, name: square})
                tokens = _merged_tokens(model.config, kwargs[grid], flat, seed)
                if tokens is not None:
                    yield described(name, {**kwargs, name: tokens[0], grid: tokens[1]})
    feats = kwargs.get("input_features")
    if isinstance(feats, torch.Tensor) and feats.is_floating_point() and feats.dim() == 3:
        yield described("input_features", {**kwargs, "input_features": feats.transpose(1, 2).contiguous()})
        first = first_consumer(model)
        if isinstance(first, nn.Linear) and first.in_features != feats.shape[-1] and \
                getattr(model, "main_input_name", None) == "input_features":
            wide = _randn((feats.shape[0], feats.shape[1], first.in_features), feats, seed)
            yield described("input_features", {**kwargs, "input_features": wide})


def _merged_tokens(config: Any, grid: torch.Tensor, flat: torch.Tensor,
                   seed: int) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """Flattened patches as a tower that counts its grid in merged tokens takes them (Inkling 2): each token's
    ``spatial_merge_size**2`` patches as one channels-last image, ``tokens x (patch * merge) x (patch * merge) x
    channels``, and the grid over the tokens; None where the config names no merge, or it does not divide the grid."""
    merge, patch = _count(config, "spatial_merge_size"), config.patch_size
    channels = _count(config, "num_channels") or 3
    if merge < 2 or bool((grid[:, 1:] % merge).any()):
        return None
    side = patch * merge
    images = _randn((flat.shape[0] // (merge * merge), side, side, channels), flat, seed)
    return images, grid // torch.tensor([1, merge, merge], dtype=grid.dtype, device=grid.device)


def _randn(shape: Tuple[int, ...], like: torch.Tensor, seed: int) -> torch.Tensor:
    """Standard-normal values of ``like``'s device and dtype, from a generator of that device seeded with ``seed``."""
    return draw.randn(shape, draw.generator(like.device, seed), like.device, like.dtype)


def _frames_mask(config: Any, features: torch.Tensor, model: nn.Module) -> torch.Tensor:
    """Every frame of the spectrogram real: ones over its frame axis."""
    frames = _frame_count(config, features, model)
    return torch.ones(features.shape[0], frames, dtype=torch.long, device=features.device)


def _frame_count(config: Any, features: torch.Tensor, model: nn.Module) -> int:
    """The frames of a spectrogram: its axis that is not the mel bins (the config's ``num_mel_bins``, else the
    width the model's first layer, a Linear, reads: XCodec2's stacked filterbanks)."""
    first = first_consumer(model)
    bins = _count(config, "num_mel_bins") or (first.in_features if isinstance(first, nn.Linear) else 0)
    return features.shape[-2] if bins and features.shape[-1] == bins and features.dim() >= 3 else features.shape[-1]


def _named_spectrogram(model: nn.Module, config: Any, batch: int, gen: torch.Generator,
                       dtype: torch.dtype) -> Optional[torch.Tensor]:
    """The main input of an audio model that names it otherwise (Gemma 3n's ``audio_mel``): frames x features
    as wide as its config's ``input_feat_size``, else the spectrogram its config sizes; None for a model whose
    ``input_modalities`` are not audio."""
    modalities = getattr(model, "input_modalities", None)
    if "audio" not in ((modalities,) if isinstance(modalities, str) else tuple(modalities or ())):
        return None
    width = _count(config, "input_feat_size")
    if width:
        return torch.randn(batch, FEATURE_FRAMES, width, generator=gen, device=gen.device, dtype=dtype)
    return _one_input(config, "input_features", batch, gen, dtype)


def _own_mask(model: nn.Module, name: str, x: torch.Tensor) -> torch.Tensor:
    """The mask over the frames of the main input that a forward requires under the input's name and ``_mask``
    (Gemma 3n's ``audio_mel_mask``), with every frame real. A boolean mask (its annotation) that the model's
    code negates by name (``~audio_mel_mask``, to get the valid frames) marks padding with True: all False;
    else every frame is marked real: all True, or ones."""
    try:
        annotation = inspect.signature(model.forward).parameters[name].annotation
        source = inspect.getsource(inspect.getmodule(type(model)))
    except (KeyError, TypeError, OSError, ValueError):
        annotation, source = None, ""
    shape = (x.shape[0], x.shape[1])
    if "Bool" in str(annotation) or annotation is bool:
        return torch.full(shape, f"~{name}" not in source, dtype=torch.bool, device=x.device)
    return torch.ones(shape, dtype=torch.long, device=x.device)


def _reads_hidden_states(model: nn.Module, config: Any) -> bool:
    """Whether a model whose main input is ``input_values`` reads hidden states rather than a waveform (SpeechT5
    without its pre-nets): it has no convolution to read a waveform with, and its first layer, a Linear, reads
    its config's ``hidden_size``."""
    first = first_consumer(model)
    width = _count(config, "hidden_size")
    return (isinstance(first, nn.Linear) and first.in_features == width > 0
            and not any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules()))


def _hidden_states(config: Any, accepts: set, batch: int, gen: torch.Generator,
                   dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    """Hidden states of ``HF_TOKENS`` steps at the config's width as ``input_values``, and as the decoder's
    ``decoder_input_values`` where the forward takes them (SpeechT5 without pre-nets)."""
    made = {"input_values": torch.randn(batch, HF_TOKENS, config.hidden_size, generator=gen, device=gen.device,
                                        dtype=dtype)}
    if "decoder_input_values" in accepts:
        made["decoder_input_values"] = torch.randn(batch, HF_TOKENS, config.hidden_size, generator=gen,
                                                   device=gen.device, dtype=dtype)
    return made


def _streamed_features(model: nn.Module, config: Any, features: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """The spectrogram of a model that adds its audio's embeddings to the text's, token by token (Voxtral
    Realtime: ``audio_length_per_tok`` frames a token): as many frames as the ``HF_TOKENS`` tokens take,
    mel bins x frames where the first layer, a convolution, reads the bins as its channels."""
    bins = _count(audio_config(config), "num_mel_bins") or features.shape[-1]
    frames = HF_TOKENS * config.audio_length_per_tok
    first = first_consumer(model)
    shape = (bins, frames) if isinstance(first, nn.Conv1d) and first.in_channels == bins else (frames, bins)
    return torch.randn(features.shape[0], *shape, generator=gen, device=gen.device, dtype=features.dtype)


def _aligned_waveform(model: nn.Module, config: Any, wave: torch.Tensor, features: torch.Tensor,
                      gen: torch.Generator) -> torch.Tensor:
    """The waveform of a model that takes it beside its spectrogram and joins their frames (XCodec2's acoustic
    and semantic encoders): as many whole hops of its codec (the product of ``downsampling_ratios``) as the
    spectrogram has frames; the waveform as is where the config names no hops."""
    strides = getattr(config, "downsampling_ratios", None)
    if not (isinstance(strides, (list, tuple)) and strides and all(isinstance(v, int) and v > 0 for v in strides)):
        return wave
    frames = _frame_count(audio_config(config), features, model)
    return torch.randn(*wave.shape[:-1], math.prod(strides) * frames, generator=gen, device=gen.device,
                       dtype=wave.dtype)


def _qformer_ids(config: Any, batch: int, gen: torch.Generator) -> torch.Tensor:
    """The instruction's tokens for an InstructBLIP Q-Former, from its own vocabulary."""
    qformer = next(iter(_subs(config, ("qformer_config",))), None)
    n = vocab(qformer) if qformer is not None else 0
    n = n or vocab(text_config(config)) or 2
    return torch.randint(0, n, (batch, HF_TOKENS), generator=gen, device=gen.device)


# ------------------------------------------------------------------ sub-configs
def _subs(config: Any, keys: Tuple[str, ...]) -> List[Any]:
    return [s for k in keys if (s := getattr(config, k, None)) is not None and not isinstance(s, (dict, str))]


def text_config(config: Any) -> Any:
    """The config that sizes the token ids: the encoder's of a composite encoder-decoder, the text model's
    of a multimodal model or a model and vocoder pair, else the config itself."""
    for sub in _subs(config, ("encoder", "model_config")):  # a composite: its encoder, or its text model
        if vocab(sub) > 0:
            return sub
    if vocab(config) > 0:
        return config
    get = getattr(config, "get_text_config", None)
    try:
        text = get() if callable(get) else None
    except (AttributeError, ValueError, TypeError):
        text = None
    return text if text is not None else config


def vision_config(config: Any) -> Any:
    """The config that sizes the images: the vision tower's, else the config itself, else (a head on a
    backbone that sizes them: ViTPose's 256 x 192) its backbone's or its vision tower's backbone's (SAM 2)."""
    subs = [s for s in _subs(config, VISION_KEYS) if getattr(s, "image_size", None) is not None]
    if subs or getattr(config, "image_size", None) is not None:
        return subs[0] if subs else config
    subs = [s for s in _subs(config, VISION_KEYS) if _count(s, "num_patches")]  # a NaFlex tower (SigLIP 2)
    if subs:
        return subs[0]
    for owner in [config] + _subs(config, VISION_KEYS):  # SAM 2's Hiera backbone, within its vision config
        backbone = _subs(owner, ("backbone_config",))
        if backbone and getattr(backbone[0], "image_size", None) is not None:
            return backbone[0]
    return config


def audio_config(config: Any) -> Any:
    """The config that sizes the spectrogram: an audio sub-config's (``audio_config``, ``encoder``, ...), else
    any other sub-config's that sizes one (Nemotron 3.5 Transcribe's ``asr_config``), else the config itself."""
    named = _subs(config, AUDIO_KEYS)
    others = [s for s in _subs(config, tuple(getattr(config, "sub_configs", None) or ())) if s not in named]
    subs = [s for s in named + others if _feature_shape(s) is not None]
    return subs[0] if subs else config


def vocab(config: Any) -> int:
    return _count(config, "vocab_size")


def _describes(config: Any, name: str) -> bool:
    """Whether the config sizes an optional input: a text vocabulary, a vision tower, a spectrogram."""
    if name == "input_ids":
        return vocab(text_config(config)) > 0
    if name == "pixel_values":  # a vision tower of fixed-size images, or of a number of patches (SigLIP 2)
        vis = vision_config(config)
        return getattr(vis, "image_size", None) is not None or _count(vis, "num_patches") > 0 \
            or _count(vis, "max_img_size") > 0
    if name == "input_features":
        return _feature_shape(audio_config(config)) is not None
    return False


# ------------------------------------------------------------------ one input
def _one_input(config: Any, name: str, batch: int, gen: torch.Generator, dtype: torch.dtype) -> Optional[torch.Tensor]:
    if name == "input_ids":
        n = vocab(text_config(config))
        if n > 0 and _count(config, "codebook_vocab_size") and _count(config, "num_codebooks"):
            return _text_and_codes(config, n, batch, gen)
        return torch.randint(0, n, (batch, HF_TOKENS), generator=gen, device=gen.device) if n > 0 else None
    if name in ("pixel_values", "pixel_values_videos"):
        vis = vision_config(config)
        size = getattr(vis, "image_size", None) or getattr(vis, "crop_size", None) \
            or getattr(vis, "max_img_size", None) or IMAGE_SIDE  # TVP pads its frames to max_img_size
        height, width = (size, size) if isinstance(size, int) else (int(size[0]), int(size[-1]))
        ratios, patch = getattr(vis, "scaled_images_ratios", None), getattr(vis, "patch_size", None)
        if isinstance(patch, int) and isinstance(ratios, (list, tuple)) and ratios and min(ratios) > 0:
            # Depth Pro: the image is scaled by each ratio and cut into patches of patch_size; the smallest
            # scale must hold one patch (1536 pixels a side for 384 and 0.25)
            height = width = max(height, width, math.ceil(patch / min(ratios)))
        windows = _count(vis, "num_windows_side") or _count(vis, "num_windows")
        if isinstance(patch, int) and patch > 0 and windows:  # RF-DETR's windowed DINOv2: whole windows of patches
            step = patch * windows  # 518 (37 patches of 14) -> 560, 4 windows of 10 patches a side
            height, width = step * math.ceil(height / step), step * math.ceil(width / step)
        channels = getattr(vis, "num_channels", None) or getattr(vis, "in_chans", None) \
            or getattr(config, "num_channels", None) or 3
        frames = _frames(vis) or _frames(config) or (VIDEO_FRAMES if name == "pixel_values_videos" else None)
        if frames:  # a video model (VideoMAE, ViViT, TimeSformer, X-CLIP, V-JEPA 2): frames x channels x H x W
            return torch.randn(batch, frames, int(channels), height, width, generator=gen, device=gen.device,
                               dtype=dtype)
        return torch.randn(batch, int(channels), height, width, generator=gen, device=gen.device, dtype=dtype)
    if name == "past_values":  # a time-series model
        context, patch = _count(config, "context_length"), _count(config, "patch_length")
        channels = _count(config, "num_input_channels")
        lags = getattr(config, "lags_sequence", None)
        if context and lags:  # the Time Series Transformer, Informer, Autoformer: the context and its lags
            length, size = context + max(lags), _count(config, "input_size") or 1
            shape = (batch, length) if size == 1 else (batch, length, size)
            return torch.randn(*shape, generator=gen, device=gen.device, dtype=dtype)
        if context and channels:  # PatchTST, PatchTSMixer: context x channels
            return torch.randn(batch, context, channels, generator=gen, device=gen.device, dtype=dtype)
        if patch:  # TimesFM: a univariate series of HF_TOKENS patches (at most its context)
            length = min(patch * HF_TOKENS, context or patch * HF_TOKENS)
            return torch.randn(batch, length, generator=gen, device=gen.device, dtype=dtype)
        return None
    if name == "states" and _count(config, "state_dim"):  # a Decision Transformer: a trajectory's states
        return torch.randn(batch, DECISION_STEPS, config.state_dim, generator=gen, device=gen.device, dtype=dtype)
    if name == "inputs_embeds" and _count(config, "hidden_size"):  # a model fed another's states (word timestamps)
        return torch.randn(batch, HF_TOKENS, config.hidden_size, generator=gen, device=gen.device, dtype=dtype)
    if name == "inputs" and isinstance(getattr(config, "d_model", None), int):  # a Perceiver without a preprocessor
        return torch.randn(batch, HF_TOKENS, config.d_model, generator=gen, device=gen.device, dtype=dtype)
    if name == "input_values":
        frames, bins = getattr(config, "max_length", None), getattr(config, "num_mel_bins", None)
        if isinstance(frames, int) and isinstance(bins, int):  # a spectrogram transformer (AST): frames x mel bins
            return torch.randn(batch, frames, bins, generator=gen, device=gen.device, dtype=dtype)
        channels = getattr(config, "audio_channels", None)
        if not isinstance(channels, int) and _count(config, "codebook_size"):  # a codec that names no channels: mono (DAC)
            channels = 1
        samples = AUDIO_SAMPLES
        strides = getattr(config, "patch_sizes", None)
        if isinstance(strides, (list, tuple)) and strides and all(isinstance(v, int) and v > 0 for v in strides):
            hop = math.prod(strides)  # a waveform cut into patches of patches (Muse Spark: 1920 samples an embedding)
            samples = hop * max(2, math.ceil(AUDIO_SAMPLES / hop))
        if isinstance(channels, int) and not isinstance(channels, bool):  # a codec (EnCodec, Mimi): channels x samples
            return torch.randn(batch, channels, samples, generator=gen, device=gen.device, dtype=dtype)
        return torch.randn(batch, samples, generator=gen, device=gen.device, dtype=dtype)
    if name == "flattened_patches":  # Pix2Struct: each patch its row, its column (from 1) and its values
        vis = next(iter(_subs(config, ("vision_config",))), config)
        width, most = _count(vis, "patch_embed_hidden_size"), _count(vis, "seq_len")
        if not width:
            return None
        side = max(1, min(PATCH_GRID, int(most ** 0.5) if most else PATCH_GRID))
        rows, cols = torch.meshgrid(torch.arange(1, side + 1, device=gen.device),
                                    torch.arange(1, side + 1, device=gen.device), indexing="ij")
        ids = torch.stack([rows.flatten(), cols.flatten()], dim=-1).to(dtype).expand(batch, -1, -1)
        values = torch.randn(batch, side * side, width, generator=gen, device=gen.device, dtype=dtype)
        return torch.cat([ids, values], dim=-1)
    if name == "input_features":
        shape = _feature_shape(audio_config(config))
        return None if shape is None else torch.randn(batch, *shape, generator=gen, device=gen.device, dtype=dtype)
    return None


def _text_and_codes(config: Any, n: int, batch: int, gen: torch.Generator) -> torch.Tensor:
    """Ids of a model that reads text and audio codes side by side (Kyutai's speech-to-text): each step a text
    token, then one code of each of its ``num_codebooks`` codebooks, below ``codebook_vocab_size``."""
    text = torch.randint(0, n, (batch, HF_TOKENS, 1), generator=gen, device=gen.device)
    codes = torch.randint(0, config.codebook_vocab_size, (batch, HF_TOKENS, config.num_codebooks), generator=gen,
                          device=gen.device)
    return torch.cat([text, codes], dim=-1)


def _series_features(config: Any, accepts: set, past: torch.Tensor, gen: torch.Generator,
                     dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    """What the Time Series Transformer, Informer and Autoformer take beside ``past_values``: its time features
    (``num_time_features`` a step) and observed mask, the static features the config counts, and, as in
    training, the ``prediction_length`` future values and their time features."""
    batch, length = past.shape[:2]
    features = _count(config, "num_time_features")
    made: Dict[str, torch.Tensor] = {
        "past_time_features": torch.randn(batch, length, features, generator=gen, device=gen.device, dtype=dtype),
        "past_observed_mask": torch.ones_like(past)}
    horizon = _count(config, "prediction_length")
    if horizon and "future_values" in accepts:
        made["future_values"] = torch.randn(batch, horizon, *past.shape[2:], generator=gen, device=gen.device,
                                            dtype=dtype)
        if "future_time_features" in accepts:
            made["future_time_features"] = torch.randn(batch, horizon, features, generator=gen, device=gen.device,
                                                       dtype=dtype)
    cardinality = list(getattr(config, "cardinality", None) or [])
    if _count(config, "num_static_categorical_features") and "static_categorical_features" in accepts and cardinality:
        made["static_categorical_features"] = torch.stack(
            [torch.randint(0, int(c), (batch,), generator=gen, device=gen.device) for c in cardinality], dim=1)
    real = _count(config, "num_static_real_features")
    if real and "static_real_features" in accepts:
        made["static_real_features"] = torch.randn(batch, real, generator=gen, device=gen.device, dtype=dtype)
    return made


def _trajectory(config: Any, states: torch.Tensor, gen: torch.Generator, dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    """What a Decision Transformer takes beside its states: actions in ``[-1, 1]`` (``act_dim`` a step, a
    tanh policy's range), rewards and returns-to-go (one a step), the steps' times within an episode of
    ``max_ep_len`` and an attention mask over every step."""
    batch, steps = states.shape[:2]
    made = {"actions": torch.rand(batch, steps, config.act_dim, generator=gen, device=gen.device, dtype=dtype) * 2 - 1,
            "rewards": torch.randn(batch, steps, 1, generator=gen, device=gen.device, dtype=dtype),
            "returns_to_go": torch.randn(batch, steps, 1, generator=gen, device=gen.device, dtype=dtype)}
    start = torch.randint(0, max(_count(config, "max_ep_len") - steps, 1), (batch, 1), generator=gen, device=gen.device)
    made["timesteps"] = start + torch.arange(steps, device=gen.device)
    made["attention_mask"] = torch.ones(batch, steps, dtype=torch.long, device=gen.device)
    return made


def _boxes(ids: torch.Tensor, gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """A box per token for a layout model that requires them (BROS: ``dim_bbox`` in its config; UDOP, whose
    forward also takes its image patches' boxes, ``visual_bbox``, and places each token on its patch grid), as
    ``(x0, y0, x1, y1)`` in ``[0, 1]`` of the page, each corner's coordinates in order."""
    corners = torch.rand(*ids.shape, 2, 2, generator=gen, device=gen.device, dtype=dtype).sort(dim=-2).values
    return corners.reshape(*ids.shape, 4)  # (x0, y0), then (x1, y1)


def _count(config: Any, key: str) -> int:
    """``config.key`` when it is a positive int, else 0."""
    value = getattr(config, key, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _frames(config: Any) -> Optional[int]:
    """The frames per clip a video config sizes its position embeddings for (``num_frames``, V-JEPA 2's
    ``frames_per_clip``), else None."""
    return _count(config, "num_frames") or _count(config, "frames_per_clip") or None


def _feature_shape(config: Any) -> Optional[Tuple[int, ...]]:
    """Per-example shape of ``input_features``: Whisper's log-mel spectrogram (mel bins x frames, the
    encoder takes exactly ``2 * max_source_positions`` frames); CLAP's audio encoder (a ``spec_size``
    spectrogram transformer): channels x frames x mel bins, the 1001 frames of its feature extractor's
    10-second clip, or fewer where its ``spec_size`` square holds fewer (``spec_size**2 / bins``); Qwen3-ASR's
    chunked encoder (``n_window``): mel bins x one chunk of ``2 * n_window`` frames; else frames x features
    (Speech2Text, Parakeet): 64 frames."""
    bins, positions = getattr(config, "num_mel_bins", None), getattr(config, "max_source_positions", None)
    channels = _count(config, "patch_embed_input_channels")
    spec = _count(config, "spec_size")
    if channels and spec and isinstance(bins, int) and bins > 0:  # at most the frames its spectrogram image holds
        return channels, max(1, min(CLAP_FRAMES, spec * (spec // bins))), bins
    if isinstance(bins, int) and isinstance(positions, int):
        return bins, 2 * positions
    per_channel = getattr(config, "input_feat_per_channel", None)
    if isinstance(per_channel, int):
        return FEATURE_FRAMES, per_channel * int(getattr(config, "input_channels", 1) or 1)
    window = _count(config, "n_window")
    if isinstance(bins, int) and window:  # Qwen3-ASR's chunked encoder: mel bins x one chunk of 2 x n_window frames
        return bins, 2 * window
    if isinstance(bins, int):  # frames x mel bins, as a feature extractor pads them (Parakeet, Canary)
        return FEATURE_FRAMES, bins
    return None


# ------------------------------------------------------------------ placeholder tokens
def _token(config: Any, keys: Tuple[str, ...]) -> Optional[int]:
    for key in keys:
        for cfg in (config, text_config(config)):
            value = getattr(cfg, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
    return None


def _with_placeholders(model: nn.Module, config: Any, inputs: Dict[str, Any], gen: torch.Generator) -> torch.Tensor:
    """The random ids with no special token drawn by chance, and, for each modality given that fills
    placeholders, one placeholder per feature of its example after the text tokens (one an example where the
    model expands it into the features itself, with an attention mask over the ids, from which it reads the padding
    side)."""
    ids = inputs["input_ids"]
    n = vocab(text_config(config))
    special = {t for k in SPECIAL_KEYS if (t := _token(config, (k,))) is not None}
    for token in special:  # a drawn special token would ask for a feature that is not there
        ids = torch.where(ids == token, (ids + 1) % n, ids)
        ids = torch.where(ids == token, (ids + 1) % n, ids)  # token + 1 may be special too
    parts, merged = [ids], False
    for name, keys, method, merge in PLACEHOLDERS:
        token = _token(config, keys)
        encodes = callable(getattr(model, method, None)) or callable(getattr(model, merge, None))
        if name not in inputs or not (token is not None and encodes
                                      or token is None and _unset(config, keys) and name not in required_parameters(model)):
            continue
        count = None
        if token is not None and token < n and not callable(getattr(model, method, None)):
            count = 1  # one placeholder an example, which the model's own merge expands into its features
            merged = True
        elif token is not None and token < n and callable(getattr(model, method, None)):  # else not embedded or counted
            for form in _forms(inputs[name]):  # one image per example, or a list of images per example
                count = count_features(model, config, method, {name: form[:1]})
                if count is not None:
                    inputs[name] = form
                    break
        if count is None:  # the forward runs on the text alone
            for unused in (name,) + (FRAME_MASKS if name == "input_features" else ()):
                inputs.pop(unused, None)
            continue
        parts.append(torch.full((ids.shape[0], count), token, dtype=ids.dtype, device=ids.device))
    ids = torch.cat(parts, dim=1)
    if merged and "attention_mask" in forward_parameters(model):  # the merge reads the padding side from it
        inputs["attention_mask"] = torch.ones_like(ids)
    return ids


def _unset(config: Any, keys: Tuple[str, ...]) -> bool:
    """Whether the config names a placeholder token for the modality but leaves it unset (Voxtral's default
    ``audio_token_id``): no feature can be placed, and the forward runs on the text alone."""
    return any(hasattr(cfg, key) for key in keys for cfg in (config, text_config(config)))


def _forms(x: torch.Tensor) -> List[torch.Tensor]:
    return [x, x.unsqueeze(1)] if x.dim() == 4 else [x]


def count_features(model: nn.Module, config: Any, method: str, kwargs: Dict[str, Any]) -> Optional[int]:
    """How many placeholder tokens one example's features fill: the encoder's output elements over the
    text model's width (None where that is not a whole number, or the encoder refuses the input)."""
    width = getattr(text_config(config), "hidden_size", None)
    if not isinstance(width, int) or width <= 0:
        return None
    from ..probe.guard import saved_rng

    flags = [(m, m.training) for m in model.modules()]
    restore = saved_rng()  # every device's random state, not only the host's
    try:
        with torch.no_grad():
            model.eval()
            out = getattr(model, method)(**kwargs)
    except Exception:  # noqa: BLE001 - the user's encoder refusing this input: the forward then runs on the text
        return None
    finally:
        restore()
        for m, training in flags:
            m.training = training
    total = sum(t.numel() for t in _feature_tensors(out))
    return total // width if total and total % width == 0 else None


def _feature_tensors(out: Any) -> List[torch.Tensor]:
    """The projected features in what ``get_image_features`` returns: a tensor, a list of them, or an
    output whose ``pooler_output`` holds them."""
    if isinstance(out, torch.Tensor):
        return [out]
    pooled = getattr(out, "pooler_output", None)
    if pooled is not None:
        return _feature_tensors(pooled)
    if isinstance(out, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in out):
        return list(out)
    if isinstance(out, (list, tuple)) and out:
        return _feature_tensors(out[0])
    return []


# ------------------------------------------------------------------ what a forward needs in training mode
SPEECH_LABELS = ("spectrogram_labels", "duration_labels", "pitch_labels", "energy_labels")
FRAMES_PER_TOKEN = 2
"""Spectrogram frames each token lasts in a text-to-speech model's duration targets."""


def _training_inputs(config: Any, accepts: set, ids: torch.Tensor, gen: torch.Generator,
                     dtype: torch.dtype) -> Dict[str, Any]:
    """Inputs a forward refuses to run without in training mode (the probe runs in training mode):
    ``mm_token_type_ids`` (1 at a placeholder token, 0 at text), and a FastSpeech 2 model's
    variance-adaptor targets: each token lasts ``FRAMES_PER_TOKEN`` frames of the spectrogram."""
    out: Dict[str, Any] = {}
    if "mm_token_type_ids" in accepts:
        placeholders = [t for k in SPECIAL_KEYS if (t := _token(config, (k,))) is not None]
        out["mm_token_type_ids"] = torch.isin(ids, torch.tensor(placeholders, dtype=ids.dtype, device=ids.device)).long()
    bins = next((b for c in [config] + _subs(config, ("model_config",))
                 if isinstance(b := getattr(c, "num_mel_bins", None), int)), None)
    if set(SPEECH_LABELS) <= accepts and bins is not None:
        batch, tokens = ids.shape
        out["duration_labels"] = torch.full((batch, tokens), FRAMES_PER_TOKEN, dtype=torch.long, device=gen.device)
        out["pitch_labels"] = torch.randn(batch, tokens, 1, generator=gen, device=gen.device, dtype=dtype)
        out["energy_labels"] = torch.randn(batch, tokens, 1, generator=gen, device=gen.device, dtype=dtype)
        out["spectrogram_labels"] = torch.randn(batch, tokens * FRAMES_PER_TOKEN, bins, generator=gen, device=gen.device,
                                                dtype=dtype)
    return out


# ------------------------------------------------------------------ decoder
def decoder_input_ids(model: nn.Module, config: Any, batch: int, gen: torch.Generator) -> Optional[torch.Tensor]:
    """The decoder start token followed by random tokens, as a shifted-right target sequence: the start
    token is the config's ``decoder_start_token_id``, else the generation config's, else pad, else bos
    (the composite config's first, then its decoder's)."""
    decoder = next(iter(_subs(config, ("decoder", "decoder_config"))), None)
    n = vocab(decoder if decoder is not None else text_config(config))
    generation = getattr(model, "generation_config", None)
    candidates = [getattr(config, "decoder_start_token_id", None), getattr(generation, "decoder_start_token_id", None),
                  getattr(config, "pad_token_id", None), getattr(config, "bos_token_id", None)]
    for cfg in (decoder, text_config(config)):
        candidates += [getattr(cfg, k, None) for k in ("decoder_start_token_id", "pad_token_id", "bos_token_id")]
    start = next((c for c in candidates if isinstance(c, int) and not isinstance(c, bool) and 0 <= c < n), None)
    if start is None or n <= 0:
        return None
    length = min(HF_TOKENS, int(getattr(config, "max_target_positions", HF_TOKENS) or HF_TOKENS))
    ids = torch.randint(0, n, (batch, length), generator=gen, device=gen.device)
    ids[:, 0] = start
    return ids
