"""`embodied <verb> [key=value ...]`: Hydra overrides after the verb.

    embodied train                                  the default run (configs/train.yaml)
    embodied train env=maniskill_pickcube algo.lr=1e-4
    embodied train experiment=mujoco_hopper         a packaged experiment (configs/experiment/)
    embodied train resume=runs/train-20260101-120000
    embodied train init=runs/sft-20260101-120000 algo=ppo ...   RL from an SFT run's weights
    embodied eval checkpoint=runs/train-20260101-120000 episodes=50 env=maniskill_pushcube
    embodied eval policy=pi05 policy.pretrained=/models/pi05_libero suite=[libero_spatial,libero_spatial_swap]
    embodied demos env=maniskill_pickcube episodes=50 dataset=data/pickcube   scripted-expert demos
    embodied sft dataset=data/pickcube env=maniskill_pickcube env.control_mode=pd_ee_delta_pos policy=flow
    embodied reward dataset=data/pickcube-rgb       a success classifier on images (reward.classifier=<run>)
    embodied serve checkpoint=runs/train-20260101-120000        a policy server for robots
    embodied robot robot=sim robot.env_from=runs/train-20260101-120000 episodes=5
    embodied teleop robot=sim teleop=keyboard       an operator drives the robot, no policy
    embodied collect robot=sim teleop=keyboard record.dataset=data/demos episodes=20   ... and records
    embodied keys keys/                             CURVE keypairs for non-loopback endpoints
    embodied plot runs/a runs/b output=curves.png   learning curves of runs, as a PNG
    embodied info                                   versions, devices and virtualenvs, for a bug report

`robot`, `teleop` and `collect` need no torch: a robot PC installs only the client (see the README).
"""

from __future__ import annotations

import sys
from typing import Sequence

from embodied.core.errors import EmbodiedError

