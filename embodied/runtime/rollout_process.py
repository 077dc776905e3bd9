"""The rollout role as its own process under `runtime=procs`: builds the env side (its
worker processes included) and the policy, acts with the newest weights the learner
published, and sends numbered trajectories to the learner.

    python -m embodied.runtime.rollout_process --config <run dir>/config.yaml \\
        --trajectory-endpoint tcp://127.0.0.1:5555 --weights-endpoint tcp://127.0.0.1:5556

The learner starts it. It outlives a learner that crashes, reconnects to the learner resumed
from a checkpoint, and exits when the learner says training is over or when no learner
answers within `runtime.reconnect_timeout_s`."""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import logging
import signal
import sys
import time
from pathlib import Path

from embodied.build import build_env, build_policy, resolve_device
from embodied.config import TrainConfig, to_schema
from embodied.core.compose import load_yaml
from embodied.core.errors import EmbodiedError
from embodied.runtime.classified_reward import with_reward
from embodied.runtime.operator import build_operator
from embodied.runtime.process import start_process
from embodied.runtime.rollout import Rollout, env_share
from embodied.runtime.rollout_link import RolloutLink
from embodied.runtime.wire import load_published_weights, tensors_from_wire, trajectory_to_wire, weights_limits

logger = logging.getLogger("embodied.rollout")

# The learner sends this before it kills a rollout that will not exit, to learn where it hangs.
STACK_DUMP_SIGNAL = signal.SIGUSR2


def dump_stacks_on_signal() -> None:
    """Write every thread's stack to the rollout's log on STACK_DUMP_SIGNAL."""
    files = [h.stream for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    faulthandler.register(STACK_DUMP_SIGNAL, file=files[0] if files else sys.stderr, all_threads=True)


def run(
    link: RolloutLink, rollout: Rollout, rollout_steps: int, max_policy_lag: int, group_size: int = 0, seed: int = 0
) -> None:
    """Collect and send batches until the learner closes the link. A batch is collected only
    when at most `max_policy_lag` sent batches are unused and the held weights are at most
    `max_policy_lag` versions behind the learner: with 0, every batch is on-policy."""

    def ready() -> bool:
        weights = link.current_weights()
        fresh = weights is not None and weights.policy_version >= link.learner_version - max_policy_lag
        return fresh and link.in_flight() <= max_policy_lag

    held: tuple[str, int] | None = None
    rollout.start()
    while True:
        link.wait(ready, "weights from the learner")
        if link.closed:
            logger.info("the learner finished training; exiting")
            return
        weights = link.current_weights()
        rollout.offloader.reload()  # collocated: the learner is done with the device until this batch arrives
        if (weights.learner_id, weights.policy_version) != held:
            started = time.perf_counter()
            load_published_weights(rollout.policy, tensors_from_wire(weights.tensors))
            if held is None:  # once: at a VLA's published size, loading takes a while
                logger.info("weights loaded in %.1f s", time.perf_counter() - started)
            held = (weights.learner_id, weights.policy_version)
            rollout.policy_version = weights.policy_version
            link.held = held
        if group_size:  # GRPO-style algorithms: grouped starts, one round per batch
            rollout.start_groups(group_size, link.last_sent, seed)
        started = time.perf_counter()
        batch, episodes, env_steps = rollout.collect(rollout_steps)
        if link.last_sent == 0:  # once: how long a batch takes to collect
            logger.info("first batch: %d env steps in %.1f s", env_steps, time.perf_counter() - started)
        rollout.offloader.offload()  # collocated: the learner gets the device before it gets the batch
        link.send_trajectory(
            {
                "trajectory": trajectory_to_wire(batch),
                "episodes": [vars(e) for e in episodes],
                "env_steps": env_steps,
                "env_restarts": rollout.env_restarts,
                "resent": link.resent,
                "reconnects": link.reconnects,
                "offload_s": rollout.offloader.seconds,
            }
        )


def rollout_name(index: int) -> str:
    """Rollout `index`'s name towards the learner, which keeps its delivery marks under it."""
    return f"rollout-{index}"


def serve_rollout(config_path: Path, trajectory_endpoint: str, weights_endpoint: str, index: int = 0) -> int:
    """Rollout `index` (of `runtime.num_rollouts`, each with its share of the envs) until the
    learner finishes: in its own process (`runtime=procs`) or in a Ray actor (`runtime=ray`).
    Returns the exit status."""
    dump_stacks_on_signal()
    config = to_schema(TrainConfig, load_yaml(config_path))
    runtime = config.runtime
    start_process(config.seed, runtime.torch_threads)
    group_size = getattr(config.algo, "group_size", 0)
    env_ids, workers = env_share(
        config.env.num_envs, getattr(config.env, "num_workers", 0), runtime.num_rollouts, index, group_size
    )
    env_cfg = dataclasses.replace(config.env, num_workers=workers) if workers else config.env
    env = with_reward(build_env(env_cfg, seed=config.seed, env_ids=env_ids), config.reward)
    name = rollout_name(index)
    try:
        device = resolve_device(runtime.rollout_device)
        policy = build_policy(config.policy, env.spec, device)
        # `run` keeps a rollout left over from another run from feeding this run's learner.
        hello = {
            "sender": name,
            "run": str(config_path.resolve().parent),
            "policy": config.policy.name,
            "chunk_size": config.policy.chunk_size,
            "spec": env.spec.to_dict(),
        }
        link = RolloutLink(
            trajectory_endpoint,
            weights_endpoint,
            hello,
            keys_dir=runtime.keys_dir,
            heartbeat_s=runtime.heartbeat_s,
            timeout_s=runtime.peer_timeout_s,
            reconnect_timeout_s=runtime.reconnect_timeout_s,
            weights_limits=weights_limits(policy),
        )
        try:
            rollout = Rollout(
                env,
                policy,
                device,
                pipeline=runtime.pipeline,
                pipeline_stages=runtime.pipeline_stages,
                seed=config.seed,
                operator=build_operator(config, env),
                index=index,
                offload=runtime.placement == "collocated",
            )
            run(link, rollout, config.algo.rollout_steps, runtime.max_policy_lag, group_size, config.seed)
        finally:
            link.close()
    except EmbodiedError as error:
        logger.error("%s", error)
        return 2
    finally:
        env.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the run's resolved config.yaml")
    parser.add_argument("--trajectory-endpoint", required=True)
    parser.add_argument("--weights-endpoint", required=True)
    parser.add_argument("--index", type=int, default=0, help="which of runtime.num_rollouts this is")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    return serve_rollout(Path(args.config), args.trajectory_endpoint, args.weights_endpoint, args.index)


if __name__ == "__main__":
    sys.exit(main())
