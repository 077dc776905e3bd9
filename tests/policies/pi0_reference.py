"""The reference side of the pi0 / pi0.5 parity tests; runs under the reference virtualenv
(.venv-pi0ref: lerobot 0.4.4 and transformers 4.57, made by tools/setup.sh test).

    python pi0_reference.py <work folder>

Reads `spec.json` and `inputs.npz` there, builds lerobot's PI0Policy or PI05Policy at the
sizes the spec gives (or, with `"sizes": "real"`, lerobot's own: PaliGemma 2B and the 300M
expert) with every weight drawn at random, saves it with lerobot's own `save_pretrained`
(`checkpoint/`), and writes the action chunk its `sample_actions` makes from the given noise
(`reference.npz`), with the seconds each of `timed_runs` calls took and the process's peak
memory. Where the spec gives `processors` (feature shapes, statistics, one norm_map per
folder), it also saves lerobot's own pre/post-processor pipelines with those statistics (the
first into the checkpoint, as lerobot's training does; each into `processors/<name>/`) and
writes what they make of `raw_state` and of `actions` (`processors/<name>/reference.npz`).

lerobot's pi0 runs on its fork of transformers, which is not on PyPI. On the released 4.57 it
needs these changes, each what the fork (and openpi's model) does:
  1. the fork's version check module;
  2. PaliGemma's image features are not divided by sqrt(width);
  3. Gemma does not multiply its input embeddings by sqrt(width) (pi0 scales the
     instruction's embeddings itself);
  4. a denoising step attends to the prefix's cached keys and values without appending its
     own to them (the released cache always appends);
  5. (pi0.5) the adaptive RMSNorm of the action expert: (scale, shift, gate) = dense(cond),
     rms(x) (1 + scale) + shift, residual branches multiplied by the gate. This one is written
     here from the fork's equations, so for pi0.5 the test checks everything lerobot's model
     does around its norms (time MLP, suffix, masks, positions, sampling, checkpoint layout),
     and the norm itself only against that writing.
The sizes come in through lerobot's own hooks: its Gemma variant table, and the PaliGemma
config it builds (vision tower width and depth)."""

from __future__ import annotations

import copy
import json
import math
import resource
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch


def import_torchvision() -> None:
    """The registry's torchvision needs its two operator schemas on a CPU torch."""
    try:
        import torchvision  # noqa: F401
    except RuntimeError:
        library = torch.library.Library("torchvision", "DEF")
        library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        library.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
        import_torchvision.library = library
        import torchvision  # noqa: F401


def adapt_transformers() -> None:
    check = types.ModuleType("transformers.models.siglip.check")
    check.check_whether_transformers_replace_is_installed_correctly = lambda: True
    sys.modules[check.__name__] = check

    from transformers.models.gemma.modeling_gemma import GemmaModel
    from transformers.models.paligemma.modeling_paligemma import PaliGemmaModel

    def image_features(self, pixel_values):
        return self.multi_modal_projector(self.vision_tower(pixel_values).last_hidden_state)

    PaliGemmaModel.get_image_features = image_features

    gemma_forward = GemmaModel.forward

    def unscaled_forward(self, *args, inputs_embeds=None, **kwargs):
        normalizer = torch.tensor(self.config.hidden_size**0.5, dtype=inputs_embeds.dtype)
        return gemma_forward(self, *args, inputs_embeds=inputs_embeds / normalizer, **kwargs)

    GemmaModel.forward = unscaled_forward
    add_adaptive_norms()


class ConditionedNorm(torch.nn.Module):
    """The fork's adaptive RMSNorm; the stock Gemma code calls it with the tensor alone, so
    the condition is set on it before each call and its gate read after."""

    def __init__(self, width: int, eps: float, cond_dim: int):
        super().__init__()
        self.eps, self.cond, self.gate = eps, None, None
        self.dense = torch.nn.Linear(cond_dim, 3 * width)

    def forward(self, x):
        scale, shift, self.gate = self.dense(self.cond)[:, None].chunk(3, -1)
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1 + scale.float()) + shift.float()).to(x.dtype)


def add_adaptive_norms() -> None:
    from transformers.models.gemma.modeling_gemma import GemmaDecoderLayer, GemmaModel

    def adaptive(config) -> bool:
        return bool(getattr(config, "use_adarms", False))

    layer_init, layer_forward = GemmaDecoderLayer.__init__, GemmaDecoderLayer.forward

    def init_layer(self, config, layer_idx):
        layer_init(self, config, layer_idx)
        if adaptive(config):
            self.input_layernorm = ConditionedNorm(config.hidden_size, config.rms_norm_eps, config.adarms_cond_dim)
            self.post_attention_layernorm = ConditionedNorm(
                config.hidden_size, config.rms_norm_eps, config.adarms_cond_dim
            )

    def forward_layer(self, hidden_states, **kwargs):
        condition = kwargs.pop("adarms_cond", None)
        if not isinstance(self.input_layernorm, ConditionedNorm):
            return layer_forward(self, hidden_states, **kwargs)
        self.input_layernorm.cond = self.post_attention_layernorm.cond = condition
        attended, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
        hidden_states = hidden_states + attended * self.input_layernorm.gate
        branch = self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states + branch * self.post_attention_layernorm.gate

    GemmaDecoderLayer.__init__, GemmaDecoderLayer.forward = init_layer, forward_layer

    model_init, model_forward = GemmaModel.__init__, GemmaModel.forward

    def init_model(self, config):
        model_init(self, config)
        if adaptive(config):
            self.norm = ConditionedNorm(config.hidden_size, config.rms_norm_eps, config.adarms_cond_dim)

    def forward_model(self, *args, **kwargs):
        if isinstance(self.norm, ConditionedNorm):
            self.norm.cond = kwargs.get("adarms_cond")
        return model_forward(self, *args, **kwargs)

    GemmaModel.__init__, GemmaModel.forward = init_model, forward_model