VERBS = ("train", "eval", "serve", "robot", "teleop", "collect", "keys", "demos", "sft", "reward", "plot", "info")


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's preemption, `kill`, a container stop), handled as Ctrl-C is: every
    cleanup that Ctrl-C runs (env workers closed, their sockets removed) runs for it too."""


def stop_on_signals() -> None:
    """SIGTERM raises `Terminated`; Ctrl-C (SIGINT) raises KeyboardInterrupt even where the
    command started with SIGINT ignored (a background job of a script, a test runner's worker),
    which Python would otherwise leave ignored: `kill -INT` then did nothing, and a script that
    stops a run that way waited for its own timeout while the run went on."""
    import signal

    def terminate(signum: int, frame: object) -> None:
        raise Terminated

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def train(overrides: list[str]) -> int:
    import logging

    from embodied.config import EvalConfig, TrainConfig, to_schema
    from embodied.core.compose import compose
    from embodied.core.registry import RUNTIMES
    from embodied.evaluate import evaluate_checkpoint
    from embodied.train import resume_config

    # The framework's own progress messages (connections, offline pretraining); libraries' warnings only.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("embodied").setLevel(logging.INFO)
    resume = next((o.split("=", 1)[1] for o in overrides if o.startswith("resume=")), None)
    config = resume_config(resume, overrides) if resume else to_schema(TrainConfig, compose("train", overrides))
    runtime = RUNTIMES.get(config.runtime.name).factory(config.runtime)
    session = runtime.train(config)
    run_dir = session.run_dir
    print(f"\nrun directory:  {run_dir}")
    print(f"tensorboard:    tensorboard --logdir {run_dir / 'tensorboard'}")
    print(f"checkpoint:     {session.checkpoint_path or '(none)'}")
    if config.eval_episodes > 0:
        output = evaluate_checkpoint(
            EvalConfig(
                checkpoint=str(run_dir),
                episodes=config.eval_episodes,
                video_episodes=config.eval_video_episodes,
                progress_bar=config.logger.progress_bar,
            )
        )
        print(f"eval report:    {output / 'report.md'}")
        print((output / "report.md").read_text())
    return 0


def demos(overrides: list[str]) -> int:
    import logging

    from embodied.config import to_schema
    from embodied.core.compose import compose
    from embodied.demos import DemosConfig, generate_demos

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = to_schema(DemosConfig, compose("demos", overrides))
    result = generate_demos(config)
    print(
        f"dataset:  {config.dataset} ({result.episodes} episodes, {result.added} added; "
        f"expert success {result.successes}/{result.attempts})"
    )
    return 0


def sft(overrides: list[str]) -> int:
    import logging

    from embodied.config import EvalConfig
    from embodied.evaluate import evaluate_checkpoint
    from embodied.sft import run_sft, sft_config

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("embodied").setLevel(logging.INFO)
    resume = next((o.split("=", 1)[1] for o in overrides if o.startswith("resume=")), None)
    config = sft_config(overrides, resume)
    run_dir = run_sft(config)
    print(f"\nrun directory:  {run_dir}")
    print(f"next:           embodied train init={run_dir} env=... policy=... (the same env and policy)")
    if config.eval_episodes > 0:
        output = evaluate_checkpoint(
            EvalConfig(checkpoint=str(run_dir), episodes=config.eval_episodes, progress_bar=config.logger.progress_bar)
        )
        print(f"eval report:    {output / 'report.md'}")
        print((output / "report.md").read_text())
    return 0


def reward(overrides: list[str]) -> int:
    from embodied.config import to_schema
    from embodied.core.compose import compose
    from embodied.reward_classifier import RewardClassifierConfig, train_reward_classifier

    run_dir, metrics = train_reward_classifier(to_schema(RewardClassifierConfig, compose("reward", overrides)))
    print(f"run directory:  {run_dir}")
    print(
        "held out:       "
        + (
            ", ".join(f"{k.removeprefix('val_')} {v:.3f}" for k, v in metrics.items() if k.startswith("val_"))
            or "nothing (val_fraction=0)"
        )
    )
    print(f"use it:         embodied train ... reward.classifier={run_dir}")
    return 0


def evaluate(overrides: list[str]) -> int:
    from embodied.config import EvalConfig, to_schema
    from embodied.core.compose import compose
    from embodied.evaluate import evaluate_checkpoint

    config = to_schema(EvalConfig, compose("eval", overrides))
    output = evaluate_checkpoint(config)
    print(f"eval report: {output / 'report.md'}")
    print((output / "report.md").read_text())
    return 0


def serve(overrides: list[str]) -> int:
    import logging

    from embodied.config import to_schema
    from embodied.core.compose import compose
    from embodied.serve import ServeConfig, serve_checkpoint

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve_checkpoint(to_schema(ServeConfig, compose("serve", overrides)))
    return 0


def robot(overrides: list[str], mode: str = "robot") -> int:
    from embodied.robot_cli import run

    return run(overrides, mode)


def plot(arguments: list[str]) -> int:
    from pathlib import Path

    from embodied.plots import plot_runs

    outputs = [a.split("=", 1)[1] for a in arguments if a.startswith("output=")]
    run_dirs = [Path(a) for a in arguments if not a.startswith("output=")]
    default = run_dirs[0] / "curves.png" if len(run_dirs) == 1 else Path("curves.png")
    print(f"curves: {plot_runs(run_dirs, Path(outputs[-1]) if outputs else default)}")
    return 0


def info(arguments: list[str]) -> int:
    from embodied.info import report

    print(report())
    return 0


def keys(arguments: list[str]) -> int:
    from embodied.core.security import describe, generate_keys

    if len(arguments) != 1:
        print("usage: embodied keys <directory>", file=sys.stderr)
        return 2
    print(describe(generate_keys(arguments[0])))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0
    verb, overrides = args[0], args[1:]
    if verb not in VERBS:
        from embodied.core.registry import unknown_name_message

        print(f"error: {unknown_name_message('command', verb, list(VERBS))}", file=sys.stderr)
        return 2
    try:
        if verb in ("robot", "teleop", "collect"):
            return robot(overrides, verb)  # the robot client stops on SIGTERM with its own safe ending
        stop_on_signals()
        return {
            "train": train,
            "eval": evaluate,
            "serve": serve,
            "keys": keys,
            "demos": demos,
            "sft": sft,
            "reward": reward,
            "plot": plot,
            "info": info,
        }[verb](overrides)
    except EmbodiedError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        hint = "; resume from the last checkpoint with resume=<run dir>" if verb in ("train", "sft") else ""
        terminated = isinstance(stop, Terminated)
        print(f"\n{'terminated' if terminated else 'interrupted'}{hint}", file=sys.stderr)
        return 143 if terminated else 130  # 128 + the signal's number, as a shell reports it


if __name__ == "__main__":
    sys.exit(main())
