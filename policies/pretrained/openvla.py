"""OpenVLA and OpenVLA-OFT (`policy=openvla`): the Prismatic VLM (`policies/pretrained/prismatic.py`: two
ViT towers, a projector, Llama-2) with OpenVLA's prompt and action tokens, driven by the token
VLA's decoding, log-probs, value head, LoRA and precision (`policies/vla/token_vla.py`), so GRPO and
PPO train it unchanged.

    [BOS, each camera's 256 patch tokens, (OFT: one proprio token), "In: What action should the
     robot take to {instruction}?\\nOut:", "▁"]  ->  action tokens

- `decoder=causal` (OpenVLA): one action token after another; the first is read at the last
  prompt position.
- `decoder=parallel` (OFT): the chunk's C x A positions get zero embeddings, an end-of-sequence
  token follows, and attention is bidirectional over the whole sequence (OFT trains with
  transformers patched to drop the causal mask; here a full mask is passed). Position i's
  action is read at the position before it, as OFT reads it.
- `action_head=l1` (OFT): a residual MLP over each action step's C hidden states (A x width)
  regresses the normalised action, in place of the tokens; for RL it is the mean of a Gaussian
  with a learned standard deviation per dimension (normalised units).

Its inputs and outputs go through the pipeline pi0 and SmolVLA use: the statistics of the
checkpoint (`policies/pretrained/statistics.py`: `dataset_statistics.json` or the config's
`norm_stats`, the dataset named by `statistics_key`) in the shared normalisers
(`policies/normalization.py`), and the cameras by `features` (`policies/pretrained/features.py`).
Actions come out normalised to [-1, 1] by the dataset's q01/q99 (dimensions whose `mask` is
false, such as the gripper, pass as they are) and are put back in the robot's units; OFT's
proprio goes in normalised the same way. A model with random weights (no `pretrained`) uses
the env's action bounds and this run's running state statistics instead."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from embodied.core.errors import ConfigError
from embodied.core.policy import Recomputed
from embodied.core.registry import POLICIES
from embodied.core.types import ActionChunk, EnvSpec, Observation
from embodied.policies.normalization import StatisticsNormalizer
from embodied.policies.pretrained.features import camera_inputs, parse_features
from embodied.policies.pretrained.oft_heads import ProprioProjector, ResidualMLP
from embodied.policies.pretrained.openvla_checkpoint import (
    Layout,
    image_normalization,
    installed_names,
    latest_file,
    mismatches,
    parameters_on_meta,
    random_config,
    read_config,
    read_shapes,
    read_tensors,
    read_torch_module,
    tensor_files,
)
from embodied.policies.pretrained.prismatic import ImagePixels, Projector, VisionBackbone, tower_spec
from embodied.policies.pretrained.statistics import OPENVLA_FILE, read_openvla_statistics
from embodied.policies.vla.action_tokens import ActionTokenizer
from embodied.policies.vla.backbones import left_padded
from embodied.policies.vla.token_vla import TokenPolicyConfig, TokenVLAPolicy, env_bounds

PROMPT = "In: What action should the robot take to {}?\nOut:"
ACTION_HEADS = ("tokens", "l1")
GRIPPERS = ("as_is", "openvla_libero")


@dataclass
class OpenVLAConfig(TokenPolicyConfig):
    RENAMED: ClassVar[dict[str, str]] = {"cameras": "features"}  # as pi0 and SmolVLA name it
    name: str = "openvla"
    # a local folder in the HF layout (openvla/openvla-7b, an OFT fine-tune, or `save_published`'s);
    # empty: random weights at `variant`'s architecture
    pretrained: str = ""
    variant: str = "tiny"  # without pretrained: tiny (test sizes) | 7b (the published architecture)
    statistics_key: str = ""  # whose statistics (OpenVLA's unnorm_key), where the checkpoint holds several
    # the env cameras read, in order, as policy=pi0's: empty (every env camera, by name), a preset
    # (libero_openvla: the third-person then the wrist camera) or <input>=<camera>,...
    features: str = ""
    center_crop: bool = False  # the central 90% of each frame's area (checkpoints trained with crops)
    decoder: str = "causal"  # causal (OpenVLA) | parallel (OFT: one bidirectional pass)
    action_head: str = "tokens"  # tokens | l1 (OFT's regression head; needs decoder=parallel)
    proprio: bool = False  # OFT: the state, normalised by the dataset's q01/q99, as one token
    action_std: float = 0.1  # action_head=l1: the Gaussian's initial std (normalised units)
    # as_is | openvla_libero: OpenVLA's LIBERO fine-tunes emit the last dimension in [0, 1]
    # (1 open); LIBERO takes -1 open, +1 closed: binarised and inverted, -sign(2g - 1), as
    # OpenVLA's LIBERO evaluation does
    gripper: str = "as_is"
    freeze_vision: bool = True  # the towers and the projector do not train
    lora_rank: int = 32
    precision: str = "bfloat16"
    max_instruction_tokens: int = 256  # the prompt's tokens (bytes without a tokenizer); longer is refused
    vocab_size: int = 640  # tiny only: bytes, BOS and "▁" at the start, 256 action ids at the end


class OpenVLAPrompt:
    """Instructions -> OpenVLA's prompt tokens (B, L), left-padded: BOS, the prompt, then "▁"
    (Llama's token 29871) where the prompt does not already end with it, as OpenVLA's
    `predict_action` appends it."""

    def __init__(self, encode, bos: int, space: int, pad: int):
        self.encode, self.bos, self.space, self.pad = encode, bos, space, pad

    @classmethod
    def from_folder(cls, folder: str) -> OpenVLAPrompt:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(folder)
        except (OSError, ValueError) as error:
            raise ConfigError(f"no Llama tokenizer in {folder}: {error}") from None
        space = tokenizer.convert_tokens_to_ids("▁")
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        return cls(
            lambda text: tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.bos_token_id, space, pad
        )

    @classmethod
    def bytes(cls) -> OpenVLAPrompt:
        """For random weights: UTF-8 bytes as ids 1..256, BOS 257, "▁" 258."""
        return cls(lambda text: [b + 1 for b in text.encode("utf-8")], 257, 258, 0)

    def rows(self, texts: list[str]) -> list[list[int]]:
        rows = []
        for text in texts:
            tokens = [self.bos, *self.encode(PROMPT.format(text.lower()))]
            rows.append(tokens if tokens[-1] == self.space else [*tokens, self.space])
        return rows

    def __call__(self, texts: list[str], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.rows(texts)
        longest = max(len(row) for row in rows)
        if longest > length:
            raise ConfigError(f"a prompt of {longest} tokens exceeds policy.max_instruction_tokens={length}")
        return left_padded(rows, longest, self.pad)  # to the batch's longest prompt, not `length`


class OpenVLAPolicy(TokenVLAPolicy):
    lora_targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    def __init__(self, cfg: OpenVLAConfig, spec: EnvSpec):
        if cfg.action_head not in ACTION_HEADS:
            raise ConfigError(f"policy.action_head must be one of {ACTION_HEADS}, got '{cfg.action_head}'")
        if cfg.gripper not in GRIPPERS:
            raise ConfigError(f"policy.gripper must be one of {GRIPPERS}, got '{cfg.gripper}'")
        if cfg.action_head == "l1" and cfg.decoder != "parallel":
            raise ConfigError("policy.action_head=l1 reads every action position at once: use policy.decoder=parallel")
        if not cfg.pretrained and cfg.variant not in ("tiny", "7b"):
            raise ConfigError(f"policy.variant must be tiny or 7b, got '{cfg.variant}'")
        self.folder = Path(cfg.pretrained) if cfg.pretrained else None
        if self.folder is not None and not self.folder.is_dir():
            raise ConfigError(f"policy.pretrained {cfg.pretrained} is not a folder")
        self.published = read_config(self.folder) if self.folder else random_config(cfg)
        self.statistics = (
            read_openvla_statistics(self.folder, cfg.statistics_key, self.published) if self.folder else None
        )
        super().__init__(cfg, spec)
        width = self.backbone.config.get_text_config().hidden_size
        self.proprio_projector = ProprioProjector(spec.state_dim, width) if cfg.proprio else None
        if cfg.proprio and self.statistics is not None:  # OFT's proprio statistics replace the running ones
            if self.statistics.state is None:
                raise ConfigError(f"policy.proprio=true: {self.statistics.action.source} has no proprio beside it")
            self.statistics.state.require_width(spec.state_dim)
            self.normalizer = StatisticsNormalizer(self.statistics.state, torch.float64)  # as OFT, in numpy
            self.register_load_state_dict_pre_hook(OpenVLAPolicy._fixed_proprio_statistics)
        if cfg.action_head == "l1":
            self.action_head = ResidualMLP(spec.action_dim * width, width, spec.action_dim)
            self.action_log_std = nn.Parameter(torch.full((spec.action_dim,), float(np.log(cfg.action_std))))
        else:
            self.action_head = None
        if self.folder is not None:
            self._load_oft_modules()
        if cfg.freeze_vision:
            self.vision.requires_grad_(False)
            self.projector.requires_grad_(False)
        # action_queries and state_embedding serve the token VLA's own decoders: not used here
        self.action_queries.requires_grad_(False)
        self.state_embedding.requires_grad_(False)

    # ---- building ---------------------------------------------------------------------------
    def _build_backbone(self) -> tuple[nn.Module, Any]:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg, config = self.cfg, self.published
        self.timm_ids = list(config.get("timm_model_ids", []))
        fused = bool(config.get("use_fused_vision_backbone", len(self.timm_ids) == 2))
        if fused != (len(self.timm_ids) == 2):
            raise ConfigError(f"use_fused_vision_backbone={fused} but timm_model_ids names {self.timm_ids}")
        text = LlamaConfig(**{k: v for k, v in config.get("text_config", {}).items() if k != "model_type"})
        text.tie_word_embeddings = False
        self.pad_to_multiple = int(config.get("pad_to_multiple_of", 0))
        build = parameters_on_meta() if self.folder else contextlib.nullcontext()
        with build:
            backbone = LlamaForCausalLM(text)
            self.vision = VisionBackbone(self.timm_ids)
            self.projector = Projector(self.vision.width, text.hidden_size, fused)
        self.layout = Layout(
            [
                (f"vision_backbone.{name}.", tower_spec(timm).family, tower_spec(timm).depth)
                for name, timm in zip(("featurizer", "fused_featurizer"), self.timm_ids)
            ],
            fused,
        )
        if self.folder is not None:
            self._load(backbone)
        normalization = [(tower_spec(t).mean, tower_spec(t).std) for t in self.timm_ids]
        if self.folder is not None:
            normalization = image_normalization(self.folder, self.timm_ids, normalization)
        self.pixels = ImagePixels([tower_spec(t) for t in self.timm_ids], cfg.center_crop, normalization)
        tokenizer = self._prompt_tokenizer()
        return backbone, tokenizer

    def _prompt_tokenizer(self) -> OpenVLAPrompt:
        """Llama's tokenizer from the checkpoint's folder; random weights (and models saved
        from them, whose config.json says `"prompt_tokenizer": "bytes"`) read bytes."""
        if self.published.get("prompt_tokenizer") == "bytes":
            return OpenVLAPrompt.bytes()
        if self.folder is not None and any(self.folder.glob("tokenizer*")):
            return OpenVLAPrompt.from_folder(str(self.folder))
        if self.folder is not None:
            raise ConfigError(
                f"policy.pretrained {self.folder} has no tokenizer files (tokenizer.model, tokenizer.json)"
            )
        return OpenVLAPrompt.bytes()

    def _load(self, backbone: nn.Module) -> None:
        """The published tensors become the modules' parameters (which are on the meta device)."""
        files = tensor_files(self.folder)
        found = read_shapes(files)
        problems = mismatches(self.published_shapes(backbone), found)
        if problems:
            raise ConfigError(
                f"{self.folder} does not fit the architecture its config.json names: " + "; ".join(problems)
            )
        ours = self.layout.from_published(read_tensors(files, torch.float32))
        parts = {"backbone.": backbone, "vision.": self.vision, "projector.": self.projector}
        for prefix, module in parts.items():
            mine = {name.removeprefix(prefix): t for name, t in ours.items() if name.startswith(prefix)}
            module.load_state_dict(installed_names(mine, list(module.state_dict())), strict=True, assign=True)

    def published_shapes(self, backbone: nn.Module | None = None) -> dict[str, tuple[int, ...]]:
        """Every tensor name and shape of this architecture in the published layout."""
        backbone = self.backbone if backbone is None else backbone
        ours = {  # with LoRA, the layers under their adapters
            f"backbone.{n.replace('.base_layer', '')}": t
            for n, t in _plain(backbone).state_dict().items()
            if ".lora_" not in n
        }
        ours.update({f"vision.{n}": t for n, t in self.vision.state_dict().items()})
        ours.update({f"projector.{n}": t for n, t in self.projector.state_dict().items()})
        meta = {  # shapes only; the layout reads the class token's position, which must be zero
            name: torch.zeros(t.shape) if "position_embeddings" in name else torch.empty(t.shape, device="meta")
            for name, t in ours.items()
        }
        return {name: tuple(t.shape) for name, t in self.layout.to_published(meta).items()}

    def _action_tokenizer(self) -> ActionTokenizer:
        text_vocab = self.backbone.config.get_text_config().vocab_size
        vocab = text_vocab - self.pad_to_multiple  # action ids end where the tokenizer's vocabulary ends
        if self.statistics is None:
            return ActionTokenizer(vocab, env_bounds(self.spec))
        self.statistics.action.require_width(self.spec.action_dim)
        return ActionTokenizer(vocab, self.statistics.action)

    def _load_oft_modules(self) -> None:
        """OFT's action head and proprio projector from their `.pt` files, where used."""
        for wanted, stem, module in (
            (self.action_head is not None, "action_head", self.action_head),
            (self.proprio_projector is not None, "proprio_projector", self.proprio_projector),
        ):
            if not wanted:
                continue
            file = latest_file(self.folder, stem)
            if file is None:
                raise ConfigError(f"{self.folder} has no {stem}--<step>_checkpoint.pt for policy.{stem}")
            expected = {n: tuple(t.shape) for n, t in module.state_dict().items()}
            if stem == "action_head":
                expected = {f"model.{n}": s for n, s in expected.items()}
            tensors = read_torch_module(file, expected)
            module.load_state_dict(
                {n.removeprefix("model.") if stem == "action_head" else n: t.float() for n, t in tensors.items()}
            )

    def _image_tokens(self) -> nn.Module | None:
        if not self.spec.image_shapes:
            raise ConfigError("policy=openvla reads camera images: use an env with cameras (e.g. env.obs_mode=rgb)")
        # OpenVLA's checkpoints record no input names: the mapping's order, else the env's
        self.cameras = camera_inputs(None, parse_features(self.cfg.features), self.spec)
        return None  # the prefix assembles patches itself (`_prefix`)

    def _prefix_is_instruction_only(self) -> bool:
        return False

    def pretrained_frozen(self) -> tuple[str, list[str]] | None:
        if self.folder is None:
            return None
        names = [n for n in self.frozen_parameter_names() if not n.startswith(("action_queries", "state_embedding"))]
        return (str(self.folder), names) if names else None

    def fsdp_units(self) -> list[nn.Module]:
        """Each runs through its own forward: the towers, the projector, the token embedding
        and every decoder layer of the LM (the embedding first: it lies inside the LM)."""
        return [
            self.vision.featurizer,
            *([self.vision.fused_featurizer] if self.vision.fused_featurizer else []),
            self.projector,
            _plain(self.backbone).model.embed_tokens,
            *_plain(self.backbone).model.layers,
        ]

    # ---- the prefix ---------------------------------------------------------------------------
    def _patches(self, observation: Observation) -> torch.Tensor:
        """Each camera's patch tokens side by side (B, patches x cameras, width), from one pass
        of the towers and the projector over every camera's frames."""
        pixels = torch.cat([self.pixels(observation.images[name]) for name in self.cameras])
        tokens = self.projector(self.vision(pixels))  # (cameras x B, patches, width)
        return torch.cat(tokens.chunk(len(self.cameras)), 1)

    def _prefix(self, observation: Observation) -> tuple[torch.Tensor, torch.Tensor]:
        """[pads, BOS, patches, (proprio), prompt] (B, L, width) and its mask: the patches go
        right after each row's BOS, so every row's content is contiguous at the end."""
        texts = observation.instruction or [""] * observation.state.shape[0]
        ids, mask = self.instructions(texts, self.cfg.max_instruction_tokens)
        device = self.action_queries.device
        ids, mask = ids.to(device), mask.to(device)
        inserted = self._patches(observation)
        if self.proprio_projector is not None:
            inserted = torch.cat([inserted, self.proprio_projector(self._proprio(observation))[:, None]], 1)
        tokens = self._token_embeddings()(ids)
        length, count = ids.shape[1], inserted.shape[1]
        bos = (length - mask.sum(1))[:, None]  # each row's BOS position
        target = torch.arange(length + count, device=device)[None]
        source = torch.where(
            target <= bos, target, torch.where(target <= bos + count, length + target - bos - 1, target - count)
        )
        combined = torch.cat([tokens, inserted.to(tokens.dtype)], 1)
        embeddings = combined.gather(1, source[..., None].expand(-1, -1, combined.shape[-1]))
        return embeddings, (target >= bos).long()

    def _proprio(self, observation: Observation) -> torch.Tensor:
        if isinstance(self.normalizer, StatisticsNormalizer):  # OFT clips its normalised proprio
            return self._state(observation).clamp(-1, 1)
        return self._state(observation)

    def update_normalization(self, observation: Observation) -> None:
        if not isinstance(self.normalizer, StatisticsNormalizer):  # a checkpoint's statistics stay as they are
            super().update_normalization(observation)

    def _fixed_proprio_statistics(self, state_dict: dict, prefix: str, *args: Any) -> None:  # a load pre-hook
        """A run saved before OFT's proprio statistics became the normaliser kept the running
        normaliser's buffers, which it never read (it normalised by the folder's q01/q99, as
        this policy does): they give way to the folder's statistics."""
        running = [f"{prefix}normalizer.{name}" for name in ("mean", "var", "count")]
        if all(key in state_dict for key in running) and f"{prefix}normalizer.offset" not in state_dict:
            for key in running:
                state_dict.pop(key)
            for name, buffer in self.normalizer.named_buffers():
                state_dict[f"{prefix}normalizer.{name}"] = buffer.clone()

    # ---- decoding -----------------------------------------------------------------------------
    def _parallel_pass(self, observation: Observation) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """OFT's one pass: [prefix, P zero embeddings, EOS] with bidirectional attention.
        Returns the action logits (B, P, 256), the hidden states read for the P positions
        (B, P, width) and the hidden state of the last prompt position (B, width)."""
        attention_kind = self.backbone.config.get_text_config()._attn_implementation
        if attention_kind != "sdpa":  # eager adds a mask, flash attention ignores a 4D one
            raise ConfigError(
                f"decoder=parallel passes a boolean attention mask: it needs sdpa attention, not {attention_kind}"
            )
        with self._autocast():
            prefix, mask = self._prefix(observation)
            batch, length, width = prefix.shape
            eos = self.backbone.config.get_text_config().eos_token_id
            eos = eos[0] if isinstance(eos, list) else (2 if eos is None else eos)
            tail = self._token_embeddings()(torch.full((batch, 1), eos, device=prefix.device))
            embeddings = torch.cat(
                [prefix.float(), prefix.new_zeros(batch, self.positions, width).float(), tail.float()], 1
            )
            full = torch.cat([mask, mask.new_ones(batch, self.positions + 1)], 1).bool()
            attention = full[:, None, None, :].expand(-1, 1, full.shape[1], -1)
            out = self.backbone(
                inputs_embeds=embeddings,
                attention_mask=attention,
                output_hidden_states=True,
                logits_to_keep=self.positions + 2,
            )
        hidden = out.hidden_states[-1][:, length - 1 : length - 1 + self.positions].float()
        return self._action_logits(out.logits[:, : self.positions]), hidden, hidden[:, 0]

    def _score(self, observation: Observation, bins: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cfg.decoder != "parallel":
            return super()._score(observation, bins)
        logits, _, last = self._parallel_pass(observation)
        return self._action_log_probs(logits), self._value(last, observation)

    def value(self, observation: Observation) -> torch.Tensor:
        if self.cfg.decoder != "parallel":
            return super().value(observation)
        return self._value(self._parallel_pass(observation)[2], observation)

    def _gaussian(self, observation: Observation) -> tuple[torch.distributions.Normal, torch.Tensor]:
        """action_head=l1: the Gaussian over normalised chunks (B, C, A) and the value."""
        _, hidden, last = self._parallel_pass(observation)
        steps = hidden.reshape(hidden.shape[0], self.chunk_size, -1)  # (B, C, A x width)
        mean = self.action_head(steps)
        return torch.distributions.Normal(mean, self.action_log_std.exp().expand_as(mean)), self._value(
            last, observation
        )

    def act(
        self, observation: Observation, deterministic: bool = False, generator: torch.Generator | None = None
    ) -> ActionChunk:
        if self.action_head is None:
            chunk = super().act(observation, deterministic, generator)
            chunk.actions = self._to_env(chunk.actions)
            return chunk
        distribution, value = self._gaussian(observation)
        if deterministic:
            sample = distribution.mean
        else:
            mean = distribution.mean
            noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=mean.device)
            sample = distribution.mean + distribution.stddev * noise
        log_prob = distribution.log_prob(sample).sum((-1, -2))
        normalized = sample.detach().clamp(-1, 1).cpu().numpy()
        actions = torch.as_tensor(self.actions.unnormalize(normalized), dtype=torch.float32)
        return ActionChunk(
            actions=self._to_env(actions).to(value.device),
            log_prob=log_prob,
            value=value,
            record={"normalized_actions": sample.detach()},
        )

    def _to_env(self, actions: torch.Tensor) -> torch.Tensor:
        """Actions in the dataset's units -> what the env executes: the gripper convention,
        then the env's bounds."""
        if self.cfg.gripper == "openvla_libero":
            actions = torch.cat([actions[..., :-1], -torch.sign(2 * actions[..., -1:] - 1)], -1)
        low = torch.tensor(self.spec.action_low, dtype=actions.dtype, device=actions.device)
        high = torch.tensor(self.spec.action_high, dtype=actions.dtype, device=actions.device)
        return torch.maximum(torch.minimum(actions, high), low)  # as the env executes it

    def recompute(self, observation: Observation, chunk: ActionChunk) -> Recomputed:
        if self.action_head is None:
            return super().recompute(observation, chunk)
        distribution, value = self._gaussian(observation)
        sample = chunk.record["normalized_actions"].to(distribution.mean.device)
        return Recomputed(
            log_prob=distribution.log_prob(sample).sum((-1, -2)),
            entropy=distribution.entropy().sum((-1, -2)),
            value=value,
        )

    def bc_loss(self, observation: Observation, actions: torch.Tensor) -> torch.Tensor:
        if self.action_head is None:
            return super().bc_loss(observation, actions)
        # OFT's L1 loss on the normalised chunk
        target = self.actions.normalize(actions.reshape(actions.shape[0], self.chunk_size, -1).cpu().numpy())
        distribution, _ = self._gaussian(observation)
        return (
            (distribution.mean - torch.as_tensor(target, dtype=torch.float32, device=distribution.mean.device))
            .abs()
            .mean()
        )

    # ---- the published layout ---------------------------------------------------------------------
    def published_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's tensors under the published names (LoRA adapters merged in)."""
        backbone = _plain(self.backbone)
        if backbone is not self.backbone:  # peft: fold the adapters into a copy of the weights
            import copy

            backbone = copy.deepcopy(self.backbone).merge_and_unload()
        ours = {f"backbone.{n}": t for n, t in backbone.state_dict().items()}
        ours.update({f"vision.{n}": t for n, t in self.vision.state_dict().items()})
        ours.update({f"projector.{n}": t for n, t in self.projector.state_dict().items()})
        return self.layout.to_published(ours)

    def save_published(self, folder: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
        """Write this model in the published layout, so that `policy.pretrained=<folder>` loads
        it back: config.json, model.safetensors, dataset_statistics.json (the statistics it
        acts with, under their key; a random model's are the env's bounds, under `env_bounds`),
        the OFT heads in use, and the tokenizer and image processor files of the folder it came
        from. Written to a temporary name, then moved."""
        import json
        import shutil

        from safetensors.torch import save_file

        folder = Path(folder)
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        tensors = {n: t.detach().to("cpu", dtype).contiguous() for n, t in self.published_state_dict().items()}
        save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
        config = {k: v for k, v in self.published.items() if k != "norm_stats"}
        (partial / "config.json").write_text(json.dumps(config, indent=2))
        if self.statistics is not None:
            key, entry = self.statistics.key, self.statistics.published
        else:
            bounds = {"q01": list(self.spec.action_low), "q99": list(self.spec.action_high)}
            key, entry = "env_bounds", {"action": {**bounds, "mask": [True] * self.spec.action_dim}}
        (partial / OPENVLA_FILE).write_text(json.dumps({key: entry}, indent=2))
        for stem, module, prefix in (
            ("action_head", self.action_head, "module.model."),
            ("proprio_projector", self.proprio_projector, "module."),
        ):
            if module is not None:  # OFT's names: saved from a DDP-wrapped module
                weights = {prefix + n: t.detach().cpu() for n, t in module.state_dict().items()}
                torch.save(weights, partial / f"{stem}--0_checkpoint.pt")
        if self.folder is not None:
            for source in [*self.folder.glob("tokenizer*"), self.folder / "preprocessor_config.json"]:
                if source.is_file():
                    shutil.copy2(source, partial / source.name)
        if folder.exists():
            shutil.rmtree(folder)
        partial.rename(folder)
        return folder


def _plain(backbone: nn.Module) -> nn.Module:
    """The Llama under a peft wrapper (the module itself without one)."""
    return backbone.get_base_model() if hasattr(backbone, "get_base_model") else backbone


@POLICIES.register("openvla", OpenVLAConfig)
def make_openvla(cfg: OpenVLAConfig, spec: EnvSpec) -> OpenVLAPolicy:
    return OpenVLAPolicy(cfg, spec)
