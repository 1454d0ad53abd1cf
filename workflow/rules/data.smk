# The base model (a plain, trainable Hugging Face directory) and the task splits.


rule base_model:
    input:
        tracking=ancient(tracking("foundation")),
    output:
        directory(BASE_MODEL),
    log:
        f"{RESULTS}/logs/base_model/{MODEL}.log",
    benchmark:
        f"{RESULTS}/benchmarks/base_model/{MODEL}.tsv",
    params:
        code=library_code("base_model.py"),
        spec=config["model"]["base"],
        # a local directory's files (names, sizes, times): weights saved again in place
        # make the prepared copy out of date
        files=model_fingerprint(config["model"]["base"]),
    resources:
        mem_mb=8000,
    script:
        "../scripts/base_model.py"


rule task_data:
    input:
        tracking=ancient(tracking("foundation")),
        # a user's own task (data.files): its content (the sha256 in params), not its mtime, says
        # when the splits are out of date (Snakemake checksums only inputs under 1 MB)
        own=lambda wc: ancient(config["data"]["files"][wc.task]["path"]) if wc.task in config["data"]["files"] else [],
    params:
        code=library_code("task_data.py"),
        task_code=task_code,
        # what the splits are made from: the task's loader and its options as the job reads them
        # (a user's file, the generator's options, or the Hub dataset under `source: hf`; not the
        # settings of a source the task does not come from), the seed and the sizes
        spec=lambda wc: task_data_spec(config, wc.task),
        seed=config["data"]["seed"],
        sizes=canonical(config["data"]["sizes"]),
        own=lambda wc: own_task_params(config, wc.task),
        # the content (sha256) of each file an option names (a generator's `words_file`)
        option_files=lambda wc: option_files(config, wc.task),
    output:
        **{split: data_file("{task}", split) for split in SPLITS},
    log:
        f"{RESULTS}/logs/task_data/{{task}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/task_data/{{task}}.tsv",
    script:
        "../scripts/task_data.py"
