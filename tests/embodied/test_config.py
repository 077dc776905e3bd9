"""Config errors surface at the entry point, naming the key and the accepted values."""

import pytest

from embodied.cli import main
from embodied.config import TrainConfig, to_schema
from embodied.core.compose import compose
from embodied.core.errors import ConfigError, UnknownNameError
from embodied.core.registry import Registry
from embodied.policies.gaussian.mlp import MLPPolicyConfig
from embodied.sim.maniskill_common import ManiSkillConfig


def load(*overrides):
    return to_schema(TrainConfig, compose("train", list(overrides)))


def test_default_config_maps_onto_typed_schemas():
    config = load()
    assert isinstance(config.env, ManiSkillConfig) and config.env.task == "PushCube-v1"
    assert isinstance(config.policy, MLPPolicyConfig)
    assert config.algo.name == "ppo" and config.runtime.name == "local"


@pytest.mark.parametrize("algo", ["sac_rlpd", "dsrl"])
def test_off_policy_algorithms_take_the_runs_seed(algo):
    """Their critics, replay samplers and target subsets are seeded from algo.seed: three seeds
    of a run must not share them."""
    assert load(f"algo={algo}", "seed=7").algo.seed == 7
    assert load(f"algo={algo}", "seed=8").algo.seed == 8


def test_experiment_overrides_groups_and_values():
    config = load("experiment=mujoco_hopper")
    assert config.env.task == "Hopper-v4" and config.algo.rollout_steps == 2048
    assert config.policy.actor_hidden == [64, 64] and config.total_env_steps == 1_000_000


def test_token_vla_ppo_experiment_composes_the_multitask_recipe():
    config = load("experiment=multitask_token_vla_ppo", "init=runs/sft")
    assert config.env.tasks == ["PushCube-v1", "PickCube-v1", "StackCube-v1"] and config.env.reward_mode == "sparse"
    assert config.policy.name == "token_vla" and config.policy.critic_hidden == [256, 256]
    assert config.policy.value_reads_state and config.algo.name == "ppo" and config.algo.ratio == "term"
    assert (config.algo.rollout_steps, config.algo.update_epochs, config.algo.gamma) == (50, 1, 0.99)
    assert config.time_limit_s == 3600


def test_the_simplevla_rl_experiment_composes_its_grpo_recipe_on_openvla_oft():
    config = load("experiment=simplevla_rl_libero", "policy.pretrained=/models/oft")
    assert config.env.suite == "libero_10" and config.env.num_envs % config.algo.group_size == 0
    assert (config.policy.name, config.policy.decoder, config.policy.chunk_size) == ("openvla", "parallel", 8)
    assert config.policy.temperature == 1.6 and config.policy.statistics_key == "libero_10"
    assert config.policy.features == "full_image=agentview"
    assert config.policy.gripper == "openvla_libero"
    assert (config.algo.group_size, config.algo.clip_low, config.algo.clip_high) == (8, 0.2, 0.28)
    assert config.algo.outcome == "success" and config.algo.success_band == [0.1, 0.9]
    assert config.algo.rollout_steps * config.policy.chunk_size >= 520  # whole LIBERO-10 episodes
    tasks = [config.env.task_ids[i % len(config.env.task_ids)] for i in range(config.env.num_envs)]
    groups = [tasks[i : i + 8] for i in range(0, len(tasks), 8)]
    assert all(len(set(group)) == 1 for group in groups) and {g[0] for g in groups} == set(range(10))


def test_unknown_env_name_lists_known_ones_and_the_closest():
    with pytest.raises(
        UnknownNameError,
        match=r"unknown env 'maniskil'; known: genesis, gymnasium, libero, maniskill, robosuite\. "
        r"Did you mean 'maniskill'",
    ):
        load("env.name=maniskil")


def test_unknown_env_config_file_lists_available_options():
    with pytest.raises(ConfigError, match="maniskill_pushcube"):
        load("env=maniskill_pushcub")


def test_wrong_type_names_the_full_key():
    with pytest.raises(ConfigError, match=r"'algo\.lr'.*"):
        load("algo.lr=fast")


def test_unknown_key_names_the_full_key():
    with pytest.raises(ConfigError, match=r"'algo\.learning_rate'"):
        load("+algo.learning_rate=0.1")


def test_cli_prints_config_errors_without_traceback(capsys):
    assert main(["train", "algo.update_epochs=many"]) == 2
    err = capsys.readouterr().err
    assert "algo.update_epochs" in err and "Traceback" not in err


def test_unknown_verb_suggests_the_closest():
    assert main(["trian"]) == 2


def test_registry_rejects_duplicates_and_unknown_names():
    registry = Registry("widget")
    registry.register("round", dict)(lambda: None)
    with pytest.raises(ValueError):
        registry.register("round", dict)(lambda: None)
    with pytest.raises(UnknownNameError, match="Did you mean 'round'"):
        registry.get("rund")


