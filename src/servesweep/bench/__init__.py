"""servesweep.bench: the load generator, its metrics and the correctness evals.

Entry points (import them from their modules; importing this package stays cheap):

- ``servesweep.bench.load.run_workload(target, workload, options=LoadOptions(...))
  -> list[LevelResult]`` (async) and ``run_workload_sync(...)``;
- ``servesweep.bench.standalone.run_standalone(BenchServer(url, ...),
  bench_workload(...), options)``, ``format_results(results)``,
  ``results_as_dicts(results)`` for ``servesweep bench --url``;
- ``servesweep.bench.datasets.load_prompts(dataset)`` for the prompt sets;
- ``servesweep.bench.evals.run_eval_workload(target, workload)`` for correctness suites.

Metric names and definitions: docs/metrics.md.
"""