def adapt_model_classes(spec: dict) -> None:
    import importlib

    modeling_pi0 = importlib.import_module(f"lerobot.policies.{spec['model']}.modeling_{spec['model']}")
    core = modeling_pi0.PI0Pytorch if spec["model"] == "pi0" else modeling_pi0.PI05Pytorch
    denoise_step = core.denoise_step

    def step_on_prefix(self, *args, past_key_values, **kwargs):
        return denoise_step(self, *args, past_key_values=copy.deepcopy(past_key_values), **kwargs)

    core.denoise_step = step_on_prefix
    if spec.get("sizes") != "real":
        set_sizes(modeling_pi0, spec)


def set_sizes(modeling_pi0: types.ModuleType, spec: dict) -> None:
    sizes = {"gemma_2b": spec["vlm"], "gemma_300m": spec["expert"]}
    modeling_pi0.get_gemma_config = lambda variant: modeling_pi0.GemmaConfig(
        width=sizes[variant]["width"],
        depth=sizes[variant]["depth"],
        mlp_dim=sizes[variant]["mlp_dim"],
        num_heads=sizes[variant]["num_heads"],
        num_kv_heads=sizes[variant]["num_kv_heads"],
        head_dim=sizes[variant]["head_dim"],
    )

    paligemma_class = modeling_pi0.PaliGemmaForConditionalGeneration

    def sized_paligemma(config):
        vision = spec["vision"]
        config.vision_config.hidden_size = vision["width"]
        config.vision_config.num_hidden_layers = vision["depth"]
        config.vision_config.intermediate_size = vision["mlp_dim"]
        config.vision_config.num_attention_heads = vision["num_heads"]
        config.vision_config.patch_size = vision["patch_size"]
        config.vision_config.projection_dim = config.text_config.hidden_size
        config.text_config.vocab_size = spec["vocab_size"]
        config._vocab_size = spec["vocab_size"]
        return paligemma_class(config=config)

    modeling_pi0.PaliGemmaForConditionalGeneration = sized_paligemma


def main(work: Path) -> None:
    spec = json.loads((work / "spec.json").read_text())
    import_torchvision()
    adapt_transformers()
    adapt_model_classes(spec)
    from lerobot.configs.types import FeatureType, PolicyFeature

    if spec["model"] == "pi0":
        from lerobot.policies.pi0.configuration_pi0 import PI0Config as Config
        from lerobot.policies.pi0.modeling_pi0 import PI0Policy as Policy
    else:
        from lerobot.policies.pi05.configuration_pi05 import PI05Config as Config
        from lerobot.policies.pi05.modeling_pi05 import PI05Policy as Policy

    size = spec["image_size"]
    cameras = [f"observation.images.{name}" for name in spec["cameras"]]
    widths = spec.get("processors", {})  # the env's widths where they are known, as lerobot's training records them
    state_dim, action_dim = (
        widths.get("state_dim", spec["max_state_dim"]),
        widths.get("action_dim", spec["max_action_dim"]),
    )
    config = Config(
        chunk_size=spec["horizon"],
        n_action_steps=spec["horizon"],
        max_state_dim=spec["max_state_dim"],
        max_action_dim=spec["max_action_dim"],
        num_inference_steps=spec["steps"],
        image_resolution=(size, size),
        device="cpu",
        tokenizer_max_length=spec.get("tokenizer_max_length", spec["tokens"]),
        input_features={
            "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(state_dim,)),
            **{name: PolicyFeature(type=FeatureType.VISUAL, shape=(3, size, size)) for name in cameras},
        },
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(action_dim,))},
    )
    policy = Policy(config).eval()
    generator = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():  # every weight random and of a size that matters, norms included
        for parameter in policy.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) / math.sqrt(max(parameter.shape[-1], 1)))
    policy.save_pretrained(work / "checkpoint")

    inputs = np.load(work / "inputs.npz")
    if "processors" in spec:
        save_processors(work, spec, inputs, pipeline_sampler(policy, spec, inputs))
    images = [torch.from_numpy(inputs[f"image{i}"]) for i in range(len(cameras))]
    image_masks = [torch.from_numpy(inputs[f"image_mask{i}"]) for i in range(len(cameras))]
    state = [torch.from_numpy(inputs["state"])] if spec["model"] == "pi0" else []  # pi0.5's is in the prompt
    seconds = []
    for _ in range(max(1, spec.get("timed_runs", 1))):
        started = time.perf_counter()
        with torch.no_grad():
            actions = policy.model.sample_actions(
                images,
                image_masks,
                torch.from_numpy(inputs["tokens"]),
                torch.from_numpy(inputs["token_mask"]),
                *state,
                noise=torch.from_numpy(inputs["noise"]),
            )
        seconds.append(time.perf_counter() - started)
    peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    np.savez(
        work / "reference.npz",
        actions=actions.numpy(),
        seconds=np.array(seconds),
        peak_bytes=peak_bytes,
        parameters=sum(p.numel() for p in policy.model.parameters()),
    )


