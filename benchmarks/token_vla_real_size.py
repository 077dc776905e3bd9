"""The token VLA (`policy=token_vla`) on real-size backbones on a CUDA GPU: Qwen2.5-0.5B (a
causal LM, reading the instruction and the state) and SmolVLM-256M (a vision-language model,
also reading a 128 px camera frame, which its 512 px SigLIP tower sees as 64 image tokens).

No pretrained weights load offline here, so each backbone is built at its published
architecture with random weights, saved with `save_pretrained` next to a byte-level BPE tokenizer
trained on the multi-task instructions, and loaded the way a user's checkpoint is: `backbone=<path>`.
Observations have the multi-task ManiSkill env's shapes (48-d state, 4-d action, three
instructions). For full fine-tuning and for LoRA (rank 32), each in float32 and bfloat16
(`precision`), with the parallel decoder (and the causal one for Qwen at full fine-tuning):

- rollout: one `act` over 256 envs (sampled actions), chunks per second;
- training: one GRPO step on a minibatch (`recompute`, the clipped loss, backward, AdamW),
  samples per second, and the peak GPU memory;
- the log-prob gap between rollout (one batch of 256, no gradient) and the training forward
  pass (minibatches, with gradient), per action token: with the same arithmetic the first
  update's ratios start at 1;
- what a weight update carries (`published_weights`) and how long gathering it takes.

Then the train CLI end to end with Qwen2.5-0.5B (LoRA, bfloat16) on the GPU: GRPO for 3
iterations, the run resumed for 2 more, and PPO for 2, on MuJoCo InvertedPendulum (64 envs;
no success signal there, so GRPO ranks returns and keeps every group). This checks the whole
path at real size on CUDA (rollout, update, checkpoint, resume, eval), not learning.

    python benchmarks/token_vla_real_size.py                 # on a machine with a CUDA GPU
    python benchmarks/token_vla_real_size.py --smoke         # small sizes on a CPU: checks the script
    python benchmarks/token_vla_real_size.py cli             # only the train CLI part, into the committed results
    python benchmarks/token_vla_real_size.py report          # rebuild the summary from the results JSON"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from embodied.algos.grpo import GRPOConfig
from embodied.core.types import ActionChunk, EnvSpec, Observation
from embodied.policies.vla.token_vla import TokenVLAConfig, TokenVLAPolicy
from embodied.runtime.wire import published_weights
from embodied.sim.maniskill_common import INSTRUCTIONS
from harness.commands import embodied
from harness.reports import save_with_summary
from harness.runs import RESULTS
from harness.timing import speeds, timed_grpo_update, timed_rollout

NAME = "token_vla_real_size"
TASKS = ["PushCube-v1", "PickCube-v1", "StackCube-v1"]
STATE_DIM, ACTION_DIM, CAMERA_SIZE = 48, 4, 128
LORA_RANK, TIMED, GAP_MINIBATCH = 32, 5, 64


CLI_ENVS, CLI_ROLLOUT_STEPS = 64, 50
CLI_COMMON = [
    "env=mujoco_invertedpendulum",
    f"env.num_envs={CLI_ENVS}",
    "policy=token_vla",
    "policy.precision=bfloat16",
    f"policy.lora_rank={LORA_RANK}",
    "runtime.torch_threads=8",
    "eval_episodes=16",
    "checkpoint_every=1",
    "keep_checkpoints=1",
]
CLI_RUNS = {  # name: (arguments, iterations); "grpo-resumed" resumes "grpo"
    "grpo": (
        [
            "algo=grpo",
            "algo.group_size=8",
            "algo.outcome=return",
            "algo.success_band=[0.0,1.0]",
            f"algo.rollout_steps={CLI_ROLLOUT_STEPS}",
            "algo.num_minibatches=2",
            "algo.lr=1e-5",
        ],
        3,
    ),
    "grpo-resumed": ([], 2),
    "ppo": (
        ["algo=ppo", f"algo.rollout_steps={CLI_ROLLOUT_STEPS}", "algo.num_minibatches=4", "algo.update_epochs=1"],
        2,
    ),
}


def qwen25_05b(full: bool) -> Any:
    """Qwen2.5-0.5B's architecture (494 M parameters), or a small one of the same classes."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=151936 if full else 4096,
        hidden_size=896 if full else 64,
        num_hidden_layers=24 if full else 2,
        intermediate_size=4864 if full else 128,
        num_attention_heads=14 if full else 1,
        num_key_value_heads=2 if full else 1,
        max_position_embeddings=32768,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def smolvlm_256m(full: bool) -> Any:
    """SmolVLM-256M's architecture: SigLIP base at 512 px (patch 16, pixel shuffle by 4: 64
    image tokens) and a 30-layer, 576-wide Llama (SmolLM2-135M); or a small one."""
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    vision = dict(
        hidden_size=768 if full else 64,
        intermediate_size=3072 if full else 128,
        num_hidden_layers=12 if full else 1,
        num_attention_heads=12 if full else 2,
        image_size=512 if full else 64,
        patch_size=16,
    )
    text = dict(
        model_type="llama",
        vocab_size=49280 if full else 4096,
        hidden_size=576 if full else 64,
        intermediate_size=1536 if full else 128,
        num_hidden_layers=30 if full else 2,
        num_attention_heads=9 if full else 2,
        num_key_value_heads=3 if full else 1,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    )
    config = SmolVLMConfig(
        vision_config=vision,
        text_config=text,
        scale_factor=4,
        image_token_id=49190 if full else 3000,
        tie_word_embeddings=True,
    )
    return SmolVLMForConditionalGeneration(config)


