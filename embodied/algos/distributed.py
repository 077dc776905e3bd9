"""Data-parallel learning over torch.distributed (gloo on CPU, nccl on GPU).

Every rank holds the same batch. Each computes the loss on its own contiguous shard of every
minibatch, and the gradients are averaged across ranks before the optimizer step: DDP's
arithmetic. With equal shards the average of the shard means is the mean over the whole
minibatch, so N ranks take the step one process would take on the whole minibatch.

Two ways to hold the policy (`runtime.learner_sharding`):
- replicate: every rank has all of it. The average is taken explicitly (one flat all-reduce)
  because policies are driven through `recompute()`, not `forward()`, and some of their
  parameters get no gradient in some steps (critic warm-up, frozen backbones), which DDP's
  forward hooks do not allow for.
- fsdp: PyTorch's FSDP2 (`fully_shard`). Each rank keeps 1/N of every parameter, gradient and
  optimizer moment; a unit's parameters are gathered for its forward and backward, and the
  gradients are averaged as they are scattered back. The units are the policy's
  `fsdp_units()` (e.g. pi0's vision tower, VLM and action expert), then the policy itself; its
  `recompute`, `value`, `act` and `bc_loss` gather what the units leave. Whole weights and
  optimizer state exist only where they are asked for (publishing, checkpoints), on rank 0,
  in the same layout as a replicated run's, so a run resumes either way."""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from embodied.core.errors import ConfigError

SHARDINGS = ("replicate", "fsdp")

# Ranks 1..N-1 wait inside a collective for rank 0's next batch, through evaluations and
# rollout restarts; rank 0 kills them when it fails, so a long wait never outlives it.
IDLE_TIMEOUT = timedelta(hours=24)


class DataParallel:
    def __init__(self, rank: int, world_size: int, device: torch.device | str = "cpu"):
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(device)  # where the collectives' own tensors live (nccl: the GPU)
        self.sharded = False  # fsdp: the gradients are averaged in backward already

    @classmethod
    def join(cls, rank: int, world_size: int, address: str, device: torch.device | str = "cpu") -> "DataParallel":
        """Join the process group at `address` (host:port, served by rank 0): nccl for a CUDA
        `device` (this rank's GPU), gloo otherwise. Ranks wait for each other's next batch
        inside a collective, so the timeout is long; a rank that dies still fails the others
        at once (the connection closes)."""
        device = torch.device(device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        host, port = address.rsplit(":", 1)
        # Rank 0 serves the rendezvous on `host` alone: torch's store would listen on every
        # interface of the machine, loopback runs included.
        # The store takes the socket over (and closes it).
        listener = socket.create_server((host, int(port))).detach() if rank == 0 else None
        store = dist.TCPStore(
            host, int(port), world_size, is_master=rank == 0, timeout=IDLE_TIMEOUT, master_listen_fd=listener
        )
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=IDLE_TIMEOUT,
        )
        return cls(rank, world_size, device)

    def shard(self, size: int) -> slice:
        """This rank's part of a minibatch of `size` rows."""
        if size % self.world_size:
            raise ConfigError(
                f"a minibatch of {size} samples does not split evenly over {self.world_size} learner "
                f"ranks; choose algo.num_minibatches so that it does"
            )
        part = size // self.world_size
        return slice(self.rank * part, (self.rank + 1) * part)

    def part(self, size: int) -> slice:
        """This rank's contiguous part of `size` rows when they need not split evenly: sizes
        differ by at most one, and a rank may get none."""
        return slice(self.rank * size // self.world_size, (self.rank + 1) * size // self.world_size)

    def broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's `tensor` on every rank (e.g. the minibatch order), in place."""
        if tensor.device == self.device:
            dist.broadcast(tensor, src=0)
            return tensor
        moved = tensor.to(self.device)  # nccl moves only GPU tensors
        dist.broadcast(moved, src=0)
        tensor.copy_(moved.to(tensor.device))
        return tensor

    def average_gradients(self, parameters: list[torch.nn.Parameter]) -> None:
        """Replace every gradient by its mean over the ranks; a missing gradient counts as zero
        and stays missing where it is missing on every rank. Frozen parameters are skipped.
        Sharded (fsdp): nothing to do, FSDP averaged them as it scattered them."""
        if self.sharded:
            return
        trainable = [p for p in parameters if p.requires_grad]
        present = torch.tensor([p.grad is not None for p in trainable], dtype=torch.int32, device=self.device)
        dist.all_reduce(present)
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in trainable])
        dist.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for parameter, count in zip(trainable, present.tolist()):
            size = parameter.numel()
            parameter.grad = flat[offset : offset + size].view_as(parameter) if count else None
            offset += size

    def mean(self, value: float) -> float:
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return float(tensor) / self.world_size

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


# ---- fsdp ------------------------------------------------------------------------------------

FORWARD_METHODS = ("recompute", "value", "act", "bc_loss")  # what gathers the policy's own parameters


