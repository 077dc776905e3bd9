"""OpenVLA's published checkpoint layout (the HF-format `openvla/openvla-7b` and the
OpenVLA-OFT fine-tunes) and this package's modules, in both directions.

    <folder>/config.json                        architecture (text_config, timm_model_ids, ...),
                                                norm_stats of the datasets trained on
    <folder>/model.safetensors[.index.json]     the tensors (one file, or shards and an index)
    <folder>/dataset_statistics.json            fine-tunes: the statistics of their dataset
    <folder>/preprocessor_config.json           the image processor's normalisation as applied
    <folder>/tokenizer.model, tokenizer*.json   Llama-2's tokenizer
    <folder>/action_head--<step>_checkpoint.pt  OFT: the L1 regression head (`module.` names)
    <folder>/proprio_projector--<step>_checkpoint.pt

Published names are timm's for the vision towers (`vision_backbone.featurizer.*`,
`.fused_featurizer.*`), `projector.fc1..3`, and transformers' Llama under `language_model.`.
Ours are transformers' towers under `vision.`, the projector under `projector.` and the Llama
under `backbone.`. The mapping joins each block's query, key and value into timm's `qkv`,
names LayerScale `scale_factor` (what the HF conversion renamed timm's `gamma` to), and drops
the zero position DINOv2 keeps for its class token in transformers but not in timm."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from embodied.core.errors import ConfigError
from embodied.policies.pretrained.prismatic import tower_spec
from embodied.policies.vla.action_tokens import NUM_BINS

PUBLISHED_FILES = ("model.safetensors", "model.safetensors.index.json")


def _tower_names(family: str, depth: int) -> list[tuple[str, str]]:
    """(timm name, ours) for every tensor that maps one to one; qkv and the position embedding
    are handled apart."""
    if family == "dinov2":
        pairs = [
            ("cls_token", "embeddings.cls_token"),
            ("reg_token", "embeddings.register_tokens"),
            ("patch_embed.proj.weight", "embeddings.patch_embeddings.projection.weight"),
            ("patch_embed.proj.bias", "embeddings.patch_embeddings.projection.bias"),
            ("norm.weight", "layernorm.weight"),
            ("norm.bias", "layernorm.bias"),
        ]
        block = {
            "norm1": "norm1",
            "attn.proj": "attention.o_proj",
            "norm2": "norm2",
            "mlp.fc1": "mlp.fc1",
            "mlp.fc2": "mlp.fc2",
        }
        blocks, layer_scales = "encoder.layer", True
    else:
        pairs = [
            ("patch_embed.proj.weight", "embeddings.patch_embedding.weight"),
            ("patch_embed.proj.bias", "embeddings.patch_embedding.bias"),
            ("norm.weight", "post_layernorm.weight"),
            ("norm.bias", "post_layernorm.bias"),
            ("attn_pool.latent", "head.probe"),
            ("attn_pool.proj.weight", "head.attention.out_proj.weight"),
            ("attn_pool.proj.bias", "head.attention.out_proj.bias"),
            ("attn_pool.norm.weight", "head.layernorm.weight"),
            ("attn_pool.norm.bias", "head.layernorm.bias"),
        ]
        pairs += [
            (f"attn_pool.mlp.{fc}.{p}", f"head.mlp.{fc}.{p}") for fc in ("fc1", "fc2") for p in ("weight", "bias")
        ]
        block = {
            "norm1": "layer_norm1",
            "attn.proj": "self_attn.out_proj",
            "norm2": "layer_norm2",
            "mlp.fc1": "mlp.fc1",
            "mlp.fc2": "mlp.fc2",
        }
        blocks, layer_scales = "encoder.layers", False
    for index in range(depth):
        for theirs, ours in block.items():
            for p in ("weight", "bias"):
                pairs.append((f"blocks.{index}.{theirs}.{p}", f"{blocks}.{index}.{ours}.{p}"))
        if layer_scales:
            pairs.append((f"blocks.{index}.ls1.scale_factor", f"{blocks}.{index}.layer_scale1.lambda1"))
            pairs.append((f"blocks.{index}.ls2.scale_factor", f"{blocks}.{index}.layer_scale2.lambda1"))
    return pairs


# transformers before 5.0 builds DINOv2's attention from two modules (self-attention, output);
# the mapping above uses the names 5.x gives. A tower built by an older one is renamed on the way
# in and out, so the published layout does not depend on the installed version.
_DINOV2_RENAMED = {
    ".attention.attention.query.": ".attention.q_proj.",
    ".attention.attention.key.": ".attention.k_proj.",
    ".attention.attention.value.": ".attention.v_proj.",
    ".attention.output.dense.": ".attention.o_proj.",
}


def _renamed(name: str, table: dict[str, str]) -> str:
    for old, new in table.items():
        if old in name:
            return name.replace(old, new)
    return name


def current_names(ours: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict under the names transformers 5 gives its towers."""
    return {_renamed(name, _DINOV2_RENAMED): tensor for name, tensor in ours.items()}


