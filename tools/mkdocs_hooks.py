"""MkDocs hook: the benchmark results (plots and tables under benchmarks/results/) become part
of the site, so the benchmarks page shows the committed figures without copying them into
docs/."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]


def on_files(files, config):
    results = ROOT / "benchmarks" / "results"
    for path in sorted(results.rglob("*")):
        if path.is_file() and path.suffix in (".png", ".md"):
            relative = path.relative_to(ROOT / "benchmarks").as_posix()
            files.append(File(relative, str(ROOT / "benchmarks"), config["site_dir"], config["use_directory_urls"]))
    return files
