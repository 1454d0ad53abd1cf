# Figures and tables: each paper figure is one target built from its experiments' curves.


def figure_options(wc):
    """What a figure draws besides its curves tables: for Fig 9, what each ablation variant
    changes (fastslow.experiments.variant_settings) against the run its default bar plots
    (efficiency's FST run), which sorts its bars into panels and labels them; for Fig 2, where each
    task's data come from (`task_sources`): its radar orders two difficulty levels from one source."""
    if wc.fig == "fig2":
        return {"task_sources": task_sources(config)}
    if wc.fig != "fig9":
        return {}
    return {"variants": variant_settings(RUNS, config, "ablations", reference=layout.fig9_default_run(RUNS))}


def figure_tables(wc):
    """The curves tables of a figure; a figure whose experiment the config drops stops the
    planning in one line (raised, Snakemake wraps it in an InputFunctionException and traceback)."""
    try:
        return layout.figure_tables(RUNS, wc.fig)
    except ValueError as err:
        sys.exit(str(err))


rule figure:
    input:
        tracking=ancient(tracking("figures")),
        tables=figure_tables,
    params:
        code=library_code("figure.py"),
        options=figure_options,
    output:
        pdf=f"{RESULTS}/figures/{{fig}}.pdf",
        png=report(f"{RESULTS}/figures/{{fig}}.png", category="Figures", caption="../report/figure.rst"),
    log:
        f"{RESULTS}/logs/figures/{{fig}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/figures/{{fig}}.tsv",
    wildcard_constraints:
        fig="|".join(FIGURE_EXPERIMENTS),
    script:
        "../scripts/figure.py"


rule claims:
    input:
        tracking=ancient(tracking("figures")),
        tables=[f"{RESULTS}/tables/curves/{e}.parquet" for e in CLAIM_EXPERIMENTS],
    params:
        code=library_code("claims.py"),
    output:
        report(f"{RESULTS}/tables/claims.csv", category="Claims", caption="../report/claims.rst"),
    log:
        f"{RESULTS}/logs/claims.log",
    benchmark:
        f"{RESULTS}/benchmarks/claims.tsv",
    script:
        "../scripts/claims.py"


rule figure_claims:
    # The claims one figure shows, from the curves it reads alone: `snakemake
    # results/tables/claims/fig7.csv` builds Fig 7's runs and judges them, and nothing else.
    input:
        tracking=ancient(tracking("figures")),
        tables=figure_tables,
    params:
        code=library_code("claims.py"),
    output:
        f"{RESULTS}/tables/claims/{{fig}}.csv",
    log:
        f"{RESULTS}/logs/claims/{{fig}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/claims/{{fig}}.tsv",
    wildcard_constraints:
        fig="|".join(CLAIM_FIGURE_NAMES),
    script:
        "../scripts/claims.py"


def pool_inputs(wc):
    """Every cycle's pool of the experiment's FST and GEPA runs. A page of an experiment without
    such runs (none of the config's, or RL-only) stops the planning in one line."""
    if wc.experiment not in POOL_EXPERIMENTS:
        sys.exit(f"reports/pools/{wc.experiment}.html: experiment {wc.experiment!r} has no FST or GEPA runs in "
                 f"the config (pool pages: {', '.join(POOL_EXPERIMENTS) or 'none'})")
    return [f"{layout.cycle_dir(s, c)}/pool.json" for s in layout.experiment_runs(RUNS, wc.experiment).values()
            if s.fast for c in range(s.cycles)]


def pool_runs(wc):
    """The runs a pool page names, and the run whose files each reads (a shared run reads another
    run's pools, so renaming its variant changed no input and the page kept the old name), in the
    page's order: the config's (sorted, a reordered experiment's page kept the old order)."""
    return [(s.key, s.source) for s in layout.experiment_runs(RUNS, wc.experiment).values() if s.fast]


rule pool_evolution:
    # Every cycle's pool of every FST/GEPA run of an experiment: its contexts, the best one's diff
    # to its parent, and what the round proposed (the cycle's fast/proposals.json).
    input:
        tracking=ancient(tracking("{experiment}")),
        pools=pool_inputs,
    params:
        code=library_code("pool_evolution.py"),
        runs=pool_runs,
    output:
        report(f"{RESULTS}/reports/pools/{{experiment}}.html", category="Context pools",
               caption="../report/pools.rst"),
    log:
        f"{RESULTS}/logs/pool_evolution/{{experiment}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/pool_evolution/{{experiment}}.tsv",
    script:
        "../scripts/pool_evolution.py"


def channel_inputs(wc):
    spec = run_of(wc)
    last = layout.cycle_dir(spec, spec.cycles - 1)
    return {"tracking": ancient(tracking(wc.experiment)), "base": BASE_MODEL, "val": data_file(wc.task, "val"),
            "pool": f"{last}/pool.json", "final": f"{layout.run_path(spec)}/final/model"}


rule channel_eval:
    # Channel decomposition: base weights + the run's final context, final weights + seed context.
    input:
        unpack(channel_inputs),
    params:
        code=library_code("channel_eval.py"),
        task_code=task_code,
        settings=run_settings(EVALUATION_SETTINGS),
    output:
        f"{RUN}/channels/{{combo}}/{{task}}.json",
    log:
        f"{RESULTS}/logs/runs/{{experiment}}/{{method}}/{{run}}/channel_{{combo}}_{{task}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/runs/{{experiment}}/{{method}}/{{run}}/channel_{{combo}}_{{task}}.tsv",
    wildcard_constraints:
        combo="base_weights_fst_context|fst_weights_seed_context",
    threads: heavy_threads()
    resources:
        mem_mb=6000,
    script:
        "../scripts/channel_eval.py"


def channel_table_inputs(wc):
    """The four evaluations of each of efficiency's FST runs. Without such runs (the table was
    an empty file, no header, which polars cannot read) the planning stops in one line."""
    if not any(s.method == "fst" for s in layout.experiment_runs(RUNS, "efficiency").values()):
        sys.exit("tables/channels.csv: experiment 'efficiency' has no FST run in the config "
                 "(the table splits an FST run's gain between its weights and its context)")
    files = {"tracking": ancient(tracking("figures"))}
    rows = []
    for spec in layout.experiment_runs(RUNS, "efficiency").values():
        if spec.method == "fst":
            task = spec.eval_tasks[0]
            rows += [layout.eval_point_file(spec, "init", task),
                     layout.eval_point_file(spec, f"cycle{spec.cycles - 1}", task),
                     f"{layout.run_path(spec)}/channels/base_weights_fst_context/{task}.json",
                     f"{layout.run_path(spec)}/channels/fst_weights_seed_context/{task}.json"]
    files["evals"] = rows
    return files


rule channels:
    # pass@1-style table: {base, FST} weights × {seed, FST} context, per efficiency task.
    input:
        unpack(channel_table_inputs),
    params:
        code=library_code("channels.py"),
    output:
        report(f"{RESULTS}/tables/channels.csv", category="Claims", caption="../report/channels.rst"),
    log:
        f"{RESULTS}/logs/channels.log",
    benchmark:
        f"{RESULTS}/benchmarks/channels.tsv",
    script:
        "../scripts/channels.py"
