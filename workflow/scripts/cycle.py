"""One FST cycle of one run (rules `cycle`, `cycle_distill` and `cycle_frozen`); a job given more
than one GPU runs its slow steps through `accelerate launch` (see `fastslow.cycle`)."""

from pathlib import Path

import torch

from fastslow.cycle import run_cycle
from fastslow.experiments import expand
from fastslow.fast.round import PROPOSALS_FILE
from fastslow.jobs import snakemake_job
from fastslow.launch import gpus_requested

smk = snakemake  # noqa: F821 - injected by Snakemake
wc = smk.wildcards
spec = expand(smk.config)[f"{wc.experiment}/{wc.method}/{wc.run}"]
with snakemake_job(smk, parent=wc.experiment, run=spec) as tracker:
    torch.set_num_threads(smk.threads)
    cycle = int(wc.cycle)
    prev = Path(smk.input.pool).parent if cycle > 0 else None
    out_dir = Path(smk.output.summary).parent
    # More than one GPU: the slow steps run under `accelerate launch` (fastslow.cycle docstring).
    # the job's params (code, settings): a rerun after its slow steps failed takes its finished round
    summary = run_cycle(spec, smk.config, cycle, Path(smk.input.init), prev, Path(smk.input.train),
                        out_dir, tracker=tracker, gpus=gpus_requested(smk.resources),
                        job={name: smk.params[name] for name in smk.params.keys()})
    tracker.log_artifact(smk.output.pool, "pool")
    proposals = out_dir / "fast" / PROPOSALS_FILE  # what the fast round tried (none for RL)
    if proposals.exists():
        tracker.log_artifact(proposals, "pool")
    tracker.log_table(smk.output.metrics, f"{spec.key}/cycle{cycle}/metrics")
    if "rollouts" in smk.output.keys():
        tracker.log_table(smk.output.rollouts, f"{spec.key}/cycle{cycle}/rollouts")
        tracker.log_checkpoint(smk.output.model, "weights")
    tracker.set_tags({"fastslow.task": summary["task"]})  # run and method: snakemake_job's tags