def test_gpu_env_config_extends_the_cpu_one():
    config = load("env=maniskill_pushcube_gpu")
    assert config.env.backend == "gpu" and config.env.num_envs == 1024 and config.env.task == "PushCube-v1"


def test_procs_runtime_shares_the_config_and_checks_its_values():
    from embodied.core.registry import RUNTIMES
    from embodied.runtime.configs import ProcsRuntimeConfig

    make_procs_runtime = RUNTIMES.get("procs").factory

    config = load("runtime=procs", "runtime.max_policy_lag=2")
    assert isinstance(config.runtime, ProcsRuntimeConfig) and config.runtime.max_policy_lag == 2
    assert config.env == load().env and config.algo == load().algo
    with pytest.raises(ConfigError, match="runtime.max_policy_lag must be >= 0"):
        make_procs_runtime(load("runtime=procs", "runtime.max_policy_lag=-1").runtime)
    with pytest.raises(ConfigError, match="peer_timeout_s"):
        make_procs_runtime(load("runtime=procs", "runtime.peer_timeout_s=1", "runtime.heartbeat_s=1").runtime)


# ---- one source of defaults: the schemas -------------------------------------------------------


def schema_defaults(schema) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(schema))


def restated(section: dict, defaults: dict, where: str, skip=()) -> list[str]:
    """The keys of a YAML section whose value is its schema's default (nested sections too)."""
    found = []
    for key, value in section.items():
        if key in ("defaults", "name", *skip) or key not in defaults:
            continue
        if isinstance(value, dict) and isinstance(defaults[key], dict):
            found += restated(value, defaults[key], f"{where}{key}.")
        elif value == defaults[key]:
            found.append(f"{where}{key}: {value!r}")
    return found


def test_no_yaml_file_restates_a_default_of_its_schema():
    """The dataclasses hold every default; a YAML file says only what differs, so the two
    cannot drift apart. Every key can still be set on the command line."""
    from omegaconf import OmegaConf

    import embodied.robots.components  # noqa: F401  (the robot registry)
    from embodied.config import GROUPS, EvalConfig, SFTConfig
    from embodied.core.compose import CONFIG_DIR
    from embodied.core.registry import ROBOTS
    from embodied.demos import DemosConfig
    from embodied.reward_classifier import RewardClassifierConfig
    from embodied.robots.client import RobotClientConfig
    from embodied.robots.teleop import TeleopConfig
    from embodied.runtime.policy_server import ServeConfig

    registries = {**GROUPS, "robot": ROBOTS}
    found = []
    for path in sorted(CONFIG_DIR.glob("*/*.yaml")):
        group = path.parent.name
        if group == "experiment":  # named runs: every value in them is the point
            continue
        section = OmegaConf.to_container(OmegaConf.load(path))
        name = section.get("name") or compose("train", [f"{group}={path.stem}"])[group].name
        schema = TeleopConfig if group == "teleop" else registries[group].get(name).schema
        found += restated(section, schema_defaults(schema), f"{group}/{path.name}: ")
    tops = {
        "train": (TrainConfig, GROUPS),
        "sft": (SFTConfig, GROUPS),
        "eval": (EvalConfig, GROUPS),
        "serve": (ServeConfig, ()),
        "demos": (DemosConfig, ("env",)),
        "reward": (RewardClassifierConfig, ()),
        "robot": (RobotClientConfig, ("robot", "teleop")),
    }
    for name, (schema, groups) in tops.items():
        section = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / f"{name}.yaml"))
        found += restated(section, schema_defaults(schema), f"{name}.yaml: ", skip=tuple(groups))
    assert not found, "restated defaults (drop them from the YAML):\n" + "\n".join(found)


def test_a_key_no_yaml_file_names_is_still_set_from_the_command_line():
    config = load("algo.clip_coef=0.3", "policy.init_log_std=-1.0", "operator.patience=7", "total_env_steps=99")
    assert (config.algo.clip_coef, config.policy.init_log_std) == (0.3, -1.0)
    assert (config.operator.patience, config.total_env_steps) == (7, 99)
    with pytest.raises(ConfigError, match=r"'algo\.clip_coeff'"):  # a typo is still refused, by the schema
        load("algo.clip_coeff=0.3")


def test_old_names_are_refused_with_the_new_ones():
    with pytest.raises(ConfigError, match="'policy=flow_vlm' was renamed: pass policy=vlm_expert"):
        load("policy=flow_vlm")
    with pytest.raises(ConfigError, match=r"'policy\.checkpoint' was renamed: pass policy\.pretrained=/models/pi0"):
        load("policy=pi0", "policy.checkpoint=/models/pi0")
    saved = compose("train", [])
    saved.policy.name = "flow_vlm"  # a run saved under the old name
    with pytest.raises(ConfigError, match="'policy=flow_vlm' was renamed 'policy=vlm_expert'"):
        to_schema(TrainConfig, saved)