def shard_policy(policy: torch.nn.Module, parallel: DataParallel) -> None:
    """FSDP2 over the ranks: the policy's units, then the policy (its remaining parameters)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    mesh = init_device_mesh(parallel.device.type, (parallel.world_size,))
    units = getattr(policy, "fsdp_units", lambda: [])()
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(policy, mesh=mesh)
    for method in FORWARD_METHODS:
        register_fsdp_forward_method(policy, method)
    parallel.sharded = True


def shard_with_optimizer(
    policy: torch.nn.Module, optimizer: torch.optim.Optimizer, parallel: DataParallel
) -> torch.optim.Optimizer:
    """Shard `policy` and return its optimizer rebuilt over the sharded parameters, holding
    the shards of `optimizer`'s state (the same on every rank before)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if len(optimizer.param_groups) != 1:
        raise ConfigError(
            "runtime.learner_sharding=fsdp shards optimizers with one parameter group "
            "(algo.value_lr gives the value function a group of its own: leave it null)"
        )
    names = optimizer_parameter_names(policy, optimizer)
    state = optimizer.state_dict()
    shard_policy(policy, parallel)
    parameters = dict(policy.named_parameters())
    sharded = type(optimizer)([parameters[name] for name in names], **optimizer.defaults)
    if state["state"]:  # parameters that never had a gradient (e.g. an unused noise head) have none
        set_optimizer_state_dict(
            policy, sharded, by_name(state, names), options=StateDictOptions(full_state_dict=True, strict=False)
        )
        # Loading first gives every parameter a zero state (a step at lr 0); where there was
        # none, there stays none, so its first real step is the one an unsharded optimizer takes.
        saved = {names[i] for i in state["state"]}
        for name in names:
            if name not in saved:
                sharded.state.pop(parameters[name], None)
    return sharded


def optimizer_parameter_names(policy: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of the optimizer's parameters, in its order."""
    name_of = {id(p): name for name, p in policy.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def by_name(state: dict, names: list[str]) -> dict:
    """An optimizer state dict keyed by parameter index -> keyed by parameter name."""
    return {
        "state": {names[i]: value for i, value in state["state"].items()},
        "param_groups": [{**group, "params": [names[i] for i in group["params"]]} for group in state["param_groups"]],
    }


def full_weights(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole state dict, gathered on rank 0 (on the CPU); other ranks get {}. Every rank
    must call it."""
    rank0 = dist.get_rank() == 0
    whole = {}
    for name, value in policy.state_dict().items():
        value = gather_whole(value.detach())
        if rank0:
            whole[name] = value
    return whole


def full_optimizer_state(policy: torch.nn.Module, optimizer: torch.optim.Optimizer, names: list[str]) -> dict:
    """The whole optimizer state, keyed by index as an unsharded optimizer's, on rank 0; other
    ranks get {}. Every rank must call it. `optimizer` holds the parameters in `names`' order
    (`shard_with_optimizer`), so index i is names[i]'s, as in the unsharded optimizer."""
    (group,) = optimizer.param_groups
    if len(group["params"]) != len(names):
        raise ValueError(f"the sharded optimizer holds {len(group['params'])} parameters, not the {len(names)} named")
    rank0 = dist.get_rank() == 0
    state = {}
    for index, parameter in enumerate(group["params"]):
        if parameter in optimizer.state:
            moments = {key: gather_whole(value) for key, value in optimizer.state[parameter].items()}
            if rank0:
                state[index] = moments
    if not rank0:
        return {}
    settings = {key: value for key, value in group.items() if key != "params"}
    return {"state": state, "param_groups": [{**settings, "params": list(range(len(names)))}]}


def gather_whole(value: Any) -> Any:
    """An FSDP2 shard (a DTensor sharded on dim 0 over the 1-D mesh) gathered whole, on the CPU;
    anything else as it is (buffers, Adam's step), on the CPU. Every rank must call it for
    the same values in the same order.

    Plain blocking all-gathers of the padded local shards: DTensor's own `full_tensor` goes
    through asynchronous functional collectives, and a gloo run crashed (SIGSEGV) waiting on
    one of those while gathering a checkpoint."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not isinstance(value, DTensor):
        return value.cpu() if isinstance(value, torch.Tensor) else value
    if tuple(value.placements) == (Replicate(),):
        return value.to_local().cpu()
    if value.device_mesh.ndim != 1 or tuple(value.placements) != (Shard(0),):
        raise ValueError(f"cannot gather a DTensor placed as {value.placements} on a {value.device_mesh.ndim}-D mesh")
    world = value.device_mesh.size()
    group = value.device_mesh.get_group()
    rows = value.shape[0]
    chunk = -(-rows // world)  # torch.chunk's split: rank r holds rows [r * chunk, (r + 1) * chunk)
    local = value.to_local()
    padded = local.new_zeros((chunk, *value.shape[1:]))
    padded[: local.shape[0]] = local
    pieces = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(pieces, padded, group=group)
    whole = torch.cat(pieces)
    # a slice would keep the padding's storage, which torch.save writes out with it
    return (whole if whole.shape[0] == rows else whole[:rows].clone()).cpu()