def pipeline_sampler(policy, spec: dict, inputs: np.lib.npyio.NpzFile):
    """state (B, max_state_dim), normalised -> the chunk lerobot's policy samples from the raw
    camera frames (`frame<i>`, uint8 (B, H, W, 3), through lerobot's own image preprocessing),
    the prompt tokens and the noise of the pipeline inputs."""
    batch = {
        f"observation.images.{name}": torch.from_numpy(inputs[f"frame{i}"]).permute(0, 3, 1, 2).float() / 255.0
        for i, name in enumerate(spec["cameras"])
    }
    images, masks = policy._preprocess_images(batch)

    def sample(state: torch.Tensor, mode: str) -> torch.Tensor:
        # pi0.5's state is in its prompt, written for each mode's normalisation
        suffix = f"_{mode}" if f"pipeline_tokens_{mode}" in inputs else ""
        tokens = torch.from_numpy(inputs[f"pipeline_tokens{suffix}"])
        token_mask = torch.from_numpy(inputs[f"pipeline_token_mask{suffix}"])
        with torch.no_grad():
            extra = [state] if spec["model"] == "pi0" else []
            return policy.model.sample_actions(
                images, masks, tokens, token_mask, *extra, noise=torch.from_numpy(inputs["pipeline_noise"])
            )

    return sample


def save_processors(work: Path, spec: dict, inputs: np.lib.npyio.NpzFile, sample) -> None:
    """lerobot's normaliser and unnormaliser steps, in pipelines shaped as its policies save
    them, for each norm_map of the spec; the first also beside the checkpoint's weights. Each
    folder's reference.npz has what they make of a raw state and of actions, and the whole
    pipeline's env actions: raw state -> preprocessor -> the model's chunk (`sample(state, mode)`) ->
    the env's action dimensions -> postprocessor."""
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
    from lerobot.processor import (
        AddBatchDimensionProcessorStep,
        DeviceProcessorStep,
        NormalizerProcessorStep,
        PolicyProcessorPipeline,
        RenameObservationsProcessorStep,
        UnnormalizerProcessorStep,
    )
    from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action

    processors = spec["processors"]
    inputs_features = {"observation.state": PolicyFeature(FeatureType.STATE, (processors["state_dim"],))}
    output_features = {"action": PolicyFeature(FeatureType.ACTION, (processors["action_dim"],))}
    for index, (name, mapping) in enumerate(processors["norm_maps"].items()):
        norm_map = {FeatureType(kind): NormalizationMode(mode) for kind, mode in mapping.items()}
        stats = {
            feature: {stat: np.asarray(value, dtype=np.float32) for stat, value in values.items()}
            for feature, values in processors["stats"][name].items()
        }
        pre = PolicyProcessorPipeline(
            steps=[
                RenameObservationsProcessorStep(rename_map={}),
                AddBatchDimensionProcessorStep(),
                DeviceProcessorStep(device="cpu"),
                NormalizerProcessorStep(
                    features={**inputs_features, **output_features}, norm_map=norm_map, stats=stats
                ),
            ],
            name="policy_preprocessor",
        )
        post = PolicyProcessorPipeline(
            steps=[
                UnnormalizerProcessorStep(features=output_features, norm_map=norm_map, stats=stats),
                DeviceProcessorStep(device="cpu"),
            ],
            name="policy_postprocessor",
            to_transition=policy_action_to_transition,
            to_output=transition_to_policy_action,
        )
        folder = work / "processors" / name
        for target in [folder, work / "checkpoint"] if index == 0 else [folder]:
            pre.save_pretrained(target)
            post.save_pretrained(target)
        with torch.no_grad():
            state = pre({"observation.state": torch.from_numpy(inputs["raw_state"])})["observation.state"]
            actions = post(torch.from_numpy(inputs["raw_actions"]))
            padded = torch.nn.functional.pad(state, (0, spec["max_state_dim"] - state.shape[-1]))
            pipeline = post(sample(padded, name)[..., : processors["action_dim"]])
        np.savez(
            folder / "reference.npz", state=state.numpy(), actions=actions.numpy(), pipeline_actions=pipeline.numpy()
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
