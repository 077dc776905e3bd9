"""The GPU campaign and its kit, kept working between the rare visits to a GPU machine: every
step at toy size on this CPU (`--smoke`: physx_cpu, one env), the kit's import closure, and
the staging of its parts as tools/gpu/there.sh does it there."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from embodied.sim.maniskill_common import physx_gpu_library

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
import kit  # noqa: E402  (tools/gpu/kit.py, a script)

CAMPAIGN_STEPS = ("correctness", "throughput", "ppo", "vla", "pipeline", "placement", "rendering", "openvla")


def test_the_smoke_covers_every_campaign_step():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_campaign

    assert tuple(gpu_campaign.STEPS) == CAMPAIGN_STEPS


@pytest.mark.parametrize("step", CAMPAIGN_STEPS)
@pytest.mark.slow
def test_each_campaign_step_runs_at_toy_size_and_writes_its_result(step, tmp_path):
    """`--smoke --only <step>`, as the campaign runs each step: one step per test, so the
    steps spread over the test workers."""
    results, work, out = tmp_path / "results", tmp_path / "work", tmp_path / "out"
    out.mkdir()
    result = subprocess.run(
        [
            sys.executable,
            "benchmarks/gpu_campaign.py",
            "--smoke",
            "--only",
            step,
            "--results",
            str(results),
            "--work",
            str(work),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "OUT": str(out), "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads((results / f"{step}.json").read_text())
    assert "error" not in record and record["smoke"] and record["rows"], step
    assert not [row for row in record["rows"] if "error" in row], step  # a row's failure is recorded, not raised
    assert record["commit"] and record["machine"]["cpu_cores"] and "gpu_campaign.py" in record["command"]
    assert (out / f"{step}.json").is_file() and (results / f"{step}.md").read_text().startswith("# GPU campaign")
    if step == "correctness":
        # The same backend on both sides: the comparison finds no difference, or it would be broken.
        for row in record["rows"]:
            assert row["reset_max_abs_diff"] == 0 and row["first_episode_state_drift"] == 0
            assert row["episodes_reference"] == row["episodes_candidate"] and row["truncated_at_limit"]
        assert record["met"] is True


def test_a_failing_step_is_recorded_and_the_campaign_goes_on(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_campaign

    def broken(scale, work):
        raise RuntimeError("the GPU went away")

    monkeypatch.setitem(gpu_campaign.STEPS, "correctness", broken)
    record = gpu_campaign.run_step("correctness", gpu_campaign.gpu_steps.Scale(smoke=True), tmp_path, tmp_path)
    assert record["error"] == "RuntimeError: the GPU went away"
    assert "Failed:** RuntimeError: the GPU went away" in (tmp_path / "correctness.md").read_text()
    assert "| correctness | not measured on a GPU yet |" in gpu_campaign.report(tmp_path)  # a smoke run is no GPU run


def test_a_step_cut_off_midway_has_already_handed_back_the_rows_it_measured(tmp_path, monkeypatch):
    """GPU time can end inside a step: each measurement is published as it comes, into $OUT too
    (JSON only: the machine hands back at most 8 files), and `report` marks the step unfinished."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_campaign

    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("OUT", str(out))
    seen_midway = []

    def two_rows(scale, work):
        gpu_campaign.gpu_steps.on_measured({"workers": 4, "speedup": 1.2})
        seen_midway.append(json.loads((out / "pipeline.json").read_text()))
        gpu_campaign.gpu_steps.on_measured({"workers": 8, "speedup": 1.5})
        return gpu_campaign.gpu_steps.StepResult("a goal", False, [{"workers": 4}, {"workers": 8}])

    monkeypatch.setitem(gpu_campaign.STEPS, "pipeline", two_rows)
    results = tmp_path / "results"
    record = gpu_campaign.run_step("pipeline", gpu_campaign.gpu_steps.Scale(smoke=True), results, tmp_path)
    assert seen_midway[0]["unfinished"] and seen_midway[0]["rows"] == [{"workers": 4, "speedup": 1.2}]
    assert "unfinished" not in record and record["met"] is False
    assert sorted(p.name for p in out.iterdir()) == ["pipeline.json"]
    # A record cut off on a GPU (not a smoke run): the report says so and rebuilds its Markdown.
    cut_off = {**seen_midway[0], "smoke": False}
    (results / "pipeline.json").write_text(json.dumps(cut_off))
    (results / "pipeline.md").unlink()
    assert "| [pipeline](pipeline.md) | unfinished: cut off after 1 rows |" in gpu_campaign.report(results)
    assert "**Unfinished:**" in (results / "pipeline.md").read_text()


def test_the_kit_check_refuses_a_first_call_over_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(kit, "KIT", tmp_path)
    (tmp_path / "debs").mkdir()
    (tmp_path / "MANIFEST.json").write_text("{}")
    (tmp_path / "site.tar.xz").write_bytes(b"x" * 1000)
    monkeypatch.setattr(kit, "working_tree_bytes", lambda: 500)
    monkeypatch.setattr(kit, "LIMIT_BYTES", 2000)
    assert "EMBODIED_COMMIT=" in kit.check()
    monkeypatch.setattr(kit, "LIMIT_BYTES", 1200)
    with pytest.raises(SystemExit, match="over the"):
        kit.check()


