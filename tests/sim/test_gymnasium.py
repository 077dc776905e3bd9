import numpy as np
import pytest

from embodied.core.errors import ConfigError
from embodied.sim.gymnasium_env import GymnasiumConfig, make_gymnasium


def test_mujoco_task_steps_in_chunks_with_auto_reset():
    env = make_gymnasium(GymnasiumConfig(task="InvertedPendulum-v4", num_envs=2), seed=0)
    try:
        observation = env.reset()
        assert observation.state.shape == (2, 4) and env.spec.action_dim == 1
        ended = []
        for _ in range(20):
            result = env.step(np.full((2, 5, 1), 3.0, np.float32))  # push hard: the pole falls
            ended += result.episodes
            assert (result.executed_action <= 3.0).all()
            assert result.terminated[result.done].all()
        assert ended and all(e.length < 1000 for e in ended)
    finally:
        env.close()


def test_unknown_gymnasium_task_is_a_config_error():
    with pytest.raises(ConfigError, match="Did you mean 'Hopper-v4'"):
        make_gymnasium(GymnasiumConfig(task="Hoper-v4"), seed=0)


class GonePipe:
    """The worker's end of a pipe whose parent was killed mid-step: the next read is reset,
    and any reply fails."""

    def __init__(self):
        self.replies = 0

    def send_bytes(self, data: bytes) -> None:
        if self.replies:  # the first reply (the worker is ready) got through
            raise BrokenPipeError(32, "Broken pipe")
        self.replies += 1

    def recv_bytes(self) -> bytes:
        raise ConnectionResetError(104, "Connection reset by peer")


def test_an_env_worker_whose_parent_is_gone_exits_quietly(capfd):
    from functools import partial

    from embodied.sim.gymnasium_env import GymnasiumEnv
    from embodied.sim.vector import _worker_main

    make_env = partial(GymnasiumEnv, GymnasiumConfig(task="InvertedPendulum-v4"))
    _worker_main(GonePipe(), make_env, [0], 0, 0)  # returns: no exception, no traceback
    assert "Traceback" not in capfd.readouterr().err