def test_a_misspelled_key_or_option_names_the_closest_known_one():
    with pytest.raises(ConfigError, match=r"'algo\.gama': Key 'gama' not in 'PPOConfig' \(did you mean 'gamma'\?\)"):
        load("algo.gama=0.9")
    with pytest.raises(ConfigError, match=r"'policy\.actor_hiden'.*\(did you mean 'actor_hidden'\?\)"):
        load("policy.actor_hiden=[64]")
    with pytest.raises(ConfigError, match=r"'logger\.progres_bar'.*\(did you mean 'progress_bar'\?\)"):
        load("logger.progres_bar=false")
    # a key given at the top that lives one level down
    with pytest.raises(ConfigError, match=r"'progress_bar'.*\(did you mean 'logger\.progress_bar'\?\)"):
        load("progress_bar=false")
    with pytest.raises(ConfigError, match=r"'algo\.zzzz'.*\(its keys: name, rollout_steps, lr,"):
        load("algo.zzzz=1")  # nothing close: the section's keys
    with pytest.raises(ConfigError) as refused:
        load("algo=sac_rlp")
    assert str(refused.value) == (
        "'algo=sac_rlp': no such algo (did you mean 'sac_rlpd'?); the options are dsrl, grpo, ppo, ppo_maniskill, "
        "sac_rlpd"
    )
    with pytest.raises(ConfigError, match=r"'env=maniskil_pickcube': no such env \(did you mean 'maniskill_pickcube'"):
        load("env=maniskil_pickcube")
    with pytest.raises(ConfigError, match=r"'runtime=zzz': no such runtime; the options are local, "):
        load("runtime=zzz")


def test_a_pi0_run_saved_before_checkpoint_statistics_reloads_with_its_running_ones(tmp_path):
    """Runs from a pretrained pi0 written before `policy.normalization` existed kept running
    statistics; their saved config says so on reload, while a new run's says what it chose."""
    from omegaconf import OmegaConf

    from embodied.config import checkpoint_config, to_yaml

    config = load("policy=pi05", "policy.pretrained=/models/pi05_libero")
    assert config.policy.normalization == "checkpoint"
    saved = OmegaConf.create(to_yaml(config))
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(saved))
    assert checkpoint_config(tmp_path).policy.normalization == "checkpoint"
    del saved.policy["normalization"]
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(saved))
    assert checkpoint_config(tmp_path).policy.normalization == "running"


def test_pretrained_models_name_their_statistics_and_cameras_alike(tmp_path):
    """pi0's `asset_id` and OpenVLA's `unnorm_key` are one `policy.statistics_key`, OpenVLA's
    camera list is `policy.features` as pi0's and SmolVLA's: the old names are refused with the
    new, and an OpenVLA run saved with them reloads in today's names."""
    from omegaconf import OmegaConf

    from embodied.config import checkpoint_config, to_yaml

    with pytest.raises(ConfigError, match=r"'policy\.asset_id' was renamed: pass policy\.statistics_key=droid"):
        load("policy=pi05", "policy.asset_id=droid")
    with pytest.raises(ConfigError, match=r"'policy\.unnorm_key' was renamed: pass policy\.statistics_key=libero_10"):
        load("policy=openvla", "policy.unnorm_key=libero_10")
    with pytest.raises(ConfigError, match=r"'policy\.cameras'.*\('cameras' was renamed 'features' here\)"):
        load("policy=openvla", "policy.cameras=[agentview]")
    assert load("policy=squashed_gaussian", "policy.cameras=[base_camera]").policy.cameras == ["base_camera"]
    saved = OmegaConf.create(to_yaml(load("experiment=simplevla_rl_libero", "policy.pretrained=/models/oft")))
    for old, new in (("unnorm_key", "statistics_key"), ("cameras", "features")):
        saved.policy[old] = saved.policy.pop(new)
    saved.policy.cameras = ["agentview", "wrist"]
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(saved))
    policy = checkpoint_config(tmp_path).policy
    assert (policy.statistics_key, policy.features) == ("libero_10", "agentview=agentview,wrist=wrist")


