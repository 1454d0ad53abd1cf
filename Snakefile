# fastslow: Fast-Slow Training (FST) as a Snakemake workflow. This file only wires:
# config, schema validation (in common.smk), rule files, and the default target.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/figures.smk"


rule all:
    default_target: True
    input:
        default_targets(),