@pytest.mark.slow
def test_the_kit_carries_what_the_campaign_imports_and_the_gpu_image_lacks():
    needed = kit.needed()
    carried = {"mani-skill", "sapien", "pyzmq", "hydra-core", "omegaconf", "gymnasium", "mujoco", "pyopengl"}
    assert carried <= set(needed)
    assert not {"torch", "numpy", "transformers", "embodied-rl", "opencv-python"} & set(needed)
    assert set(kit.EXTRAS) <= set(needed)


@pytest.mark.slow
def test_extra_parts_stay_under_the_limit_and_there_joins_their_pieces(tmp_path, monkeypatch):
    """A file larger than a part travels in pieces over several calls; there.sh joins it once
    all have arrived, and lays the working tree out as the `embodied` package."""
    monkeypatch.setattr(kit, "PART_BYTES", 4096)
    site = tmp_path / "built"
    (site / "weights").mkdir(parents=True)
    big, small = os.urandom(10_000), b"config"
    (site / "weights" / "model.bin").write_bytes(big)
    (site / "weights" / "config.json").write_bytes(small)
    monkeypatch.setattr(kit, "install", lambda wheels, target: shutil.copytree(site, target))
    kit_dir = tmp_path / "repo" / ".gpu"
    kit_dir.mkdir(parents=True)
    parts = kit.split_extras([], kit_dir)
    assert len(parts) >= 3 and all(p.stat().st_size <= 4096 + tarfile.RECORDSIZE + 3 * 1024 for p in parts)
    assert kit.pieces(parts) == {"weights/model.bin": 3}
    # SAPIEN's PhysX GPU library, from its release zip, in parts of its own
    library = os.urandom(9_000)
    with zipfile.ZipFile(tmp_path / "linux-so.zip", "w") as release:
        release.writestr("libPhysXGpu_64.so", library)
    physx, origin = kit.physx_gpu_parts(tmp_path / "linux-so.zip", kit_dir)
    assert len(physx) >= 2 and origin.endswith("linux-so.zip") and len(kit.pieces(physx)) == 1
    # the working tree's package folders as a call carries them (git ignores the local benchmark
    # runs, which can hold gigabytes), and a manifest from a first call
    repo = tmp_path / "repo"

    def ignored(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if n == "__pycache__" or (Path(folder) == ROOT / "benchmarks" and n == "runs")]

    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    for name in ("embodied", "sim", "policies", "robots", "configs", "benchmarks", "tools"):
        shutil.copytree(ROOT / name, repo / name, ignore=ignored)
    manifest = {"commit": "abc", "pieces": kit.pieces(parts + physx)}
    (kit_dir / "MANIFEST.json").write_text(json.dumps(manifest))
    stage = tmp_path / "site"
    with tarfile.open(kit_dir / "site.tar.xz", "w:xz") as archive:  # a stand-in for the real site
        info = tarfile.TarInfo("marker.txt")
        info.size = 2
        archive.addfile(info, io.BytesIO(b"ok"))
    script = (ROOT / "tools" / "gpu" / "there.sh").read_text().replace("/tmp/embodied-gpu-site", str(stage))
    (repo / "there.sh").write_text(script)
    home = tmp_path / "home"
    environment = {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(home),
    }
    for index, part in enumerate(parts + physx):  # each call carries one part, as the device tool would
        for other in parts + physx:
            if other != part:
                other.rename(other.with_suffix(".later"))
        result = subprocess.run(
            ["bash", "there.sh", "--stage-only"], cwd=repo, env=environment, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr[-2000:]
        for other in kit_dir.glob("*.later"):
            other.rename(other.with_suffix(".tar"))
        assert (stage / "weights" / "model.bin").is_file() == (index >= len(parts) - 1)
    assert (stage / "weights" / "model.bin").read_bytes() == big
    assert (stage / "weights" / "config.json").read_bytes() == small and (stage / "marker.txt").read_text() == "ok"
    assert (stage / "embodied" / "sim" / "maniskill.py").is_file() and (
        stage / "embodied" / "configs" / "train.yaml"
    ).is_file()
    assert not list(stage.rglob("*.piece*"))
    installed = home / ".sapien" / "physx" / physx_gpu_library().parent.name / "libPhysXGpu_64.so"
    assert installed.read_bytes() == library and not list(stage.glob("sapien-physx/*/*.xz"))
    # There the package exists only as laid out above (no editable install): every campaign
    # script must import it from there, never the checkout's bare embodied/ folder.
    probe = f"""
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]
sys.path_hooks[:] = [h for h in sys.path_hooks if "editable" not in repr(h)]
sys.path_importer_cache.clear()
sys.path[:0] = [{str(stage)!r}, {str(repo / "benchmarks")!r}]
import gpu_campaign, openvla_real_size, placement, pipeline, token_vla_real_size
import harness.gpu_measure, harness.openvla_measure, harness.pipelining, harness.placement_runs
import embodied.policies.pretrained.openvla, embodied.sim.maniskill_batched
print(embodied.__file__)
"""
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert Path(result.stdout.strip()).parent == stage / "embodied"


@pytest.mark.parametrize("name", ["site.tar.xz"])
def test_the_kit_is_git_ignored(name):
    result = subprocess.run(["git", "check-ignore", f".gpu/{name}"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0
