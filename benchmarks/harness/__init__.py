"""What the benchmark studies share. Each study is a top-level script, `benchmarks/<study>.py`;
run as `python benchmarks/<study>.py`, it has benchmarks/ first on sys.path, so it imports this
package as `harness`. Studies import from here and from the installed packages, never from one
another; nothing here imports a study.

    runs      training runs (RUNS) and their committed records (RESULTS/runs): train, resume, collect
    heldout   held-out evaluation of a final policy, on an evaluation seed nothing else draws from
    stats     figures over curves and seeds: steps to a goal, intervals, table cells
    reports   provenance of a result, figures beside their JSON summaries, the Markdown summary
"""
