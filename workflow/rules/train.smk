# FST cycles: cycle c of a run reads cycle c-1's directory and writes its own.
# Weights and optimiser state of a cycle are temp(): deleted once the next cycle and the cycle's
# evaluation have read them; a run's final weights are kept (hard links) only when another
# experiment starts from them.


rule cycle:
    # rl, fst: a fast round (not for rl), then T slow steps (fst_distill: cycle_distill below).
    input:
        unpack(cycle_inputs),
    params:
        # a multi-GPU cycle trains under accelerate's config (fastslow.launch): mixed precision, sharding
        code=library_code("cycle.py", extra=ACCELERATE_CONFIGS),
        task_code=cycle_task_code,
        settings=cycle_settings,
    output:
        model=temp(directory(f"{RUN}/cycle{{cycle}}/model")),
        state=temp(directory(f"{RUN}/cycle{{cycle}}/trainer_state")),
        rollouts=f"{RUN}/cycle{{cycle}}/rollouts.parquet",
        metrics=f"{RUN}/cycle{{cycle}}/metrics.parquet",
        pool=f"{RUN}/cycle{{cycle}}/pool.json",
        fast=f"{RUN}/cycle{{cycle}}/fast.json",  # the round's summary ({} where a method has no round)
        summary=f"{RUN}/cycle{{cycle}}/cycle.json",
    log:
        f"{RESULTS}/logs/runs/{{experiment}}/{{method}}/{{run}}/cycle{{cycle}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/runs/{{experiment}}/{{method}}/{{run}}/cycle{{cycle}}.tsv",
    wildcard_constraints:
        method=methods_of_rule("cycle"),
    threads: heavy_threads()
    resources:
        mem_mb=8000,
    script:
        "../scripts/cycle.py"


use rule cycle as cycle_distill with:
    # fst_distill: the same cycle, its steps distillation instead of CISPO (sharded over the job's
    # GPUs as cycle's are); a rule of its own so that a profile can size it apart.
    wildcard_constraints:
        method=methods_of_rule("cycle_distill"),


rule cycle_frozen:
    # gepa: a fast round on frozen weights, no slow steps.
    input:
        unpack(cycle_inputs),
    params:
        code=library_code("cycle.py"),
        task_code=cycle_task_code,
        settings=cycle_settings,
    output:
        metrics=f"{RUN}/cycle{{cycle}}/metrics.parquet",
        pool=f"{RUN}/cycle{{cycle}}/pool.json",
        fast=f"{RUN}/cycle{{cycle}}/fast.json",  # the round's summary ({} where a method has no round)
        summary=f"{RUN}/cycle{{cycle}}/cycle.json",
        cache=f"{RUN}/cycle{{cycle}}/fast_cache.json",  # its round's new evaluations, free for later cycles' rounds
    log:
        f"{RESULTS}/logs/runs/{{experiment}}/{{method}}/{{run}}/cycle{{cycle}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/runs/{{experiment}}/{{method}}/{{run}}/cycle{{cycle}}.tsv",
    wildcard_constraints:
        method=methods_of_rule("cycle_frozen"),
    threads: heavy_threads()
    resources:
        mem_mb=6000,
    script:
        "../scripts/cycle.py"


rule final_weights:
    # A run's last weights, kept for runs that start from them (hard links: no extra disk).
    input:
        tracking=ancient(tracking("{experiment}")),
        model=lambda wc: f"{layout.cycle_dir(run_of(wc), run_of(wc).cycles - 1)}/model",
    params:
        code=library_code("final_weights.py"),
    output:
        directory(f"{RUN}/final/model"),
    log:
        f"{RESULTS}/logs/runs/{{experiment}}/{{method}}/{{run}}/final.log",
    benchmark:
        f"{RESULTS}/benchmarks/runs/{{experiment}}/{{method}}/{{run}}/final.tsv",
    script:
        "../scripts/final_weights.py"


