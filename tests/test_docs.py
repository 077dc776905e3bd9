"""The documentation site: the pages generated from the code are current, and the whole site
builds with `mkdocs build --strict` (a broken link or a page missing from the site fails)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import docs  # noqa: E402  (tools/docs.py)


def test_the_generated_pages_are_current():
    stale = [str(path.relative_to(ROOT)) for path, text in docs.pages().items() if path.read_text() != text]
    assert not stale, f"regenerate them with `python tools/docs.py`: {stale}"


def test_every_group_option_the_docs_name_exists():
    """`env=...`, `policy=...` and the other groups' options in the pages, the README and the
    CLI's usage are configs a reader's command finds (old names only beside their new ones)."""
    from embodied.core.compose import CONFIG_DIR, RENAMED

    groups = "|".join(path.name for path in CONFIG_DIR.iterdir() if path.is_dir() and not path.name.startswith("_"))
    pages = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", ROOT / "embodied" / "cli.py"]
    named = {
        (page.relative_to(ROOT), match.group(0))
        for page in pages
        for match in re.finditer(rf"(?<![\w.])({groups})=(\w+)", page.read_text())  # not operator.policy=
    }
    assert len(named) > 50  # the pattern finds what the pages name
    missing = [
        (str(page), option)
        for page, option in sorted(named)
        if option not in RENAMED and not (CONFIG_DIR / option.replace("=", "/")).with_suffix(".yaml").is_file()
    ]
    assert not missing, missing


def test_the_reference_documents_every_key_of_every_component():
    page = (ROOT / "docs" / "reference" / "config.md").read_text()
    for expected in (
        "### `ppo` (PPOConfig)",
        "Options: `algo=ppo`, `algo=ppo_maniskill`",
        "`algo.clip_coef`",
        "### `maniskill` (ManiSkillConfig)",
        "`env.backend`",
        "### `pi0` (Pi0Config)",
        "`policy.pretrained`",
        "### `procs` (ProcsRuntimeConfig)",
        "### `train.yaml` (embodied train)",
        "`logger.progress_bar`",
        "`teleop.operator.policy`",
        "| `time_limit_s` | float or null | null |",
    ):
        assert expected in page, expected


def test_the_site_builds_strictly(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    built = tmp_path / "site"
    for page in (
        "index.html",
        "getting-started/index.html",
        "protocol/index.html",
        "reference/config/index.html",
        "benchmarks/index.html",
        "results/ppo_maniskill.png",
    ):
        assert (built / page).is_file(), page
