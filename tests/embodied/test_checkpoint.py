import numpy as np
import pytest
import torch

from embodied.checkpoint import flatten, load_checkpoint, resolve_checkpoint, save_checkpoint, unflatten
from embodied.core.errors import CheckpointError


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
