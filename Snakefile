# fastslow: Fast-Slow Training (FST) as a Snakemake workflow. This file only wires:
# config, schema validation (in common.smk), rule files, and the default target; and sets two
# measured planning speed-ups (garbage collection, the rule functions' stored signatures) and one
# fix of Snakemake's scheduler (its wake-ups).
import gc
import inspect

from snakemake.utils import min_version

# the pinned minor (pyproject, environment.yml); early 9.x read a profile's config.yaml only, not profile.yaml
min_version("9.27")

# Planning allocates millions of objects (~2100 jobs at paper scale) that all live until the plan
# is done, and CPython's cyclic GC re-walked them, and Snakemake's own modules, every 700
# allocations: 0.9 s of `snakemake -n`'s 10 s (bench/HISTORY.md). What is loaded so far is never
# garbage (freeze: no collection walks it again), and the young generation is collected less
# often. Script jobs run in their own Python processes, untouched; Snakemake's own processes (the
# main one, which the profiles' force-use-threads has run the local `run:` rules too, and the
# one it starts per job) only collect less often.
gc.freeze()
gc.set_threshold(10_000, 10, 10)

# Snakemake's scheduler starts a wake-up timer on every pass of its loop, and every finished job
# starts one more chain of them: after N jobs it passes N times a second, each pass stat-ing the
# inputs of every job that waits for cores. One timer pending at a time (fastslow.scheduling):
# 531-539 passes instead of 14,000-25,000 in the every-figure smoke DAG (bench/HISTORY.md).
from fastslow.scheduling import one_pending_wakeup

one_pending_wakeup()


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/figures.smk"

# Snakemake reads the signature of every input, params and resources function for each job:
# 27,000 reads at paper scale, 16,557 of them of the functions of these rule files. A stored
# __signature__ (inspect's protocol) makes each read of our named functions a lookup (the few
# lambdas stay inspected), as run_settings does for the functions it makes: 0.06 s instead of
# 0.25 s of `snakemake -n`'s ~9-10 s (bench/measured/signature_reads_s53.txt).
for _function in list(globals().values()):
    if inspect.isfunction(_function) and _function.__code__.co_filename.endswith(".smk"):
        _function.__signature__ = inspect.signature(_function)


rule all:
    default_target: True
    input:
        default_targets(),