rule evaluate_point:
    # val mean@k, best@k, KL to the base model and entropy of a run at one point.
    input:
        unpack(eval_inputs),
    params:
        code=library_code("evaluate_point.py"),
        task_code=task_code,
        settings=run_settings(EVALUATION_SETTINGS),
    output:
        summary=f"{RUN}/eval/{{point}}/{{task}}.json",
        samples=f"{RUN}/eval/{{point}}/{{task}}.samples.parquet",
    log:
        f"{RESULTS}/logs/runs/{{experiment}}/{{method}}/{{run}}/eval_{{point}}_{{task}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/runs/{{experiment}}/{{method}}/{{run}}/eval_{{point}}_{{task}}.tsv",
    wildcard_constraints:
        point="init|cycle[0-9]+",
    threads: heavy_threads()
    resources:
        mem_mb=6000,
    script:
        "../scripts/evaluate_point.py"


def curves_inputs(wc):
    """A curves table's evaluations, their samples and its runs' cycle records (on `tasks` only,
    for curves_on_tasks, of `methods` only too for curves_on_tasks_of_methods); an experiment
    without such runs stops the planning in one line."""
    tasks, methods = layout.table_filter(wc)
    try:
        layout.curves_runs(RUNS, wc.experiment, tasks, methods)
    except ValueError as err:
        sys.exit(str(err))
    evals = layout.experiment_eval_files(RUNS, wc.experiment, tasks=tasks, methods=methods)
    return {"evals": evals, "samples": [layout.samples_file(f) for f in evals],
            "cycles": layout.experiment_cycle_files(RUNS, wc.experiment, tasks=tasks, methods=methods)}


def curves_labels(wc):
    """What a curves table's rows say of each run beyond its files, in their order
    (layout.curves_labels)."""
    tasks, methods = layout.table_filter(wc)
    return layout.curves_labels(RUNS, wc.experiment, tasks, methods)


rule curves:
    # One tidy table per experiment: every evaluation point of every run.
    input:
        unpack(curves_inputs),
        tracking=ancient(tracking("{experiment}")),
    params:
        code=library_code("curves.py"),
        labels=curves_labels,
    output:
        f"{RESULTS}/tables/curves/{{experiment}}.parquet",
    log:
        f"{RESULTS}/logs/curves/{{experiment}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/curves/{{experiment}}.tsv",
    script:
        "../scripts/curves.py"


rule curves_on_tasks:
    # An experiment's runs on some tasks only (layout.curves_table), for a figure that plots no
    # more (Fig 8, 9: efficiency on the ceiling's or the ablations' task).
    input:
        unpack(curves_inputs),
        tracking=ancient(tracking("{experiment}")),
    params:
        code=library_code("curves.py"),
        labels=curves_labels,
    output:
        f"{RESULTS}/tables/curves/subsets/{{experiment}}.{{tasks}}.parquet",
    log:
        f"{RESULTS}/logs/curves/{{experiment}}.{{tasks}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/curves/{{experiment}}.{{tasks}}.tsv",
    wildcard_constraints:
        tasks=r"[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*",
    script:
        "../scripts/curves.py"


rule curves_on_tasks_of_methods:
    # An experiment's runs of some methods on some tasks only (layout.curves_table), for a
    # figure that plots no more (Fig 10: efficiency's RL run on the reuse experiment's task).
    input:
        unpack(curves_inputs),
        tracking=ancient(tracking("{experiment}")),
    params:
        code=library_code("curves.py"),
        labels=curves_labels,
    output:
        f"{RESULTS}/tables/curves/subsets/{{experiment}}.{{tasks}}.{{methods}}.parquet",
    log:
        f"{RESULTS}/logs/curves/{{experiment}}.{{tasks}}.{{methods}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/curves/{{experiment}}.{{tasks}}.{{methods}}.tsv",
    wildcard_constraints:
        tasks=r"[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*",
        methods=rf"({'|'.join(METHODS)})(\+({'|'.join(METHODS)}))*",
    script:
        "../scripts/curves.py"
