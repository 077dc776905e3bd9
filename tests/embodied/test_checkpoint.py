import subprocess
import sys

import numpy as np
import pytest
import torch

from embodied.core.errors import CheckpointError
from embodied.runs.checkpoint import flatten, load_checkpoint, resolve_checkpoint, save_checkpoint, unflatten


def test_nested_state_round_trips_through_tensors_and_json():
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.randn(3))])
    optimizer.param_groups[0]["params"][0].grad = torch.ones(3)
    optimizer.step()
    state = {
        "optimizer": optimizer.state_dict(),
        "rng": torch.get_rng_state(),
        "seeds": np.arange(4),
        "pair": (1, "a"),
        "none": None,
        3: [np.zeros((0, 8), np.float32)],
    }
    tensors = {}
    skeleton = flatten(state, tensors)
    restored = unflatten(skeleton, tensors)
    assert restored["pair"] == (1, "a") and restored[3][0].shape == (0, 8)
    np.testing.assert_array_equal(restored["seeds"], state["seeds"])
    fresh = torch.optim.Adam([torch.nn.Parameter(torch.randn(3))])
    fresh.load_state_dict(restored["optimizer"])
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])


def test_save_is_atomic_keeps_the_newest_and_points_latest(tmp_path):
    weights = {"w": torch.arange(4.0)}
    for iteration in range(1, 5):
        save_checkpoint(tmp_path / "checkpoints", f"iter_{iteration:06d}", weights, {"i": iteration}, "a: 1\n", keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["iter_000003", "iter_000004", "latest"]
    loaded, state = load_checkpoint(resolve_checkpoint(tmp_path))
    assert state == {"i": 4} and torch.equal(loaded["w"], weights["w"])


def test_a_checkpoint_missing_a_file_is_reported_as_incomplete(tmp_path):
    path = save_checkpoint(tmp_path / "checkpoints", "iter_000001", {"w": torch.zeros(1)}, {}, "")
    (path / "state.safetensors").unlink()
    with pytest.raises(CheckpointError, match="incomplete: missing state.safetensors"):
        load_checkpoint(resolve_checkpoint(tmp_path))


def test_a_latest_pointer_to_a_missing_checkpoint_is_reported(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("iter_000009")
    with pytest.raises(CheckpointError, match="names iter_000009, which is missing"):
        resolve_checkpoint(tmp_path)


def test_pruning_orders_by_iteration_and_never_removes_the_new_checkpoint(tmp_path):
    directory = tmp_path / "checkpoints"
    save_checkpoint(directory, "iter_1000000", {"w": torch.zeros(1)}, {}, "", keep=5)
    newest = save_checkpoint(directory, "iter_999999", {"w": torch.ones(1)}, {}, "", keep=1)
    assert newest.is_dir() and (directory / "latest").read_text() == "iter_999999"


def test_tied_weights_are_saved_and_the_tie_comes_back(tmp_path):
    embedding = torch.nn.Embedding(6, 4)
    head = torch.nn.Linear(4, 6, bias=False)
    head.weight = embedding.weight  # tied, as PaliGemma ties its output layer to its embeddings
    model = torch.nn.ModuleDict({"embed": embedding, "head": head})
    path = save_checkpoint(tmp_path, "iter_000001", model.state_dict(), {}, "")
    weights, _ = load_checkpoint(path)
    other = torch.nn.ModuleDict({"embed": torch.nn.Embedding(6, 4), "head": torch.nn.Linear(4, 6, bias=False)})
    other["head"].weight = other["embed"].weight
    other.load_state_dict(weights)
    assert torch.equal(other["head"].weight, embedding.weight) and other["head"].weight is other["embed"].weight


def limited_file_size(limit: int):
    """For a child process: files it writes stop growing at `limit` bytes, as on a full disk
    (writes past it fail with EFBIG instead of raising SIGXFSZ)."""
    import resource
    import signal

    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_a_checkpoint_that_cannot_be_written_names_the_last_complete_one_and_leaves_no_partial_copy(tmp_path):
    script = f"""
import torch
from embodied.runs.checkpoint import save_checkpoint
from embodied.core.errors import CheckpointError
directory = {str(tmp_path / "checkpoints")!r}
from pathlib import Path
save_checkpoint(Path(directory), "iter_000001", {{"w": torch.zeros(4)}}, {{"i": 1}}, "a: 1\\n")
try:
    save_checkpoint(Path(directory), "iter_000002", {{"w": torch.zeros(1_000_000)}}, {{"i": 2}}, "a: 1\\n")
except CheckpointError as error:
    print(error)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, preexec_fn=limited_file_size(64 * 1024)
    )
    assert result.returncode == 0, result.stderr[-2000:]
    message = result.stdout.strip()
    assert message.startswith(f"could not write checkpoint iter_000002 in {tmp_path / 'checkpoints'} (")
    assert f"the last complete checkpoint is {tmp_path / 'checkpoints' / 'iter_000001'}" in message
    assert "resume=<run directory>" in message
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["iter_000001", "latest"]
    _, state = load_checkpoint(resolve_checkpoint(tmp_path))
    assert state == {"i": 1}


def test_training_that_cannot_write_its_checkpoint_stops_with_that_message_not_a_traceback(tmp_path):
    run_dir = tmp_path / "run"
    command = [
        "train",
        "env=mujoco_invertedpendulum",
        "env.num_envs=1",
        "algo.rollout_steps=16",
        "algo.num_minibatches=1",
        "algo.update_epochs=1",
        "total_env_steps=16",
        "eval_episodes=0",
        "logger.progress_bar=false",
        "logger.tensorboard=false",
        f"run_dir={run_dir}",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "embodied.cli", *command],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limited_file_size(16 * 1024),
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "could not write checkpoint iter_000001" in result.stderr
    assert "no checkpoint is complete yet" in result.stderr
    assert "Traceback" not in result.stderr
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))
