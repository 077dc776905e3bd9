"""SmolVLA (`policy=smolvla`): lerobot's flow-matching VLA on SmolVLM (about 450M parameters
at its published size), loaded from lerobot's checkpoint layout (`model.safetensors`,
`config.json` and its processors), driven by this project's flow samplers, log-likelihoods,
PPO/GRPO and SFT as `policy=flow` and `pi0` are. The network is policies/pretrained/smolvla_model.py.

The VLM's sizes come from SmolVLM's own config.json (`policy.vlm`: a local folder, which also
holds its tokenizer; `auto` takes the checkpoint's `vlm_model_name` where that is a local
folder), or `tiny` for tests. Everything else the checkpoint fixes (layers kept, the expert's
width, how often it attends jointly, padded sizes, chunk, denoising steps, image size, prompt
length) is read from its config.json where the policy's setting is 0 or `auto`, and a setting
that disagrees is refused. The instruction is prompted as lerobot's SmolVLA does: the text and
a newline; images are resized keeping their aspect ratio and padded on the left and top.

The context the samplers pass around is one tensor per prefix token: [valid, the VLM's output,
each layer's key and value], so the prefix runs once per observation. Value head: the mean of
the VLM's valid outputs (the state is among them), detached by default; Flow-Noise's noise
head reads the expert's action tokens. Neither is in a checkpoint: both start fresh."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from embodied.core.errors import ConfigError
from embodied.core.registry import POLICIES
from embodied.core.types import EnvSpec, Observation
from embodied.policies.denoising.flow import FlowPolicyConfig
from embodied.policies.gaussian.mlp import mlp
from embodied.policies.pretrained.pretrained_flow import (
    PretrainedFlowVLA,
    check_normalization,
    pooled,
    published_config,
)
from embodied.policies.pretrained.smolvla_model import (
    TINY_SMOLVLM,
    SmolVLAModel,
    SmolVLMSize,
    load_smolvla_checkpoint,
    read_smolvlm_size,
    resize_with_pad,
)
from embodied.policies.vla.backbones import ByteTokenizer

# policy setting -> (the checkpoint's config.json key, the default without a checkpoint)
FROM_CHECKPOINT = {
    "num_vlm_layers": ("num_vlm_layers", 16),
    "expert_width_multiplier": ("expert_width_multiplier", 0.75),
    "self_attn_every": ("self_attn_every_n_layers", 2),
    "max_state_dim": ("max_state_dim", 32),
    "max_action_dim": ("max_action_dim", 32),
    "horizon": ("chunk_size", 4),
    "denoise_steps": ("num_steps", 4),
    "max_instruction_tokens": ("tokenizer_max_length", 48),
}


@dataclass
class SmolVLAConfig(FlowPolicyConfig):
    name: str = "smolvla"
    pretrained: str = ""  # a local folder with lerobot's SmolVLA checkpoint (model.safetensors, config.json)
    vlm: str = "auto"  # tiny | a local SmolVLM folder (config.json, tokenizer) | auto: the checkpoint's, else tiny
    # 0: the checkpoint's config.json, else SmolVLA's defaults (16, 0.75, 2, 32, 32, 4, 4, 48)
    num_vlm_layers: int = 0
    expert_width_multiplier: float = 0.0
    self_attn_every: int = 0
    max_state_dim: int = 0
    max_action_dim: int = 0
    horizon: int = 0
    denoise_steps: int = 0
    max_instruction_tokens: int = 0
    image_size: int = 0  # 0: the checkpoint's resize_imgs_with_padding, else the vision encoder's
    train_expert_only: bool = False  # freeze the VLM (vision, connector, text layers), as lerobot trains it
    freeze_vision: bool = False
    detach_value_input: bool = True
    normalization: str = "checkpoint"  # checkpoint | dataset | running, as policy=pi0's
    sft_time: str = "beta"  # as SmolVLA was trained: Beta(1.5, 1) * 0.999 + 0.001
    features: str = ""  # which env camera feeds which of the checkpoint's image inputs, as policy=pi0's
    statistics_key: str = ""  # unused: lerobot checkpoints carry one set of statistics


def resolve(cfg: SmolVLAConfig) -> tuple[SmolVLAConfig, SmolVLMSize, dict]:
    """`cfg` with what the checkpoint fixes filled in, the VLM's sizes and the checkpoint's
    config.json; refused where they disagree or where the checkpoint uses what is not built."""
    saved = published_config(cfg.pretrained) if cfg.pretrained else {}
    if saved and saved.get("type", "smolvla") != "smolvla":
        raise ConfigError(f"{cfg.pretrained} holds a '{saved.get('type')}' policy; policy=smolvla loads smolvla ones")
    if saved.get("add_image_special_tokens"):
        raise ConfigError(f"{cfg.pretrained}: add_image_special_tokens is true, which policy=smolvla does not build")
    resolved = {}
    for name, (key, default) in FROM_CHECKPOINT.items():
        asked = getattr(cfg, name)
        if asked and key in saved and saved[key] != asked:
            raise ConfigError(f"{cfg.pretrained} was trained with {key}={saved[key]}; policy.{name} is {asked}")
        resolved[name] = asked or saved.get(key) or default
    if "cross" not in saved.get("attention_mode", "cross_attn"):
        resolved["self_attn_every"] = 1  # every layer joint
    expert_layers = saved.get("num_expert_layers", -1)
    if expert_layers > 0 and expert_layers != resolved["num_vlm_layers"]:
        raise ConfigError(
            f"{cfg.pretrained}: num_expert_layers={expert_layers} differs from num_vlm_layers="
            f"{resolved['num_vlm_layers']}; policy=smolvla builds an expert layer for every VLM layer"
        )
    vlm_source = cfg.vlm
    if vlm_source == "auto":
        named = saved.get("vlm_model_name", "")
        vlm_source = named if named and Path(named).is_dir() else "tiny"
        if saved and vlm_source == "tiny":
            raise ConfigError(
                f"{cfg.pretrained} is built on '{named}': give policy.vlm=<a local folder with that "
                f"model's config.json and tokenizer>"
            )
    vlm = TINY_SMOLVLM if vlm_source == "tiny" else read_smolvlm_size(vlm_source)
    if vlm_source == "tiny" and not cfg.num_vlm_layers and not saved:
        resolved["num_vlm_layers"] = vlm.text.depth
    saved_size = (saved.get("resize_imgs_with_padding") or [0])[0]
    resolved["image_size"] = cfg.image_size or saved_size or vlm.image_size
    if resolved["image_size"] != vlm.image_size:
        raise ConfigError(
            f"policy.image_size {resolved['image_size']} is not the vision encoder's {vlm.image_size}: "
            f"SmolVLA resizes every image to it"
        )
    return replace(cfg, vlm=vlm_source, **resolved), vlm, saved


class SmolVLMPrompt:
    """SmolVLM's tokenizer as lerobot's SmolVLA uses it: the prompt cut and right-padded to the length."""

    def __init__(self, path: str):
        from transformers import AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as error:
            raise ConfigError(f"policy.vlm '{path}': its tokenizer could not be loaded: {error}") from None

    def __call__(self, texts: list[str], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        coded = self.tokenizer(
            texts, max_length=length, truncation=True, padding="max_length", padding_side="right", return_tensors="pt"
        )
        return coded["input_ids"], coded["attention_mask"]


def prompts(instructions: list[str]) -> list[str]:
    """The instruction ending in a newline, as lerobot's SmolVLA processor writes it."""
    return [text if text.endswith("\n") else text + "\n" for text in instructions]


