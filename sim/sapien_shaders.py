"""SAPIEN's camera shaders without the BRDF look-up table that ManiSkill's scenes never read.

SAPIEN's "minimal" shader (ManiSkill's cameras) and "default" shader (its videos) add a
specular term lit by the scene's environment map, a split-sum approximation whose second
factor comes from a 512x512 BRDF look-up table. SAPIEN computes that table in a compute shader
the first time a process renders: on a CPU renderer (Mesa's llvmpipe, the renderer of a machine
without a GPU) about 20 s of CPU, in every process that renders, for a term that is zero in
every scene without an environment map. No task this project offers sets one (`check_scene`
refuses a scene that does), so without CUDA the packs are used as copies whose look-up is that
zero: the images are the same bytes (tests/sim/test_maniskill.py renders each camera both ways)
and a camera's first frame costs a fraction of a second instead of 20 s.

The copies are derived from the installed SAPIEN once per version of its shaders, into the
user's cache; where the edit no longer applies (a SAPIEN whose shaders read differently) the
stock packs stay, with a warning."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

logger = logging.getLogger(__name__)

PACKS = ("minimal", "default")  # the cameras' and the videos' packs (ManiSkill's names)
DECLARATION = re.compile(r"^layout\(.*\) uniform sampler2D samplerBRDFLUT;$\n?", re.MULTILINE)
LOOKUP = "texture(samplerBRDFLUT, vec2(roughness, dotNV)).xy"
ZERO = "vec2(0.0)"
STOCK_KEPT: list[Path] = []  # where this process found it could not use the lean copies


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "embodied" / "sapien-shaders"


def derive(stock: Path, root: Path) -> Optional[Path]:
    """A copy of SAPIEN's shader folder `stock` with PACKS' look-ups replaced by zero, under
    `root` (named by the stock shaders' digest: written once, then reused by every process);
    None where the edit does not apply."""
    files = sorted(path for path in stock.rglob("*") if path.is_file())
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(stock)).encode() + b"\0" + path.read_bytes())
    target = root / digest.hexdigest()[:16]
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    try:
        shutil.copytree(stock, staging, dirs_exist_ok=True)
        for pack in PACKS:
            for path in (staging / pack).iterdir():
                text = path.read_text()
                edited = DECLARATION.sub("", text).replace(LOOKUP, ZERO)
                if "samplerBRDFLUT" in edited:  # read some other way than the edit knows
                    return None
                if edited != text:
                    path.write_text(edited)
        try:
            staging.rename(target)  # whole or not at all: processes deriving at once race here
        except OSError:
            if not target.is_dir():
                raise
        return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def use_lean_shaders() -> bool:
    """From now on in this process, SAPIEN loads PACKS from the derived copies (idempotent).
    False where they could not be derived (the stock packs stay, with a warning)."""
    import sapien
    import sapien.render

    if getattr(sapien.render.set_camera_shader_dir, "lean", False):
        return True
    if STOCK_KEPT:  # said once per process, not once per env built
        return False
    stock = Path(sapien.__file__).parent / "vulkan_shader"
    try:
        lean = derive(stock, cache_root())
    except OSError as error:  # an unwritable cache: slower, never wrong
        logger.warning("SAPIEN's shaders stay as they are (the lean copies could not be written: %s)", error)
        lean = None
    else:
        if lean is None:
            logger.warning(
                "SAPIEN's shaders at %s read their BRDF look-up table in a way this version does not edit: "
                "each process's first camera frame computes it (about 20 s of CPU)",
                stock,
            )
    if lean is None:
        STOCK_KEPT.append(stock)
        return False
    stock_set = sapien.render.set_camera_shader_dir

    def set_camera_shader_dir(folder: str) -> None:
        stock_set(str(lean / folder) if folder in PACKS else folder)

    set_camera_shader_dir.lean = True
    sapien.render.set_camera_shader_dir = set_camera_shader_dir
    return True


def check_scene(env: Any) -> None:
    """The lean packs' images equal the stock ones only without an environment map."""
    scene = env.unwrapped.scene
    if any(sub.render_system.cubemap is not None for sub in scene.sub_scenes):
        raise RuntimeError(
            f"{env.unwrapped.spec.id} lights its scene with an environment map, which the lean camera shaders "
            "(embodied/sim/sapien_shaders.py) leave out: build it with SAPIEN's own shaders"
        )
