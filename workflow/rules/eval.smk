# Evaluation of the base model: mean@k and best@k per task on the val split.


rule evaluate_base:
    input:
        tracking=ancient(tracking("foundation")),
        model=BASE_MODEL,
        problems=data_file("{task}", "val"),
    params:
        code=library_code("evaluate_base.py"),
        task_code=task_code,
        settings=job_params(config, EVALUATION_SETTINGS),
    output:
        samples=f"{RESULTS}/eval/base/{{task}}.samples.parquet",
        summary=f"{RESULTS}/eval/base/{{task}}.json",
    log:
        f"{RESULTS}/logs/evaluate_base/{{task}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/evaluate_base/{{task}}.tsv",
    threads: heavy_threads()
    resources:
        mem_mb=6000,
    script:
        "../scripts/evaluate_base.py"


rule base_eval_table:
    input:
        tracking=ancient(tracking("foundation")),
        summaries=expand(f"{RESULTS}/eval/base/{{task}}.json", task=TASKS),
    params:
        code=library_code("base_eval_table.py"),
    output:
        f"{RESULTS}/tables/base_eval.parquet",
    log:
        f"{RESULTS}/logs/base_eval_table.log",
    benchmark:
        f"{RESULTS}/benchmarks/base_eval_table.tsv",
    script:
        "../scripts/base_eval_table.py"