class SmolVLAPolicy(PretrainedFlowVLA):
    published_mode = "MEAN_STD"  # lerobot's SmolVLA normalises state and actions by mean and std

    def __init__(self, cfg: SmolVLAConfig, spec: EnvSpec):
        check_normalization(cfg)  # before the checkpoint is read
        cfg, vlm, saved = resolve(cfg)
        if spec.state_dim > cfg.max_state_dim or spec.action_dim > cfg.max_action_dim:
            raise ConfigError(
                f"the env's state ({spec.state_dim}) and actions ({spec.action_dim}) must fit "
                f"policy.max_state_dim={cfg.max_state_dim} and max_action_dim={cfg.max_action_dim}"
            )
        build = lambda: SmolVLAModel(  # noqa: E731
            vlm,
            cfg.num_vlm_layers,
            cfg.expert_width_multiplier,
            cfg.self_attn_every,
            cfg.max_state_dim,
            cfg.max_action_dim,
        )
        if cfg.pretrained:  # no random init of weights about to be replaced
            with torch.device("meta"):
                model = build()
            load_smolvla_checkpoint(model, cfg.pretrained)
        else:
            model = build()
        self.widths = (model.text_size.width, model.expert_size.width)  # for _build_heads
        super().__init__(cfg, spec, context_dim=self._context_width(model))
        self.model = model
        self.instructions = ByteTokenizer() if cfg.vlm == "tiny" else SmolVLMPrompt(cfg.vlm)
        self._use_normalization(cfg, spec, saved)
        if cfg.train_expert_only:
            for part in (model.vision, model.connector, model.embed_tokens, model.text_layers, model.text_norm):
                part.requires_grad_(False)
        if cfg.freeze_vision:
            model.vision.requires_grad_(False)

    @staticmethod
    def _context_width(model: SmolVLAModel) -> int:
        text = model.text_size
        return 1 + text.width + text.depth * 2 * text.num_kv_heads * text.head_dim

    def _action_width(self) -> int:
        return self.cfg.max_action_dim

    def _build_heads(self, context_dim: int) -> None:
        text_width, expert_width = self.widths
        self.noise_head = nn.Linear(expert_width, self.cfg.max_action_dim)
        nn.init.normal_(self.noise_head.weight, std=0.01)
        nn.init.zeros_(self.noise_head.bias)
        self.critic = mlp([text_width, *self.cfg.critic_hidden, 1], nn.Tanh, out_gain=1.0)

    # The context the flow reads, one tensor (B, L, C): per prefix token [valid, the VLM's
    # output, each layer's key and value].
    def _state(self, observation: Observation) -> torch.Tensor:
        device = self.low.device
        state = F.pad(self._normalized_state(observation), (0, self.cfg.max_state_dim - self.spec.state_dim))
        batch = state.shape[0]
        images = [resize_with_pad(observation.images[name].to(device), self.cfg.image_size) for name in self.cameras]
        present = [torch.ones(batch, dtype=torch.bool, device=device) for _ in images]
        instructions = observation.instruction or [""] * batch
        tokens, token_mask = self.instructions(prompts(instructions), self.cfg.max_instruction_tokens)
        embeddings, valid, starts = self.model.embed_prefix(
            images, present, tokens.to(device), token_mask.to(device), state
        )
        hidden, cache = self.model.encode_prefix(embeddings, valid, starts)
        keys_values = [part.transpose(1, 2).flatten(2) for pair in cache for part in pair]  # each (B, L, kv x d)
        return torch.cat([valid[..., None].to(hidden.dtype), hidden, *keys_values], -1)

    def _unpack(
        self, context: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        text = self.model.text_size
        valid = context[..., 0] > 0.5
        hidden = context[..., 1 : 1 + text.width]
        flat = context[..., 1 + text.width :].split(text.num_kv_heads * text.head_dim, -1)
        heads = [part.unflatten(-1, (text.num_kv_heads, text.head_dim)).transpose(1, 2) for part in flat]
        return valid, hidden, list(zip(heads[0::2], heads[1::2]))

    def _field(
        self, context: torch.Tensor, x: torch.Tensor, t: torch.Tensor, noise: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        valid, _, cache = self._unpack(context)
        chunk = x.view(len(x), self.cfg.horizon, self.action_width)
        velocity, tokens = self.model.velocity(chunk, t, valid, cache)
        return velocity.reshape(x.shape), self.noise_head(tokens).reshape(x.shape) if noise else None

    def _latent_width(self) -> int:
        return self.widths[0]

    def latent_input(self, context: torch.Tensor) -> torch.Tensor:
        """DSRL's latent actor reads the prefix pooled over its valid tokens (the state is one of them)."""
        valid, hidden, _ = self._unpack(context)
        return pooled(hidden, valid)

    def _value(self, context: torch.Tensor) -> torch.Tensor:
        valid, hidden, _ = self._unpack(context)
        features = pooled(hidden, valid)
        return self.critic(features.detach() if self.cfg.detach_value_input else features).squeeze(-1)


@POLICIES.register("smolvla", SmolVLAConfig)
def make_smolvla(cfg: SmolVLAConfig, spec: EnvSpec) -> SmolVLAPolicy:
    return SmolVLAPolicy(cfg, spec)