# name: (builder, cameras, training minibatch); SmolVLM's minibatch is smaller because each
# sample carries its vision tower's 1024 patches through the backward pass
BACKBONES: dict[str, tuple[Callable[[bool], Any], bool, int]] = {
    "qwen2.5-0.5b": (qwen25_05b, False, 256),
    "smolvlm-256m": (smolvlm_256m, True, 32),
}


def write_checkpoint(name: str, directory: Path, full: bool) -> None:
    """Random weights at the backbone's architecture and a byte-level BPE tokenizer trained
    on the instructions (the kind both backbones ship: transformers picks the tokenizer class
    from the model type and reads its vocab.json and merges.txt), saved as a user's local
    checkpoint would be."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    directory.mkdir(parents=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(
        [INSTRUCTIONS[t] for t in TASKS],
        trainers.BpeTrainer(
            vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    tokenizer.model.save(str(directory))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<|endoftext|>").save_pretrained(directory)
    torch.manual_seed(0)
    BACKBONES[name][0](full).save_pretrained(directory)


def spec(cameras: bool) -> EnvSpec:
    return EnvSpec(
        state_dim=STATE_DIM,
        action_dim=ACTION_DIM,
        action_low=(-1.0,) * ACTION_DIM,
        action_high=(1.0,) * ACTION_DIM,
        image_shapes={"base_camera": (CAMERA_SIZE, CAMERA_SIZE, 3)} if cameras else {},
    )


def observation(batch: int, cameras: bool, seed: int) -> Observation:
    g = torch.Generator().manual_seed(seed)
    images = (
        {"base_camera": torch.randint(0, 256, (batch, CAMERA_SIZE, CAMERA_SIZE, 3), generator=g, dtype=torch.uint8)}
        if cameras
        else {}
    )
    return Observation(
        state=torch.randn(batch, STATE_DIM, generator=g),
        images=images,
        instruction=[INSTRUCTIONS[TASKS[i * len(TASKS) // batch]] for i in range(batch)],
    )


def log_prob_gap(
    policy: TokenVLAPolicy,
    obs: Observation,
    recorded: Callable[[slice], ActionChunk],
    rollout_log_probs: torch.Tensor,
    minibatch: int,
) -> torch.Tensor:
    """Per action token, training-pass log-prob minus rollout log-prob: the training passes run
    with gradient over the same rows, in minibatches of another shape than the rollout's (as a
    PPO or GRPO minibatch is). Their graphs are freed on return, before memory is measured."""
    gaps = []
    for start in range(0, obs.batch_size, minibatch):
        rows = slice(start, start + minibatch)
        recomputed = policy.recompute(obs.select(rows), recorded(rows))
        gaps.append((recomputed.term_log_prob.detach() - rollout_log_probs[rows]).flatten().cpu())
    return torch.cat(gaps)


def measure(
    name: str,
    checkpoint: Path,
    lora: bool,
    precision: str,
    decoder: str,
    rollout_batch: int,
    device: torch.device,
    runs: int,
) -> dict[str, Any]:
    _, cameras, minibatch = BACKBONES[name]
    minibatch = min(minibatch, rollout_batch)
    env_spec = spec(cameras)
    started = time.perf_counter()
    torch.manual_seed(0)
    policy = TokenVLAPolicy(
        TokenVLAConfig(
            backbone=str(checkpoint), decoder=decoder, precision=precision, lora_rank=LORA_RANK if lora else 0
        ),
        env_spec,
    ).to(device)
    load_s = time.perf_counter() - started
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-6)
    obs = observation(rollout_batch, cameras, seed=0).to_torch(device)
    rollout = timed_rollout(policy, obs, device, runs)
    policy.train()
    gap = log_prob_gap(policy, obs, rollout.recorded, rollout.old, min(GAP_MINIBATCH, minibatch))
    ratio, clip = gap.exp(), GRPOConfig()
    update_seconds, _ = timed_grpo_update(policy, optimizer, obs, rollout, minibatch, device, runs)
    peak_gb = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else float("nan")

    publish_started = time.perf_counter()
    weights = published_weights(policy)
    publish_s = time.perf_counter() - publish_started
    row = {
        "backbone": name,
        "mode": "lora" if lora else "full",
        "precision": precision,
        "decoder": decoder,
        "parameters": sum(p.numel() for p in policy.parameters()),
        "trainable": sum(p.numel() for p in trainable),
        "load_s": load_s,
        "rollout_batch": rollout_batch,
        "minibatch": minibatch,
        **speeds(rollout_batch, rollout.act_seconds, minibatch, update_seconds),
        "peak_gb": peak_gb,
        "log_prob_gap_mean": float(gap.abs().mean()),
        "log_prob_gap_max": float(gap.abs().max()),
        "outside_clip_fraction": float(((ratio < 1 - clip.clip_low) | (ratio > 1 + clip.clip_high)).float().mean()),
        "published_mb": sum(v.numel() * v.element_size() for v in weights.values()) / 1e6,
        "publish_s": publish_s,
    }
    policy = optimizer = weights = None  # free the model before the next one is built
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def runs_to_measure() -> list[tuple[str, bool, str, str]]:
    grid = [
        (name, lora, precision, "parallel")
        for name in BACKBONES
        for lora in (False, True)
        for precision in ("float32", "bfloat16")
    ]
    return grid + [("qwen2.5-0.5b", False, precision, "causal") for precision in ("float32", "bfloat16")]


def run(out: Path, smoke: bool) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() and not smoke else "cpu")
    if device.type != "cuda" and not smoke:
        sys.exit("no CUDA GPU here: run with --smoke to check the script on small sizes")
    rollout_batch, runs = (16, 1) if smoke else (256, TIMED)
    out.mkdir(parents=True, exist_ok=True)
    results = {
        "setup": {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "smoke": smoke,
            "rollout_batch": rollout_batch,
            "timed_runs": runs,
            "lora_rank": LORA_RANK,
            "camera": CAMERA_SIZE,
            "state_dim": STATE_DIM,
            "action_dim": ACTION_DIM,
        },
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as scratch:
        for name in BACKBONES:
            started = time.perf_counter()
            write_checkpoint(name, Path(scratch) / name, full=not smoke)
            print(f"[{name}] checkpoint written in {time.perf_counter() - started:.0f} s", flush=True)
        for name, lora, precision, decoder in runs_to_measure():
            row = measure(name, Path(scratch) / name, lora, precision, decoder, rollout_batch, device, runs)
            results["runs"].append(row)
            (out / f"{NAME}.json").write_text(json.dumps(results, indent=2))  # kept if a later run fails
            print(
                f"[{name} {row['mode']} {precision} {decoder}] {row['chunks_per_s']:.0f} chunks/s, "
                f"{row['samples_per_s']:.0f} samples/s, {row['peak_gb']:.1f} GB, "
                f"gap {row['log_prob_gap_mean']:.1e} (max {row['log_prob_gap_max']:.1e})",
                flush=True,
            )
        results["cli"] = cli_end_to_end(Path(scratch) / "qwen2.5-0.5b", Path(scratch), device)
        (out / f"{NAME}.json").write_text(json.dumps(results, indent=2))


def cli_end_to_end(checkpoint: Path, scratch: Path, device: torch.device) -> dict[str, Any]:
    """`embodied train` with the checkpoint as the backbone: GRPO, resumed, then PPO."""
    steps_per_iteration = CLI_ENVS * CLI_ROLLOUT_STEPS
    rows: dict[str, Any] = {}
    for name, (arguments, iterations) in CLI_RUNS.items():
        done = 0  # iterations before this command (metrics.jsonl is appended on resume)
        if name == "grpo-resumed":
            run_dir, done = scratch / "grpo", rows["grpo"]["iterations"]
            command = [f"resume={run_dir}", f"total_env_steps={(done + iterations) * steps_per_iteration}"]
        else:
            run_dir = scratch / name
            command = [
                *CLI_COMMON,
                f"policy.backbone={checkpoint}",
                f"runtime.device={device.type}",
                *arguments,
                f"total_env_steps={iterations * steps_per_iteration}",
                f"run_dir={run_dir}",
            ]
        started = time.perf_counter()
        embodied("train", *command)
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        metrics = [m for m in metrics if m["train/iteration"] > done]
        last = metrics[-1]
        checkpoints = sorted((run_dir / "checkpoints").glob("iter_*"))
        rows[name] = {
            "command": "embodied train " + " ".join(command),
            "wall_s": time.perf_counter() - started,
            "iterations": int(last["train/iteration"]),
            "env_steps": int(last["env_steps"]),
            "iteration_s": [b["train/elapsed_s"] - a["train/elapsed_s"] for a, b in zip(metrics, metrics[1:])],
            "checkpoint_mb": sum(f.stat().st_size for f in checkpoints[-1].rglob("*") if f.is_file()) / 1e6,
            "last": {k: v for k, v in last.items() if k.startswith(("loss/", "rollout/", "grpo/kept"))},
        }
        print(
            f"[cli {name}] iterations {rows[name]['iterations']}, env steps {rows[name]['env_steps']}, "
            f"checkpoint {rows[name]['checkpoint_mb']:.0f} MB, {rows[name]['wall_s']:.0f} s",
            flush=True,
        )
    return rows


def report(results_json: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = json.loads(results_json.read_text())
    rows, setup = results["runs"], results["setup"]
    label = [f"{r['backbone'].split('-')[0]}\n{r['mode']}, {r['decoder']}" for r in rows if r["precision"] == "float32"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    zero = [
        f"{r['backbone'].split('-')[0]} {r['mode']} {r['decoder']} {r['precision']}"
        for r in rows
        if r["log_prob_gap_mean"] == 0
    ]
    gap_title = "rollout vs training log-prob gap, mean |Δ|" + (
        "\n(0, not drawn: " + ", ".join(zero) + ")" if zero else ""
    )
    for ax, key, title in (
        (axes[0], "chunks_per_s", f"rollout: chunks/s (batch {setup['rollout_batch']})"),
        (axes[1], "samples_per_s", "GRPO step: samples/s"),
        (axes[2], "log_prob_gap_mean", gap_title),
    ):
        for offset, precision in ((-0.2, "float32"), (0.2, "bfloat16")):
            values = [r[key] for r in rows if r["precision"] == precision]
            ax.bar(np.arange(len(values)) + offset, values, 0.4, label=precision)
        ax.set_xticks(range(len(label)), label, fontsize=7)
        ax.set_title(title, fontsize=9)
        if key == "log_prob_gap_mean":
            ax.set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Token VLA on real-size backbones (random weights), {setup['device']}", fontsize=10)
    save_with_summary(fig, RESULTS, NAME, results)

    lines = [
        f"# Token VLA on real-size backbones, {setup['device']}",
        "",
        "Qwen2.5-0.5B (state and instruction) and SmolVLM-256M (also one 128 px camera, 64 image tokens) at "
        "their published architectures with random weights, loaded from a local checkpoint "
        "(`policy.backbone=<path>`). Rollout: one `act` over "
        f"{setup['rollout_batch']} envs without gradient. GRPO step: `recompute`, the clipped loss, backward "
        f"and AdamW on one minibatch. Median of {setup['timed_runs']} after a warm-up. Gap: per action token, "
        "|rollout log-prob − training-pass log-prob| over the same rows (training pass in minibatches of at most 64); "
        f"outside clip: tokens whose first ratio is already outside [0.8, 1.28]. LoRA: rank {setup['lora_rank']} "
        f"on q/v projections. torch {setup['torch']}.",
        "",
        "| backbone | mode | decoder | precision | parameters (trainable) | chunks/s | GRPO samples/s (minibatch) "
        "| peak GB | gap mean / max | outside clip | update MB (gather s) |",
        "| --- | --- | --- | --- | --- | ---: | --- | ---: | --- | ---: | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['backbone']} | {r['mode']} | {r['decoder']} | {r['precision']} "
            f"| {r['parameters'] / 1e6:.0f} M ({r['trainable'] / 1e6:.1f} M) | {r['chunks_per_s']:.0f} "
            f"| {r['samples_per_s']:.0f} ({r['minibatch']}) | {r['peak_gb']:.1f} "
            f"| {r['log_prob_gap_mean']:.1e} / {r['log_prob_gap_max']:.1e} "
            f"| {r['outside_clip_fraction']:.4f} | {r['published_mb']:.0f} ({r['publish_s']:.2f}) |"
        )
    if "cli" in results:
        lines += [
            "",
            "## The train CLI end to end (Qwen2.5-0.5B, LoRA, bfloat16)",
            "",
            "MuJoCo InvertedPendulum, 64 envs, 3,200 env steps per iteration; this checks rollout, update, "
            "checkpoint, resume and eval on CUDA at real size, not learning.",
            "",
            "| run | iterations | env steps | seconds per iteration (after the first) | checkpoint MB "
            "| last update: approx KL / clip fraction / grad norm |",
            "| --- | ---: | ---: | ---: | ---: | --- |",
        ]
        for name, row in results["cli"].items():
            last = row["last"]
            per_iteration = np.median(row["iteration_s"]) if row["iteration_s"] else float("nan")
            lines.append(
                f"| {name} | {row['iterations']} | {row['env_steps']} | {per_iteration:.1f} "
                f"| {row['checkpoint_mb']:.0f} | {last.get('loss/approx_kl', float('nan')):.1e} / "
                f"{last.get('loss/clipfrac', float('nan')):.3f} / {last.get('loss/grad_norm', float('nan')):.2f} |"
            )
        lines += ["", "Commands (`embodied train ...`):", ""]
        lines += [f"- {name}: `{row['command']}`" for name, row in results["cli"].items()]
    lines += ["", f"![throughput and log-prob gap]({NAME}.png)", ""]
    (RESULTS / f"{NAME}.md").write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["report"]:
        report(Path(args[1]) if len(args) > 1 else RESULTS / f"{NAME}.json")
        return
    if args[:1] == ["cli"]:  # the CLI part again, into the committed results (written to $OUT on the GPU machine)
        if not torch.cuda.is_available():
            sys.exit("no CUDA GPU here")
        results = json.loads((RESULTS / f"{NAME}.json").read_text())
        with tempfile.TemporaryDirectory() as scratch:
            write_checkpoint("qwen2.5-0.5b", Path(scratch) / "qwen2.5-0.5b", full=True)
            results["cli"] = cli_end_to_end(Path(scratch) / "qwen2.5-0.5b", Path(scratch), torch.device("cuda"))
        out = Path(os.environ.get("OUT") or tempfile.mkdtemp())
        (out / f"{NAME}.json").write_text(json.dumps(results, indent=2))
        print(f"results: {out / f'{NAME}.json'}")
        return
    smoke = "--smoke" in args
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp()) if not smoke else Path(tempfile.mkdtemp())
    run(out, smoke)
    print(f"results: {out / f'{NAME}.json'}")
    if not smoke:
        report(out / f"{NAME}.json")


if __name__ == "__main__":
    main()
