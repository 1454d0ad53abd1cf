"""One cell of the channel decomposition: (base weights, FST context) or (FST weights, seed context)."""

import torch

from fastslow.config import evaluation_options, make_task
from fastslow.evaluate import evaluate_weights
from fastslow.experiments import expand
from fastslow.fast import Pool
from fastslow.io import write_json
from fastslow.jobs import snakemake_job
from fastslow.model.generation import SamplingParams
from fastslow.tasks.data import load_problems

smk = snakemake  # noqa: F821 - injected by Snakemake
wc = smk.wildcards
spec = expand(smk.config)[f"{wc.experiment}/{wc.method}/{wc.run}"]
with snakemake_job(smk, parent=wc.experiment, run=spec) as tracker:
    torch.set_num_threads(smk.threads)
    cfg = spec.settings(smk.config)
    gen, ev = cfg["generation"], cfg["evaluation"]
    if wc.combo == "base_weights_fst_context":
        weights, context = smk.input.base, Pool.from_json(smk.input.pool).entries[0].text
    else:
        weights, context = smk.input.final, cfg["seed_context"]
    problems = load_problems(smk.input.val)[: ev["max_problems"]]
    params = SamplingParams(gen["max_new_tokens"], gen["temperature"], gen["top_p"], ev["seed"])
    options = evaluation_options(cfg)
    summary, _ = evaluate_weights(weights, make_task(cfg, wc.task), problems, context, ev["k"], params,
                                  base_dir=smk.input.base, **options)
    tracker.set_tags({"fastslow.eval_dtype": options["sample_dtype"]})  # bfloat16_if_native: the machine's choice
    write_json({"run": spec.key, "combo": wc.combo, "task": wc.task, **summary}, smk.output[0])
    tracker.log_metrics({f"channels/{wc.combo}/{k}": v for k, v in summary.items() if isinstance(v, float)})