def test_one_operator_block_replaces_intervention_and_the_oracles_own_keys(tmp_path):
    """Training's `intervention.*` and `teleop=oracle`'s five keys are one `operator:` block now:
    the old keys are refused with the new ones, and a run saved with `intervention:` reloads
    with its settings under `operator:`."""
    from omegaconf import OmegaConf

    from embodied.config import checkpoint_config, to_yaml

    with pytest.raises(ConfigError, match=r"'intervention\.expert' was renamed: pass operator\.policy=scripted"):
        load("intervention.expert=scripted")
    with pytest.raises(ConfigError, match=r"'teleop\.patience' was renamed: pass teleop\.operator\.patience=2"):
        compose("robot", ["teleop=oracle", "teleop.patience=2"])
    assert compose("robot", ["teleop=oracle", "teleop.operator.patience=2"]).teleop.operator.patience == 2

    saved = OmegaConf.create(to_yaml(load("algo=sac_rlpd", "operator.policy=scripted", "operator.max_takeover=5")))
    saved.intervention = {**saved.pop("operator"), "expert": "scripted"}
    for key in ("policy", "trigger", "progress"):  # as a run written before the operator block has it
        del saved.intervention[key]
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(saved))
    operator = checkpoint_config(tmp_path).operator
    assert (operator.policy, operator.max_takeover, operator.patience) == ("scripted", 5, 3)


def test_a_dataset_folder_is_dataset_everywhere(tmp_path):
    """`embodied sft dataset=`, `embodied demos dataset=`, the robot's `record.dataset=` and
    RLPD's `algo.dataset=`: the old `root=`, `record.root=` and `algo.demos=` are refused with the
    new names, and a run saved with `algo.demos` reloads with it as `algo.dataset`."""
    from omegaconf import OmegaConf

    from embodied.config import checkpoint_config, to_yaml
    from embodied.demos import DemosConfig

    with pytest.raises(ConfigError, match=r"'root' was renamed: pass dataset=data/demos"):
        compose("demos", ["root=data/demos"])
    with pytest.raises(ConfigError, match=r"'record\.root' was renamed: pass record\.dataset=data/demos"):
        compose("robot", ["record.root=data/demos"])
    assert to_schema(DemosConfig, compose("demos", ["dataset=data/demos"])).dataset == "data/demos"
    assert compose("robot", ["record.dataset=data/demos"]).record.dataset == "data/demos"
    with pytest.raises(ConfigError, match=r"Key 'root' not in 'TrainConfig'"):  # demos' old key, not train's
        load("root=data/demos")
    with pytest.raises(ConfigError, match=r"'algo\.demos' was renamed: pass algo\.dataset=data/demos"):
        load("algo=sac_rlpd", "algo.demos=data/demos")
    assert load("algo=sac_rlpd", "algo.dataset=data/demos").algo.dataset == "data/demos"

    saved = OmegaConf.create(to_yaml(load("algo=sac_rlpd", "algo.dataset=data/demos")))
    saved.algo.demos = saved.algo.pop("dataset")  # as a run written before algo.dataset has it
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(saved))
    assert checkpoint_config(tmp_path).algo.dataset == "data/demos"


def test_device_settings_are_under_runtime_for_every_verb(tmp_path):
    """`runtime.device` and `runtime.torch_threads` mean the same to train, serve and sft; the
    old top-level keys of serve and sft are refused with the new ones, and an SFT run saved with
    a top-level `device` (and `steps`, now `iterations`) reloads with them in their new places."""
    from omegaconf import OmegaConf

    from embodied.config import SFTConfig, checkpoint_config, to_yaml
    from embodied.runtime.policy_server import ServeConfig

    assert load("runtime.device=cpu").runtime.device == "cpu"
    serve = to_schema(ServeConfig, compose("serve", ["runtime.device=cpu", "runtime.torch_threads=2"]))
    assert (serve.runtime.device, serve.runtime.torch_threads) == ("cpu", 2)
    assert to_schema(SFTConfig, compose("sft", ["runtime.device=cpu"])).runtime.device == "cpu"
    with pytest.raises(ConfigError, match=r"'device' was renamed: pass runtime\.device=cpu"):
        compose("serve", ["device=cpu"])
    with pytest.raises(ConfigError, match=r"'torch_threads' was renamed: pass runtime\.torch_threads=2"):
        compose("serve", ["torch_threads=2"])
    with pytest.raises(ConfigError, match=r"'device' was renamed: pass runtime\.device=cuda"):
        compose("sft", ["device=cuda"])
    for verb in ("sft", "reward"):  # gradient steps are iterations, the unit of every `*_every`
        with pytest.raises(ConfigError, match=r"'steps' was renamed: pass iterations=300"):
            compose(verb, ["steps=300"])

    saved = OmegaConf.create(to_yaml(to_schema(SFTConfig, compose("sft", ["dataset=data/demos"]))))
    saved.device = saved.pop("runtime").device  # as an SFT run written before runtime.device has it
    saved.device = "cpu"
    saved.steps = saved.pop("iterations")
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(saved))
    loaded = checkpoint_config(tmp_path)
    assert isinstance(loaded, SFTConfig) and loaded.runtime.device == "cpu" and loaded.iterations == 2000