def installed_names(ours: dict[str, torch.Tensor], installed: list[str]) -> dict[str, torch.Tensor]:
    """`ours` (current names) under the names of a module whose state dict has `installed`."""
    if not any(old in name for name in installed for old in _DINOV2_RENAMED):
        return ours
    back = {new: old for old, new in _DINOV2_RENAMED.items()}
    return {_renamed(name, back): tensor for name, tensor in ours.items()}


def _attention_prefix(family: str, index: int) -> str:
    return f"encoder.layer.{index}.attention" if family == "dinov2" else f"encoder.layers.{index}.self_attn"


class Layout:
    """Published name -> how to make it from our state dict, and back."""

    def __init__(self, towers: list[tuple[str, str, int]], fused_projector: bool):
        # towers: (published prefix, family, depth), e.g. ("vision_backbone.featurizer.", "dinov2", 24)
        self.towers = towers
        self.fused_projector = fused_projector

    def to_published(self, ours: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        ours = current_names(ours)
        out: dict[str, torch.Tensor] = {}
        for (published, family, depth), ours_prefix in zip(
            self.towers, ("vision.featurizer.model.", "vision.fused_featurizer.model.")
        ):
            for theirs, mine in _tower_names(family, depth):
                out[published + theirs] = ours[ours_prefix + mine]
            for index in range(depth):
                attention = ours_prefix + _attention_prefix(family, index)
                for p in ("weight", "bias"):
                    out[f"{published}blocks.{index}.attn.qkv.{p}"] = torch.cat(
                        [ours[f"{attention}.{x}_proj.{p}"] for x in "qkv"]
                    )
            if family == "dinov2":
                position = ours[ours_prefix + "embeddings.position_embeddings"]
                if torch.any(position[:, 0] != 0):
                    raise ValueError("the DINOv2 class token's position embedding must be zero, as timm has none")
                out[published + "pos_embed"] = position[:, 1:]
            else:
                out[published + "pos_embed"] = ours[ours_prefix + "embeddings.position_embedding.weight"][None]
                in_proj = ours[ours_prefix + "head.attention.in_proj_weight"]
                in_bias = ours[ours_prefix + "head.attention.in_proj_bias"]
                width = in_proj.shape[1]
                out[published + "attn_pool.q.weight"], out[published + "attn_pool.kv.weight"] = (
                    in_proj[:width],
                    in_proj[width:],
                )
                out[published + "attn_pool.q.bias"], out[published + "attn_pool.kv.bias"] = (
                    in_bias[:width],
                    in_bias[width:],
                )
        for fc in ("fc1", "fc2", "fc3") if self.fused_projector else ("fc1", "fc2"):
            for p in ("weight", "bias"):
                out[f"projector.{fc}.{p}"] = ours[f"projector.{fc}.{p}"]
        for name, tensor in ours.items():
            if name.startswith("backbone."):
                out["language_model." + name.removeprefix("backbone.")] = tensor
        return out

    def from_published(self, theirs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Our names for `theirs` (which must be complete: check with `mismatches` first), as
        transformers 5 gives them (`installed_names` turns them into an older version's)."""
        out: dict[str, torch.Tensor] = {}
        for (published, family, depth), ours_prefix in zip(
            self.towers, ("vision.featurizer.model.", "vision.fused_featurizer.model.")
        ):
            for their_name, mine in _tower_names(family, depth):
                out[ours_prefix + mine] = theirs[published + their_name]
            for index in range(depth):
                attention = ours_prefix + _attention_prefix(family, index)
                for p in ("weight", "bias"):
                    for x, part in zip("qkv", theirs[f"{published}blocks.{index}.attn.qkv.{p}"].chunk(3)):
                        out[f"{attention}.{x}_proj.{p}"] = part
            position = theirs[published + "pos_embed"]
            if family == "dinov2":
                out[ours_prefix + "embeddings.position_embeddings"] = torch.cat(
                    [torch.zeros_like(position[:, :1]), position], 1
                )
                out[ours_prefix + "embeddings.mask_token"] = torch.zeros_like(position[0, :1])
            else:
                out[ours_prefix + "embeddings.position_embedding.weight"] = position[0]
                out[ours_prefix + "head.attention.in_proj_weight"] = torch.cat(
                    [theirs[published + "attn_pool.q.weight"], theirs[published + "attn_pool.kv.weight"]]
                )
                out[ours_prefix + "head.attention.in_proj_bias"] = torch.cat(
                    [theirs[published + "attn_pool.q.bias"], theirs[published + "attn_pool.kv.bias"]]
                )
        for name, tensor in theirs.items():
            if name.startswith("projector."):
                out[name] = tensor
            elif name.startswith("language_model."):
                out["backbone." + name.removeprefix("language_model.")] = tensor
        return out


def mismatches(expected: dict[str, tuple[int, ...]], found: dict[str, tuple[int, ...]]) -> list[str]:
    """What keeps `found` (name -> shape) from being `expected`: missing, left over, misshapen."""
    missing = sorted(set(expected) - set(found))
    extra = sorted(set(found) - set(expected))
    wrong = [
        f"{name} {found[name]} (expected {expected[name]})"
        for name in sorted(expected)
        if name in found and tuple(found[name]) != tuple(expected[name])
    ]
    problems = []
    for label, names in (("missing", missing), ("left over", extra), ("of another shape", wrong)):
        if names:
            shown = ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")
            problems.append(f"{label}: {shown}")
    return problems


# ---- reading a folder ---------------------------------------------------------------------------


def read_config(folder: Path) -> dict:
    file = folder / "config.json"
    if not file.is_file():
        raise ConfigError(f"policy.pretrained {folder} has no config.json (an OpenVLA checkpoint in HF format has one)")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{file} is not valid JSON: {error}") from None


def tensor_files(folder: Path) -> list[Path]:
    """The safetensors file, or the shards its index names."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / shard for shard in shards]
        absent = [file.name for file in files if not file.is_file()]
        if absent:
            raise ConfigError(f"{index} names shards that are not there: {absent}")
        return files
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    raise ConfigError(f"policy.pretrained {folder} holds neither of {PUBLISHED_FILES}")


def read_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    shapes = {}
    for file in files:
        with safe_open(str(file), "pt") as reader:
            for name in reader.keys():
                shapes[name] = tuple(reader.get_slice(name).get_shape())
    return shapes


def read_tensors(files: list[Path], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        for name, tensor in load_file(str(file)).items():
            tensors[name] = tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
    return tensors


def image_normalization(folder: Path, timm_ids: list[str], default: list[tuple]) -> list[tuple]:
    """Per tower (mean, std) as the checkpoint's image processor applies them
    (`tvf_normalize_params`: the published processor stores them rounded to bfloat16), else
    the towers' own constants."""
    file = folder / "preprocessor_config.json"
    if not file.is_file():
        return default
    params = json.loads(file.read_text()).get("tvf_normalize_params")
    if not params:
        return default
    if len(params) != len(timm_ids):
        raise ConfigError(f"{file} normalises {len(params)} images per frame, the model has {len(timm_ids)} towers")
    return [(tuple(p["mean"]), tuple(p["std"])) for p in params]


def read_torch_module(file: Path, expected: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """An OFT head saved with torch.save from a DDP-wrapped module (`module.` names); read with
    weights_only, so the file can hold tensors and nothing that runs."""
    try:
        saved = torch.load(str(file), map_location="cpu", weights_only=True)
    except Exception as error:  # a pickle that is not plain tensors
        raise ConfigError(f"{file} is not a file of tensors: {error}") from None
    tensors = {name.removeprefix("module."): tensor for name, tensor in saved.items()}
    problems = mismatches(expected, {name: tuple(t.shape) for name, t in tensors.items()})
    if problems:
        raise ConfigError(f"{file} does not fit the module: " + "; ".join(problems))
    return tensors


def latest_file(folder: Path, stem: str) -> Path | None:
    """`<stem>--<step>_checkpoint.pt` with the highest step, or None."""
    found = sorted(folder.glob(f"{stem}--*_checkpoint.pt"), key=lambda f: _step_of(f, stem))
    return found[-1] if found else None


def _step_of(file: Path, stem: str) -> int:
    step = file.name.removeprefix(f"{stem}--").removesuffix("_checkpoint.pt")
    return int(step) if step.isdigit() else -1


def parameters_on_meta() -> contextlib.AbstractContextManager:
    """A context in which modules get their parameters on the meta device (nothing random
    is computed for weights about to be replaced) and their buffers as usual (rotary
    frequencies and position ids are computed, not loaded). It patches
    `nn.Module.register_parameter` while it lasts: build in one thread at a time."""

    @contextlib.contextmanager
    def context():
        register = nn.Module.register_parameter

        def on_meta(module, name, param):
            register(module, name, param)
            if param is not None:
                kind = type(module._parameters[name])
                module._parameters[name] = kind(module._parameters[name].to("meta"), requires_grad=param.requires_grad)

        nn.Module.register_parameter = on_meta
        try:
            yield
        finally:
            nn.Module.register_parameter = register

    return context()


PUBLISHED_TOWERS = ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"]
TINY_TOWERS = ["tiny_dinov2_reg4", "tiny_siglip"]
# Llama-2 7B as the published config.json gives it (transformers' LlamaConfig defaults, with
# the vocabulary padded from 32000 to a multiple of 64)
PUBLISHED_TEXT = {"vocab_size": 32064, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-6,
                  "max_position_embeddings": 2048, "pad_token_id": 32000}  # fmt: skip
PAD_TO_MULTIPLE = 64


def random_config(cfg: Any) -> dict:
    """A published-style config.json for random weights at `cfg.variant`'s size (a policy
    config: `variant`, and for tiny `vocab_size`, `hidden_size`, `num_layers`, `num_heads`)."""
    if cfg.variant == "7b":
        text, towers = dict(PUBLISHED_TEXT), PUBLISHED_TOWERS
    else:
        if cfg.vocab_size < 259 + NUM_BINS:
            raise ConfigError(
                f"policy.vocab_size must hold 259 byte ids and {NUM_BINS} action ids, got {cfg.vocab_size}"
            )
        text = {
            "vocab_size": cfg.vocab_size + PAD_TO_MULTIPLE,
            "hidden_size": cfg.hidden_size,
            "intermediate_size": 2 * cfg.hidden_size,
            "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads,
            "num_key_value_heads": cfg.num_heads,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 2048,
            "pad_token_id": cfg.vocab_size,
        }
        towers = TINY_TOWERS
    return {
        "model_type": "openvla",
        "prompt_tokenizer": "bytes",
        "arch_specifier": "no-align+fused-gelu-mlp",
        "use_fused_vision_backbone": True,
        "timm_model_ids": list(towers),
        "image_sizes": [tower_spec(t).image_size for t in towers],
        "image_resize_strategy": "resize-naive",
        "n_action_bins": NUM_BINS,
        "pad_to_multiple_of": PAD_TO_MULTIPLE,
        "text_config": text,
    }
