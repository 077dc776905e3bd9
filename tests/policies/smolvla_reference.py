"""The reference side of the SmolVLA parity test; runs under the reference virtualenv
(.venv-pi0ref: lerobot 0.4.4 and transformers 4.57).

    python smolvla_reference.py <work folder>

Reads `spec.json` and `inputs.npz` there, builds lerobot's SmolVLAPolicy on a SmolVLM of the
sizes the spec gives with every weight drawn at random, saves it with lerobot's own
`save_pretrained` (`checkpoint/`) and writes the action chunk its `sample_actions` makes from
the given images, tokens, state and noise (`reference.npz`, with the seconds each of
`timed_runs` calls took and the process's peak memory). Where the spec gives `processors`, it
also saves lerobot's own pre/post-processor pipelines in each mode and what the whole pipeline
makes of the raw state (pi0_reference.save_processors).

lerobot builds SmolVLM from a hub id: its config and processor. Here the config is a local
folder written from the spec (`smolvlm/`), and the processor, of which SmolVLA reads only two
special token ids (for image separators it does not use by default), is a stand-in."""

from __future__ import annotations

import json
import math
import resource
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch
from pi0_reference import import_torchvision, save_processors  # beside this file, on the script's path


def smolvlm_folder(work: Path, spec: dict) -> Path:
    from transformers import SmolVLMConfig

    vision, text = spec["vision"], spec["text"]
    config = SmolVLMConfig(
        vision_config={
            "hidden_size": vision["width"],
            "intermediate_size": vision["mlp_dim"],
            "num_hidden_layers": vision["depth"],
            "num_attention_heads": vision["num_heads"],
            "patch_size": vision["patch_size"],
            "image_size": spec["image_size"],
        },
        text_config={
            "model_type": "llama",
            "hidden_size": text["width"],
            "intermediate_size": text["mlp_dim"],
            "num_hidden_layers": text["depth"],
            "num_attention_heads": text["num_heads"],
            "num_key_value_heads": text["num_kv_heads"],
            "head_dim": text["head_dim"],
            "rms_norm_eps": text["rms_eps"],
            "vocab_size": spec["vocab_size"],
        },
        scale_factor=spec["scale_factor"],
    )
    folder = work / "smolvlm"
    config.save_pretrained(folder)
    return folder


def stand_in_processor() -> None:
    from lerobot.policies.smolvla import smolvlm_with_expert

    tokenizer = types.SimpleNamespace(fake_image_token_id=1, global_image_token_id=2)
    smolvlm_with_expert.AutoProcessor = types.SimpleNamespace(
        from_pretrained=lambda *args, **kwargs: types.SimpleNamespace(tokenizer=tokenizer)
    )


def main(work: Path) -> None:
    spec = json.loads((work / "spec.json").read_text())
    import_torchvision()
    stand_in_processor()
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    size = spec["image_size"]
    cameras = [f"observation.images.{name}" for name in spec["cameras"]]
    config = SmolVLAConfig(
        vlm_model_name=str(smolvlm_folder(work, spec)),
        load_vlm_weights=False,
        num_vlm_layers=spec["num_vlm_layers"],
        num_expert_layers=spec["num_expert_layers"],
        self_attn_every_n_layers=spec["self_attn_every_n_layers"],
        expert_width_multiplier=spec["expert_width_multiplier"],
        chunk_size=spec["horizon"],
        n_action_steps=spec["horizon"],
        max_state_dim=spec["max_state_dim"],
        max_action_dim=spec["max_action_dim"],
        num_steps=spec["steps"],
        resize_imgs_with_padding=(size, size),
        tokenizer_max_length=spec["tokens"],
        device="cpu",
        input_features={
            "observation.state": PolicyFeature(type=FeatureType.STATE, shape=(spec["state_dim"],)),
            **{name: PolicyFeature(type=FeatureType.VISUAL, shape=(3, size, size)) for name in cameras},
        },
        output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(spec["action_dim"],))},
    )
    policy = SmolVLAPolicy(config).eval()
    generator = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():  # every weight random and of a size that matters, norms included
        for parameter in policy.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) / math.sqrt(max(parameter.shape[-1], 1)))
    policy.save_pretrained(work / "checkpoint")

    inputs = np.load(work / "inputs.npz")
    batch = {
        name: torch.from_numpy(inputs[f"frame{i}"]).permute(0, 3, 1, 2).float() / 255.0
        for i, name in enumerate(cameras)
    }
    images, masks = policy.prepare_images(batch)
    seconds = []
    for _ in range(max(1, spec.get("timed_runs", 1))):
        started = time.perf_counter()
        with torch.no_grad():
            actions = policy.model.sample_actions(
                images,
                masks,
                torch.from_numpy(inputs["tokens"]),
                torch.from_numpy(inputs["token_mask"]),
                torch.from_numpy(inputs["state"]),
                noise=torch.from_numpy(inputs["noise"]),
            )
        seconds.append(time.perf_counter() - started)
    peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # before a second copy below
    load_s = 0.0
    if spec.get("timed_runs", 1) > 1:  # the benchmark: lerobot's own load of the files it wrote
        started = time.perf_counter()
        SmolVLAPolicy.from_pretrained(str(work / "checkpoint"))
        load_s = time.perf_counter() - started
    np.savez(
        work / "reference.npz",
        actions=actions.numpy(),
        seconds=np.array(seconds),
        load_s=load_s,
        peak_bytes=peak_bytes,
        parameters=sum(p.numel() for p in policy.model.parameters()),
    )
    if "processors" in spec:

        def sample(state: torch.Tensor, mode: str) -> torch.Tensor:  # the same prompt in every mode
            with torch.no_grad():
                return policy.model.sample_actions(
                    images,
                    masks,
                    torch.from_numpy(inputs["pipeline_tokens"]),
                    torch.from_numpy(inputs["pipeline_token_mask"]),
                    state,
                    noise=torch.from_numpy(inputs["pipeline_noise"]),
                )

        save_processors(work, spec, inputs, sample)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
