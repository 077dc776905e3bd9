"""What the benchmark studies share. Each study is a top-level script, `benchmarks/<study>.py`;
run as `python benchmarks/<study>.py`, it has benchmarks/ first on sys.path, so it imports this
package as `harness`. Studies import from here and from the installed packages, never from one
another; nothing here imports a study.

Most studies use `runs` (training runs and their committed records), `heldout` (held-out
evaluation), `stats` (figures over curves and seeds), `reports` (provenance, figures, the
Markdown summary) and `commands` (`embodied` commands). The other modules hold what a few
studies share: a recipe one study builds on another's (`pushcube_sac`, `flow_recipe`,
`sft_rl`), a measurement two run (`pipelining`, `placement_runs`, `openvla_measure`,
`device_memory`, `timing`), a study's report or runner kept apart for its size
(`intervention_study`, `deploy_report`), and the GPU campaign's steps (`gpu_*`).
benchmarks/README.md has a line on each."""
