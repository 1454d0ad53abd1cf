"""Configuration: JSON-schema validation with defaults, cross-field checks, one-line errors.

The schema (`config.schema.yaml`, beside this module) is the single source of truth for keys, types
and defaults. `validate_config` fills defaults in place and raises `ConfigError` whose message is
one line naming the key and what is expected, e.g.::

    config error: slow.num_generations: expected an integer >= 2, got -3

Nested values given with Snakemake's `--config` are read back as YAML (`command_line`, see
`_from_command_line`), so `--config slow='{num_generations: 8}'` sets an integer, as a config
file does. A number YAML 1.1 (PyYAML) reads as text (`lr: 1e-5`: an exponent without a dot) is a
number wherever the schema takes one and no text (`_normalise_numbers`), and an integer written
where the schema takes a number but no integer is that float (`temperature: 1` is 1.0, so it
names the same params as the default); a number must be finite, an integer must be an int (not `8.0`).
"""

from __future__ import annotations

import copy
import functools
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from fastslow.io import read_yaml

#: The config schema, package data beside this module: found wherever fastslow is installed
#: (in place, from a wheel, or imported from the checkout's src/).
SCHEMA_PATH = Path(__file__).resolve().with_name("config.schema.yaml")


def schema_path() -> Path:
    """The config schema's file (`SCHEMA_PATH`); a one-line error when an install lost it."""
    if not SCHEMA_PATH.is_file():
        raise FileNotFoundError(f"no config schema at {SCHEMA_PATH}: this fastslow install lacks its package "
                                f"data; reinstall it (pip install -e . in the checkout)")
    return SCHEMA_PATH


class ConfigError(ValueError):
    """A configuration value is wrong; the message is one line naming the key."""


#: The lowest sampling temperature but 0 (greedy). Below it sampling is greedy in all but name, and
#: near 1e-38 the logits divided by it overflow: every token's probability is NaN, the same token is
#: drawn each time and every reward is silently 0.
MIN_TEMPERATURE = 1e-3


def is_number(value: Any) -> bool:
    """An int or float, not a bool (and not text: YAML 1.1 reads `1e-6` as a string)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


#: A float literal with an exponent, which YAML 1.2 and Python's float() read as a number but YAML
#: 1.1 (PyYAML) as text when it has no dot or no exponent sign (`1e-5`, `1.5E3`). Nobody quotes one
#: to mean text at a number's key.
_YAML11_TEXT_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def number_from_text(value: Any) -> Any:
    """`value` as a float if it is text YAML 1.1 left a number (`'1e-5'`, see _YAML11_TEXT_NUMBER),
    else `value` unchanged (a quoted `"8"`, `'nan'` or `'inf'` stay text, so stay an error)."""
    if isinstance(value, str) and _YAML11_TEXT_NUMBER.fullmatch(value.strip()):
        return float(value)
    return value


def load_schema(path: str | Path | None = None) -> dict[str, Any]:
    """The config schema (a fresh copy: callers may not share mutations)."""
    return copy.deepcopy(_parsed_schema(str(path or schema_path())))


@functools.lru_cache(maxsize=4)
def _parsed_schema(path: str) -> dict[str, Any]:
    # Parsed once per process: validation runs once per run settings an experiment's overrides make.
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _key(path: Any) -> str:
    parts = [str(p) if not isinstance(p, int) else f"[{p}]" for p in path]
    return ".".join(parts).replace(".[", "[") or "<top level>"


def _expected(error: Any) -> str:
    """A short human phrase for what the schema expected at the failing key."""
    v, kw, schema = error.validator_value, error.validator, error.schema
    if kw == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
        return f"unknown key {', '.join(map(repr, extra))}; expected one of {', '.join(allowed)}"
    if kw == "enum":
        return f"expected one of {', '.join(map(repr, v))}, got {error.instance!r}"
    if kw == "type" and "number" in _types(schema) and isinstance(error.instance, float) \
            and not math.isfinite(error.instance):
        return f"expected a finite number, got {error.instance!r}"
    if kw == "type":  # `type: [number, "null"]`: "a number or null"
        kinds = " or ".join(k if k == "null" else f"{'an' if k[0] in 'aeiou' else 'a'} {k}"
                            for k in _types(schema))
        return f"expected {kinds}, got {type(error.instance).__name__} {error.instance!r}"
    if kw in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        op = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[kw]
        kind = "an integer" if "integer" in _types(schema) else "a number"
        return f"expected {kind} {op} {v}{' or null' if 'null' in _types(schema) else ''}, got {error.instance!r}"
    if kw == "minItems":
        return f"expected a list with at least {v} item(s), got {error.instance!r}"
    if kw == "minLength":
        return f"expected a non-empty string, got {error.instance!r}"
    if kw == "maxLength":
        return f"expected at most {v} characters, got {len(error.instance)} ({error.instance[:40]!r}...)"
    if kw == "required":
        return f"missing required key; {error.message}"
    if kw == "pattern" and v == "^[A-Za-z0-9_]+$":
        return f"names use letters, digits and '_' only, got {error.instance!r}"
    if kw == "pattern" and v == "^https?://":
        return f"expected an http:// or https:// URL (e.g. http://localhost:8000/v1), got {error.instance!r}"
    return error.message


def _fill_defaults(instance: Any, schema: Mapping[str, Any]) -> None:
    """Fill `default`s of object properties recursively (before validation, like snakemake)."""
    if not isinstance(instance, dict):
        return
    for name, sub in schema.get("properties", {}).items():
        if name not in instance and "default" in sub:
            instance[name] = copy.deepcopy(sub["default"])
        if name in instance:
            _fill_defaults(instance[name], sub)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for name, value in instance.items():
            if name not in schema.get("properties", {}):
                _fill_defaults(value, extra)


def validate_config(config: dict[str, Any], schema: Mapping[str, Any] | None = None,
                    command_line: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Fill defaults into `config` (in place), validate it, and return it. `command_line`: the
    run's `--config` entries as Snakemake parsed them (`workflow.config_settings.config`), whose
    nested values arrive as text."""
    schema = schema or load_schema()
    if not isinstance(config, dict):
        raise ConfigError(f"config error: expected a mapping at the top level, got {type(config).__name__}")
    if command_line:
        _from_command_line(config, command_line, schema)
    experiments = config.get("experiments")
    if isinstance(experiments, dict):  # an overlay drops an experiment with `name: null`
        for name in [n for n, v in experiments.items() if v is None]:
            del experiments[name]
    _fill_defaults(config, schema)
    _normalise_numbers(config, schema)  # after the defaults: a schema default of 60 is 60.0 too
    validator = _validator_class()(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: (len(e.absolute_path), _key(e.absolute_path)))
    if errors:
        err = errors[0]
        raise ConfigError(f"config error: {_key(err.absolute_path)}: {_expected(err)}")
    _check_semantics(config)
    return config


@functools.lru_cache(maxsize=1)
def _validator_class() -> Any:
    """Draft 2020-12 whose "number" is finite (nan and inf fail in the config check, not in a
    job) and whose "integer" is an int (jsonschema takes 8.0; the slow loop does not)."""
    import jsonschema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine_many({
        "number": lambda _, v: is_number(v) and math.isfinite(v),
        "integer": lambda _, v: isinstance(v, int) and not isinstance(v, bool)})
    return jsonschema.validators.extend(base, type_checker=checker)


def _normalise_numbers(config: dict[str, Any], schema: Mapping[str, Any]) -> None:
    """Make a number of each text YAML 1.1 left one (`lr: 1e-5`, see `number_from_text`), in place,
    at a key whose schema takes a number and no text (not at an integer-only key: YAML 1.2 reads 1e3
    as a float too), and a float of each integer at a key that takes a number but no integer
    (`temperature: 1` is the default's 1.0: Snakemake compares params by their repr, so the int
    would rerun every job that carries the key): the config's own keys and each experiment's
    `overrides` and `variants`, whose sections are the config's."""

    def walk(node: Any, sub: Mapping[str, Any] | None) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in list(items):
            at = _schema_at(sub, (key,))
            if isinstance(value, (dict, list)):
                walk(value, at)
            elif isinstance(value, str) and "number" in _types(at) and not _takes_text(at, value):
                node[key] = number_from_text(value)
            elif type(value) is int and "number" in _types(at) and "integer" not in _types(at):
                node[key] = float(value)

    walk(config, schema)
    experiments = config.get("experiments")
    for exp in experiments.values() if isinstance(experiments, dict) else ():
        if not isinstance(exp, dict):
            continue
        variants = exp.get("variants")
        for block in [exp.get("overrides"), *(variants.values() if isinstance(variants, dict) else ())]:
            if isinstance(block, dict):
                walk(block, schema)


def _schema_at(schema: Mapping[str, Any] | None, path: Sequence[Any]) -> Mapping[str, Any] | None:
    """The sub-schema at `path` (keys and list indices); None where the schema does not say."""
    for part in path:
        if not isinstance(schema, Mapping):
            return None
        if isinstance(part, int):
            schema = schema.get("items")
        elif part in schema.get("properties", {}):
            schema = schema["properties"][part]
        else:
            extra = schema.get("additionalProperties")
            schema = extra if isinstance(extra, Mapping) else None
    return schema


def _types(schema: Mapping[str, Any] | None) -> list[str]:
    """The JSON types the schema at a key names (`type: number` or `type: [number, "null"]`)."""
    kinds = schema.get("type") if isinstance(schema, Mapping) else None
    return [kinds] if isinstance(kinds, str) else list(kinds or [])


def _takes_text(schema: Mapping[str, Any] | None, value: str) -> bool:
    """Whether the schema at a key takes `value` as the string it is (a string key, an enum entry)."""
    if not isinstance(schema, Mapping):
        return False
    return "string" in _types(schema) or value in schema.get("enum", [])


def _from_command_line(config: dict[str, Any], given: Mapping[str, Any], schema: Mapping[str, Any]) -> None:
    """Read back as YAML the nested values Snakemake's `--config` gave as text.

    Snakemake parses `--config key=value` itself: a top-level value becomes an int, float, bool or
    string, but a nested one (`slow='{num_generations: 8}'`) goes through YAML's BaseLoader, which
    makes every scalar a string ('8'), so the schema would reject every number and flag given this
    way. Such a string is parsed as YAML where the schema does not take it as text alone (a name,
    a prompt, an enum's 'auto' stay as written; a filter's `3` is the int a file's `3` is); only
    values that came from the command line are touched, so a config file's `num_generations: "8"`
    is still an error. A top-level `key=` arrives as None (Snakemake's reading of an empty value):
    it is the empty string again where the schema takes text and no null (`seed_context=''` is
    then named as the empty string it is)."""

    def parse(path: tuple[Any, ...], value: Any) -> Any:
        if isinstance(value, str):
            at = _schema_at(schema, path)
            # text only where the key takes text and no other scalar: at a filter's values (text,
            # numbers or flags) a file's unquoted `3` is the int 3, and so is the command line's
            if _takes_text(at, value) and not {"integer", "number", "boolean"} & set(_types(at)):
                return value
            try:
                return yaml.safe_load(value)
            except yaml.YAMLError:
                return value
        if isinstance(value, list):
            return [parse((*path, i), v) for i, v in enumerate(value)]
        if isinstance(value, Mapping):
            return {k: parse((*path, k), v) for k, v in value.items()}
        return value

    def walk(node: dict[str, Any], cli: Mapping[str, Any], path: tuple[Any, ...]) -> None:
        for key, value in cli.items():
            if key not in node:
                continue
            at = _schema_at(schema, (*path, key))
            if not path and value is None and node[key] is None and _takes_text(at, "") and "null" not in _types(at):
                node[key] = ""  # `key=`: Snakemake's None for the empty text given
                continue
            if isinstance(value, Mapping) and isinstance(node[key], dict):
                walk(node[key], value, (*path, key))
            elif path and isinstance(value, (str, list)) and node[key] == value:
                node[key] = parse((*path, key), value)  # nested: only those went through BaseLoader

    walk(config, given, ())


def prompt_template_error(template: Any) -> str | None:
    """What is wrong with a `fast.reflection.prompt_template` (None: nothing, or no template):
    it must be a string with gepa's placeholders, or every reflection call would fail."""
    if template is None:
        return None
    if not isinstance(template, str):
        return ("fast.reflection.prompt_template: expected a string with the placeholders <curr_param> "
                f"and <side_info>, got {type(template).__name__}")
    from gepa.strategies.instruction_proposal import InstructionProposalSignature

    try:
        InstructionProposalSignature.validate_prompt_template(template)
    except ValueError as err:
        return f"fast.reflection.prompt_template: {err}"
    return None


#: `apply_chat_template`'s own arguments (transformers 5.x; `tests/test_config.py` reads them from
#: the installed version) and the variables its template is rendered with: a
#: `model.chat_template_kwargs` key among them fails every rendering ("got multiple values").
CHAT_TEMPLATE_RESERVED = frozenset({
    "conversation", "tools", "documents", "chat_template", "add_generation_prompt", "continue_final_message",
    "tokenize", "sanitize_control_tokens", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "messages"})


def _check_chat_template_kwargs(config: Mapping[str, Any]) -> None:
    """model.chat_template_kwargs: template variables, by name (YAML's `{1: x}` or `{yes: x}` give
    a number or a bool as the name), none that rendering sets itself."""
    kwargs = config["model"].get("chat_template_kwargs") or {}
    for key in kwargs:
        if not isinstance(key, str):
            raise ConfigError(f"config error: model.chat_template_kwargs: expected template variable names, got "
                              f"the {type(key).__name__} {key!r} (quote it in YAML)")
        if key in CHAT_TEMPLATE_RESERVED:
            raise ConfigError(f"config error: model.chat_template_kwargs.{key}: set by every rendering itself "
                              f"(the workflow renders prompts with add_generation_prompt and without tokenizing); "
                              f"name only the template's own variables, e.g. enable_thinking")


def _check_temperature(key: str, value: float, where: str = "") -> None:
    """A sampling temperature: 0 (greedy) or at least MIN_TEMPERATURE (the schema's minimum is 0)."""
    if 0 < value < MIN_TEMPERATURE:
        raise ConfigError(f"config error: {key}: expected 0 (greedy) or a number >= {MIN_TEMPERATURE}{where}, "
                          f"got {value!r}")


def _check_semantics(config: dict[str, Any]) -> None:
    """Cross-field rules a JSON schema cannot state."""
    if not config["seed_context"].strip():
        raise ConfigError(f"config error: seed_context: must be a non-empty string, got {config['seed_context']!r}")
    if not config["mlflow_experiment"].strip():
        raise ConfigError(f"config error: mlflow_experiment: must name an MLflow experiment, got "
                          f"{config['mlflow_experiment']!r}")
    _check_model_name(config)
    _check_chat_template_kwargs(config)
    _check_temperature("generation.temperature", config["generation"]["temperature"])
    slow, fast = config["slow"], config["fast"]
    k, g = fast["pool_size"], slow["num_generations"]
    if g % k:
        raise ConfigError(
            f"config error: fast.pool_size: K={k} must divide slow.num_generations G={g} "
            f"(each problem's G rollouts are spread evenly over the K contexts)"
        )
    _check_slow_batches(slow, k)
    # slow.steps_per_generation has no schema default: left out, SlowConfig's 1 (a literal, as above)
    if slow.get("steps_per_generation", 1) > 1 and slow["use_vllm"]:
        raise ConfigError(f"config error: slow.steps_per_generation: {slow['steps_per_generation']} samples "
                          f"ahead with transformers' generate on the training weights; with slow.use_vllm "
                          f"each step samples with vLLM: set it to 1")
    if fast.get("reuse_rollouts"):
        _check_reuse_sampling(config, "reuse_rollouts", "the round scores its seeds on the RL steps' rollouts "
                                                        "and its children on its own samples")
    if fast.get("reuse_in_slow"):
        _check_reuse_in_slow(config)
    if fast["proposer"] == "reflective":
        refl = fast["reflection"]
        need = {"openai": ("base_url", "model"), "litellm": ("model",), "hf": ("path",)}[refl["kind"]]
        for key in need:
            if not refl.get(key):
                raise ConfigError(
                    f"config error: fast.reflection.{key}: required for reflection kind {refl['kind']!r}"
                )
        # a key the kind never reads was silently dropped (an hf model's base_url, an endpoint's path)
        readers = {"base_url": ("openai", "litellm"), "api_key_env": ("openai", "litellm"),
                   "model": ("openai", "litellm"), "path": ("hf",), "chat_template_kwargs": ("openai", "hf")}
        for key, kinds in readers.items():
            if key in refl and refl["kind"] not in kinds:
                raise ConfigError(f"config error: fast.reflection.{key}: {refl[key]!r} is not read by reflection "
                                  f"kind {refl['kind']!r} ({' and '.join(kinds)} only); remove it")
        problem = prompt_template_error(refl.get("prompt_template"))
        if problem:
            raise ConfigError(f"config error: {problem}")
        if refl["kind"] == "hf":
            _check_reflection_path(config, refl["path"])
            # it samples here, as generation does
            _check_temperature("fast.reflection.temperature", refl["temperature"], " for reflection kind 'hf'")
    from fastslow.model.convert import base_model_error

    problem = base_model_error(config["model"]["base"])
    if problem:
        raise ConfigError(f"config error: model.base: {problem}")
    config["model"]["base"] = canonical_model_base(config["model"]["base"])
    from fastslow.experiments import case_twin, check_experiments
    from fastslow.tasks.loaders import FILE_SUFFIXES, FILE_TYPES

    files = config["data"].get("files", {})
    for name, entry in files.items():
        entry["path"] = os.path.expanduser(entry["path"])  # `~/mine.jsonl`, as model.base reads it
        try:
            found = Path(entry["path"]).is_file()
        except OSError as err:  # a path the file system refuses (a name over 255 bytes)
            raise ConfigError(f"config error: data.files.{name}.path: {entry['path']!r}: {err.strerror or err}") from None
        if not found:
            raise ConfigError(f"config error: data.files.{name}.path: no such file {entry['path']!r} "
                              f"(relative paths are from the working directory {os.getcwd()})")
        if Path(entry["path"]).suffix.lower() not in FILE_SUFFIXES:
            raise ConfigError(f"config error: data.files.{name}.path: expected a {FILE_TYPES} file, "
                              f"got {entry['path']!r}")
        if entry.get("labels") and entry.get("scorer", "exact") != "label":
            raise ConfigError(f"config error: data.files.{name}.labels: only for scorer 'label', "
                              f"got scorer {entry.get('scorer', 'exact')!r}")
    known = known_tasks(config["data"])
    twin = case_twin(known)
    if twin:
        section = "files" if twin[1] in files else "hf_datasets"
        raise ConfigError(f"config error: data.{section}.{twin[1]}: differs from task {twin[0]!r} only in case, "
                          f"and both would write results/data/{twin[0]}/ on a case-insensitive file system "
                          f"(macOS's); rename it")
    for i, name in enumerate(config["data"]["tasks"]):
        if name not in known:
            raise ConfigError(f"config error: data.tasks[{i}]: {unknown_task(config['data'], name)}")
    _check_task_options(config["data"])
    _check_hf_datasets(config["data"].get("hf_datasets", {}))
    check_experiments(config)


def known_tasks(data: Mapping[str, Any]) -> tuple[str, ...]:
    """The task names this `data` section can build (`task_spec`): the registered generators,
    the user's files (data.files) and, under `source: hf` only, the data.hf_datasets entries."""
    from fastslow.tasks import TASK_NAMES

    hf = data.get("hf_datasets", {}) if data["source"] == "hf" else {}
    return tuple(dict.fromkeys((*TASK_NAMES, *data.get("files", {}), *hf)))


def unknown_task(data: Mapping[str, Any], name: str) -> str:
    """The error text for a task name outside `known_tasks(data)`."""
    hint = (f" (data.hf_datasets.{name} is read under data.source 'hf' only, this config's is "
            f"{data['source']!r})" if name in data.get("hf_datasets", {}) else "")
    return f"unknown task {name!r}; expected one of {', '.join(known_tasks(data))}{hint}"


def micro_batch_fits(rows: int, micro: Any) -> bool:
    """The slow loop's micro-batch rule: `slow.micro_batch_size` is None (the whole step at once)
    or a divisor of the `rows` = P*G rollouts of a step. `SlowConfig` and the config check both
    apply it (the config may not import the slow loop, whose package pulls in the trainer)."""
    return micro is None or (micro >= 1 and rows % micro == 0)


def prompt_groups_fit(baseline: str, num_generations: int, contexts: int) -> bool:
    """The slow loop's baseline rule: the 'prompt' baseline groups a problem's G rollouts by their
    K contexts, so each group needs G/K >= 2 rollouts to have an advantage ('problem' has G)."""
    return baseline != "prompt" or num_generations // contexts >= 2


def _check_slow_batches(slow: Mapping[str, Any], k: int) -> None:
    """The slow loop's batch rules (`micro_batch_fits`, `prompt_groups_fit`, as `SlowConfig` and
    `SlowConfig.check_pool` apply them) with K = fast.pool_size, before any job."""
    rows, micro = slow["problems_per_step"] * slow["num_generations"], slow.get("micro_batch_size")
    if not micro_batch_fits(rows, micro):
        divisors = [d for d in range(1, rows + 1) if rows % d == 0]
        raise ConfigError(f"config error: slow.micro_batch_size: expected null or a divisor of P*G = {rows} "
                          f"(slow.problems_per_step x slow.num_generations; one of {divisors}), got {micro!r}")
    g = slow["num_generations"]
    if not prompt_groups_fit(slow["baseline"], g, k):
        raise ConfigError(f"config error: slow.baseline: 'prompt' with G={g}, K={k} (fast.pool_size) gives "
                          f"groups of one rollout (no advantage); use baseline 'problem' or "
                          f"fast.pool_size <= {g // 2}")


def round_minimum(contexts: int, val_problems: int, minibatch_size: int) -> int:
    """Metric calls one fast round needs at least (`fastslow.fast.round.run_round` refuses a
    smaller budget): its `contexts` distinct seed contexts on the `val_problems` validation
    problems, and one iteration at worst, a parent and its child on a minibatch of
    `minibatch_size` train problems and the child on the validation set."""
    return contexts * val_problems + 2 * minibatch_size + val_problems


#: The fewest train problems a fast round can run on (`fastslow.cycle.gepa_split` cuts them into
#: its minibatch problems and its validation problems, both non-empty).
FAST_MIN_TRAIN = 2


def fast_budget_error(settings: Mapping[str, Any], cycles: int) -> str | None:
    """What is wrong with the fast-round budget of a run with these effective settings and
    `cycles` cycles (None: nothing): the budget of its preset (fast.preset) must cover a round's
    minimum (`round_minimum`) with as many distinct contexts as its pool can hold, K
    (fast.pool_size), from the second cycle on (the first round starts from the seed context
    alone). The validation set and the minibatch are cut to the train split (data.sizes.train,
    an upper bound) as the cycle cuts them (`fastslow.cycle.gepa_split`), which needs two train
    problems at least: one to validate on and one for the minibatches."""
    fast, train = settings["fast"], settings["data"]["sizes"]["train"]
    if train < FAST_MIN_TRAIN:
        return (f"data.sizes.train: expected an integer >= {FAST_MIN_TRAIN} with a fast method (a fast "
                f"round validates on some train problems and reflects on the others), got {train}")
    contexts = fast["pool_size"] if cycles > 1 else 1
    val = min(fast["val_problems"], max(1, train // 2))
    minibatch = min(fast["minibatch_size"], train - val)
    need = round_minimum(contexts, val, minibatch)
    preset = fast["preset"]
    budget = fast["max_metric_calls"][preset]
    if budget >= need:
        return None
    lower = "fast.val_problems / fast.minibatch_size" + (" / fast.pool_size" if contexts > 1 else "")
    # a value the train split cuts is shown as set and as used: "250 fast.minibatch_size" alone,
    # for a minibatch_size of 1000, named no value the config holds
    val_text = (f"{val} fast.val_problems" if val == fast["val_problems"] else
                f"{val} fast.val_problems (set {fast['val_problems']}, cut to half the {train} train problems)")
    mb_text = (f"{minibatch} fast.minibatch_size" if minibatch == fast["minibatch_size"] else
               f"{minibatch} fast.minibatch_size (set {fast['minibatch_size']}, cut to the {train} train "
               f"problems less the {val} validation ones)")
    return (f"fast.max_metric_calls.{preset}: {budget} is below a round's minimum {need} with K={contexts} "
            f"distinct context{'s' if contexts > 1 else ''} ({contexts} x {val_text} + 2 x "
            f"{mb_text} + {val} fast.val_problems); raise it or lower {lower}")


def _check_reflection_path(config: Mapping[str, Any], path: str) -> None:
    """fast.reflection.path of an `hf` reflection model: a hub id, or a local directory that
    exists (what `fastslow.model.convert._local_dir` takes as local, where the round loads it) or
    that the workflow builds before any cycle: the base model's, results/models/<model name>."""
    from fastslow.layout import RESULTS
    from fastslow.model.convert import _local_dir

    built = Path(os.path.abspath(Path(RESULTS) / "models" / model_name(config)))
    if Path(os.path.abspath(os.path.expanduser(path))) == built:
        return
    from fastslow.model.convert import model_dir_error

    try:
        local = _local_dir(path, "model")
    except OSError as err:
        raise ConfigError(f"config error: fast.reflection.path: {err} (a local model directory, "
                          f"relative to the working directory {os.getcwd()}, or a hub id like "
                          f"'org/name')") from None
    problem = model_dir_error(local) if local is not None else None
    if problem:  # found only after the round, which every reflection call failed
        raise ConfigError(f"config error: fast.reflection.path: {problem}")


def reflection_model(config: Mapping[str, Any], reflection: Mapping[str, Any] | None) -> dict[str, str]:
    """What makes a reflective cycle out of date when its `hf` reflection model changes (the
    cycle's `fast.reflection`, None where its proposer reads none): {"input": the directory} for
    one under results/ (the base model's, or another run's weights), which the workflow builds (a
    rebuild reruns the cycle, after it); {"files": a digest of its files' names, sizes and times}
    for another local directory, a param, so weights saved again in place rerun it, as the base
    model's `model_fingerprint` does for it; {} for a hub id (whose content a pinned revision
    fixes) or another kind. The path alone was the param."""
    if not isinstance(reflection, Mapping) or reflection.get("kind") != "hf" or not reflection.get("path"):
        return {}
    from fastslow.io import tree_fingerprint
    from fastslow.layout import RESULTS
    from fastslow.model.convert import _looks_local

    path = str(reflection["path"])
    where = Path(os.path.abspath(os.path.expanduser(path)))
    if where.is_relative_to(os.path.abspath(RESULTS)):  # as its producer's output names it
        return {"input": os.path.relpath(where)}
    local = Path(path).expanduser()
    if not _looks_local(path) or not local.is_dir():  # a hub id (a missing local path fails validation)
        return {}
    return {"files": tree_fingerprint(local)}


def _check_model_name(config: Mapping[str, Any]) -> None:
    """model.name, or the name model.base gives: a directory name under results/models/."""
    given = config["model"].get("name")
    if given in (".", ".."):
        raise ConfigError(f"config error: model.name: expected a directory name under results/models/, "
                          f"not '.' or '..', got {given!r}")
    derived = model_name(config)
    if derived in ("", ".", ".."):
        raise ConfigError(f"config error: model.base: names no directory under results/models/ "
                          f"(set model.name), got {config['model']['base']!r}")
    name_pattern = _parsed_schema(str(schema_path()))["properties"]["model"]["properties"]["name"]["pattern"]
    if not given and not re.fullmatch(name_pattern, derived):
        # model.name's own pattern, from the schema; a brace in a path broke planning with a traceback
        raise ConfigError(f"config error: model.base: the directory name it gives, {derived!r}, has characters "
                          f"other than letters, digits, '.', '_' and '-': set model.name, got "
                          f"{config['model']['base']!r}")


def _check_hf_datasets(entries: Mapping[str, Any]) -> None:
    """data.hf_datasets: each entry names a dataset (`path`) or a known `preset`."""
    from fastslow.tasks.loaders import HF_PRESETS

    for name, entry in entries.items():
        preset = entry.get("preset")
        if preset is not None and preset not in HF_PRESETS:
            raise ConfigError(f"config error: data.hf_datasets.{name}.preset: unknown preset {preset!r}; "
                              f"expected one of {', '.join(sorted(HF_PRESETS))}")
        if preset is None and not entry.get("path"):
            raise ConfigError(f"config error: data.hf_datasets.{name}: missing required key 'path' (a dataset "
                              f"id) or 'preset' (one of {', '.join(sorted(HF_PRESETS))})")


def _check_reuse_sampling(config: dict[str, Any], option: str, why: str) -> None:
    """fast.`option` hands one loop's samples to the other, so both must sample alike: the
    round's (generation.*) and the RL steps' (slow.*) lengths, temperature and top_p."""
    gen, slow = config["generation"], config["slow"]
    # slow.top_p has no schema default: left out, the RL rollouts sample with SlowConfig's, 1.0
    # (a literal: importing fastslow.slow here would make every script that validates a config,
    # the figures' too, reach the trainer's code; tests/test_config.py checks the two agree)
    for key, slow_value in (("max_new_tokens", slow["max_new_tokens"]), ("temperature", slow["temperature"]),
                            ("top_p", slow.get("top_p", 1.0))):
        if gen[key] != slow_value:
            greedy = (f"; RL steps cannot sample greedily: turn fast.{option} off for a greedy round"
                      if key == "temperature" and gen[key] == 0 else "")
            raise ConfigError(f"config error: fast.{option}: generation.{key}={gen[key]!r} must equal "
                              f"the slow loop's {key} {slow_value!r} ({why}){greedy}")


def _check_reuse_in_slow(config: dict[str, Any]) -> None:
    """fast.reuse_in_slow: the RL step trains on the fast round's samples, so both must sample
    alike (see slow.trainer for how they enter TRL's generation)."""
    _check_reuse_sampling(config, "reuse_in_slow", "the RL step trains on the fast round's samples")
    slow = config["slow"]
    # fast.reuse_steps has no schema default: left out, FastConfig's 1 (a literal, for the reason above).
    # More than the cycle's T serves all T (an experiment may shorten T under a global reuse_steps).
    fast = config["fast"]
    steps = min(fast.get("reuse_steps", 1), slow["steps_per_cycle"])
    # (one step whose problems outnumber the validation set is served in part, as before this key)
    if steps > 1 and steps * slow["problems_per_step"] > fast["val_problems"]:
        raise ConfigError(f"config error: fast.reuse_steps: {steps} steps x slow.problems_per_step="
                          f"{slow['problems_per_step']} problems must fit in the round's validation set "
                          f"(fast.val_problems={fast['val_problems']}): lower fast.reuse_steps to at most "
                          f"{max(1, fast['val_problems'] // slow['problems_per_step'])} or raise fast.val_problems")


def _check_task_options(data: Mapping[str, Any]) -> None:
    """data.options: known tasks, only options their generator's constructor takes, each of its
    default's kind, and values the generator accepts (it is built once with them here, so a bad
    value stops the config, not the task_data job)."""
    import inspect

    from fastslow.tasks import TASK_NAMES, get_task, task_class

    for name, opts in data["options"].items():
        if name not in TASK_NAMES:
            if name in data.get("files", {}):
                raise ConfigError(f"config error: data.options.{name}: {name!r} is a data.files task; "
                                  f"data.options is for the offline generators ({', '.join(TASK_NAMES)}); "
                                  f"set its scorer and labels under data.files.{name}")
            raise ConfigError(f"config error: data.options.{name}: unknown task {name!r}; "
                              f"expected one of {', '.join(TASK_NAMES)}")
        params = inspect.signature(task_class(name).__init__).parameters
        allowed = sorted(p for p, v in params.items() if p not in ("self", "name", "difficulty")
                         and v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD))
        for key, value in list(opts.items()):
            if key not in allowed:
                raise ConfigError(f"config error: data.options.{name}.{key}: unknown option; "
                                  f"expected one of {', '.join(allowed) or '(none)'}")
            opts[key] = _check_option_type(f"data.options.{name}.{key}", value, params[key].default)
        try:
            get_task(name, **copy.deepcopy(dict(opts)))
        except ValueError as exc:
            raise ConfigError(f"config error: {_option_error(name, opts, str(exc))}") from None
        except Exception as exc:  # e.g. a file an option names, missing; a task of your own's bug
            raise ConfigError(f"config error: data.options.{name}: building the task failed "
                              f"({type(exc).__name__}: {' '.join(str(exc).split())})") from None
    # every other registered task once too (milliseconds): a registry entry naming a module or
    # class that is not there, or a constructor that fails, stops here in one line naming it,
    # not in a task_data job's traceback
    for name in TASK_NAMES:
        if name in data["options"]:
            continue
        try:
            get_task(name)
        except Exception as exc:
            raise ConfigError(f"config error: task {name!r} (_FAMILIES in src/fastslow/tasks/__init__.py): "
                              f"building it failed ({type(exc).__name__}: {' '.join(str(exc).split())})") from None


def _option_error(name: str, opts: Mapping[str, Any], message: str) -> str:
    """A generator's error for data.options.`name`, led by the option's key when it names one
    ("physics: rel_tol: expected ..." -> "data.options.physics.rel_tol: expected ...")."""
    text = " ".join(message.split())
    head, sep, rest = text.partition(": ")
    if sep and (head == name or name.startswith(head + "_")):
        text = rest
    key, sep, rest = text.partition(": ")
    if sep and key in opts:
        return f"data.options.{name}.{key}: {rest}"
    return f"data.options.{name}: {text}"


def _check_option_type(key: str, value: Any, default: Any) -> Any:
    """A task option must have its default's kind (flag, integer, number, text, list); options
    without a default, or defaulting to None, take anything their generator accepts. Returns the
    value, a number if it is text YAML 1.1 left one at a number's option (`rel_tol: 1e-3`)."""
    import inspect

    if default is None or default is inspect.Parameter.empty:
        return value
    if isinstance(default, float):
        value = number_from_text(value)
    number = is_number(value)
    if isinstance(default, bool):
        ok, kind = isinstance(value, bool), "true or false"
    elif isinstance(default, int):
        ok, kind = number and isinstance(value, int), "an integer"
    elif isinstance(default, float):
        ok, kind = number, "a number"
    elif isinstance(default, str):
        ok, kind = isinstance(value, str), "a string"
    elif isinstance(default, (list, tuple)):
        ok, kind = isinstance(value, (list, tuple)), "a list"
    else:
        return value
    if not ok:
        raise ConfigError(f"config error: {key}: expected {kind}, got {type(value).__name__} {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config error: {key}: expected a finite number, got {value!r}")
    return value


def load_config(*paths: str | Path, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Merge YAML files left to right (later wins, nested), apply overrides, validate."""
    merged: dict[str, Any] = {}
    for p in paths:
        try:
            loaded = read_yaml(p)
        except ValueError as err:  # one line naming the file (and the line)
            raise ConfigError(f"config error: {err}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config error: {p}: expected a mapping at the top level, got {type(loaded).__name__}")
        deep_update(merged, loaded or {})
    if overrides:
        deep_update(merged, dict(overrides))
    return validate_config(merged)


def deep_update(base: dict[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    for k, v in new.items():
        if isinstance(v, Mapping) and isinstance(base.get(k), dict):
            deep_update(base[k], v)
        else:
            base[k] = copy.deepcopy(v)
    return base


def canonical_model_base(base: str) -> str:
    """model.base spelled one way for one local directory: relative to the working directory
    when inside it (`./models/m/`, `models/m` and its absolute path all become `models/m`), else
    absolute (`~/m` -> /home/me/m); symlinks are not followed, as in `model_name`. Every job's
    params hold the model section, so another spelling of the same directory re-ran the whole
    workflow. Built-in names and hub ids are kept as they are."""
    from fastslow.model.convert import SMOLLM2_SPEC, TINY_SPEC

    local = os.path.expanduser(base)
    if base in (SMOLLM2_SPEC, TINY_SPEC) or not os.path.isdir(local):
        return base
    path = os.path.abspath(local)
    # the working directory as the shell names it too ($PWD, e.g. through a symlinked /home):
    # an absolute path typed from `pwd` is inside it
    starts = [os.getcwd()]
    shell = os.environ.get("PWD", "")
    if shell and os.path.isabs(shell) and shell != starts[0] and os.path.isdir(shell) \
            and os.path.samefile(shell, starts[0]):
        starts.append(os.path.normpath(shell))
    for start in starts:
        relative = os.path.relpath(path, start)
        if relative != ".." and not relative.startswith(".." + os.sep):
            return relative
    return path


def model_name(config: Mapping[str, Any]) -> str:
    """The directory name of the base model under results/models/: model.name, else the last
    part of model.base; of a local path, the directory it names (`/tmp/mymodel/.` -> mymodel,
    `.` -> the working directory's name; '..' resolved as text, symlinks are not followed)."""
    m = config["model"]
    if m.get("name"):
        return m["name"]
    base = m["base"]
    local = os.path.expanduser(base)
    if base.startswith((".", "/", "~")) or os.path.isdir(local):
        return Path(os.path.abspath(local)).name.replace(" ", "_")
    return base.rstrip("/").split("/")[-1].split("@")[0].replace(" ", "_")  # a hub id's revision: not the name


def task_spec(config: Mapping[str, Any], name: str) -> tuple[str, dict[str, Any]]:
    """Registry name and options of task `name` under this config's data source.

    A user's file (data.files.<name>, under any data source) first: the `file` loader, named
    `name`. Offline: the registered generator itself. `data.source: hf`: the task's Hugging Face
    dataset (data.hf_datasets.<name>) through the generic loader, starting from the options of its
    `preset` (loaders.HF_PRESETS: prompt, labels, filters, revision) if it names one, each key the
    entry sets replacing the preset's (`columns` merged into the preset's, column by column); a
    task without an entry there falls back to its offline
    generator (e.g. physics and stargraph have no paper dataset id).
    """
    own = config["data"].get("files", {}).get(name)
    if own:
        return "file", {"path": own["path"], "name": name, "scorer": own.get("scorer", "exact"),
                        **({"labels": list(own["labels"])} if own.get("labels") else {})}
    hf = config["data"].get("hf_datasets", {}).get(name)
    if config["data"]["source"] != "hf" or not hf:
        return name, dict(config["data"].get("options", {}).get(name, {}))
    opts: dict[str, Any] = {}
    if hf.get("preset"):
        from fastslow.tasks.loaders import HF_PRESETS

        opts.update(copy.deepcopy(HF_PRESETS[hf["preset"]]))
    opts["name"] = name
    for ours, theirs in (("path", "dataset"), ("name", "config"), ("splits", "split_map"), ("scorer", "scorer"),
                         ("revision", "revision"), ("filters", "filters")):
        if ours in hf:
            opts[theirs] = copy.deepcopy(hf[ours])
    if "columns" in hf:  # merged: `columns: {answer: x}` on a preset kept none of its prompt column
        opts["columns"] = {**opts.get("columns", {}), **hf["columns"]}
    return "hf", opts


def task_sources(config: Mapping[str, Any]) -> dict[str, str]:
    """Where each task (`known_tasks`) draws its data from (`task_spec`): "generator" (its own
    registry generator), "hf:<dataset id>[/<config>]" or "file:<path>". Two difficulty levels of a
    family are ordered (Fig 2's radar, `fastslow.figures.radar_group`) only from one source."""
    out = {}
    for name in known_tasks(config["data"]):
        registry, opts = task_spec(config, name)
        if registry == "hf":
            out[name] = f"hf:{opts.get('dataset')}" + (f"/{opts['config']}" if opts.get("config") else "")
        elif registry == "file":
            out[name] = f"file:{opts['path']}"
        else:
            out[name] = "generator"
    return out


def task_modules(config: Mapping[str, Any], name: str) -> tuple[str, ...]:
    """The library modules that build and score task `name` under this config (`task_spec`'s
    registry entry: its family's module, or the loaders' for a file or a Hugging Face dataset)."""
    from fastslow.tasks import task_module

    return (task_module(task_spec(config, name)[0]),)


def canonical(value: Any) -> Any:
    """`value` with every mapping's keys sorted, recursively (lists keep their order): a job's
    params in one order whichever config file set a key first. Snakemake compares params by their
    repr, so `--configfile a.yaml b.yaml` after `--configfile b.yaml` re-ran every job."""
    if isinstance(value, Mapping):
        return {k: canonical(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value


def follow_order(config: dict[str, Any], reference: Mapping[str, Any]) -> None:
    """Put `config`'s experiments, and each one's variants, in `reference`'s order (the default
    config file's), the ones it lacks after them in their own order, in place. Snakemake merges
    `--configfile overlay.yaml` alone with the overlay's keys first, and an experiment's order
    matters: a run reads an *earlier* experiment's identical run's files, and `init` needs its
    source experiment earlier (`fastslow.experiments.expand`), so an experiment an `init` names
    comes before the one naming it (an overlay's own, named by a default experiment's init)."""
    def reorder(mapping: dict[str, Any], ref: Any) -> dict[str, Any]:
        first = [k for k in (ref if isinstance(ref, Mapping) else {}) if k in mapping]
        return {k: mapping[k] for k in first + [k for k in mapping if k not in first]}

    experiments, ref = config.get("experiments"), reference.get("experiments") or {}
    if not isinstance(experiments, dict):
        return
    ordered, placed = reorder(experiments, ref), {}

    def place(name: str, seen: tuple[str, ...] = ()) -> None:  # an init's source before its user
        if name in placed or name in seen or name not in ordered:
            return
        init = ordered[name].get("init") if isinstance(ordered[name], dict) else None
        if isinstance(init, Mapping) and isinstance(init.get("experiment"), str):
            place(init["experiment"], (*seen, name))
        placed[name] = ordered[name]

    for name in ordered:
        place(name)
    config["experiments"] = placed
    for name, exp in config["experiments"].items():
        if isinstance(exp, dict) and isinstance(exp.get("variants"), dict):
            exp["variants"] = reorder(exp["variants"], (ref.get(name) or {}).get("variants"))


def own_task_params(config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The `task_data` params of a user's file task: its data.files entry and the file's sha256
    (a changed file makes its splits out of date, whatever its size or mtime); {} for others."""
    own = config["data"].get("files", {}).get(name)
    if not own:
        return {}
    return canonical({**own, "sha256": file_sha256(own["path"])})


def option_files(config: Mapping[str, Any], name: str) -> dict[str, str]:
    """The `task_data` params of the files task `name`'s options name: {option: sha256} for each
    option under data.options.<name> whose value is a path (with a `/` or a file extension) to an
    existing file (relative to the working directory, as the task opens it), keys sorted. An edit
    of a file a generator reads (a `words_file`) makes the task's splits out of date, as a changed
    option does; a string that names no file (a missing path) is left out, and so is a bare word
    (`mode: hard`) even where a file of that name happens to exist. Items of a list option are
    `option[i]`."""
    found: dict[str, str] = {}

    def visit(key: str, value: Any) -> None:
        if isinstance(value, str):
            if ("/" in value or os.sep in value or Path(value).suffix) and os.path.isfile(value):
                found[key] = file_sha256(value)
        elif isinstance(value, Mapping):
            for k in value:
                visit(f"{key}.{k}", value[k])
        elif isinstance(value, list):
            for i, v in enumerate(value):
                visit(f"{key}[{i}]", v)

    if task_spec(config, name)[0] != name:  # its splits come from a file or the Hub: no option is read
        return {}
    for option, value in (config["data"].get("options", {}).get(name) or {}).items():
        visit(str(option), value)
    return {k: found[k] for k in sorted(found)}


def task_data_spec(config: Mapping[str, Any], name: str) -> list[Any]:
    """The `task_data` param of task `name`: its loader and the options the job hands it
    (`task_spec`: a user's file, the generator's options, or the Hub dataset under `source: hf`),
    keys sorted. The settings of a source the task does not come from are left out: a Hub
    dataset named for a task under `source: offline`, or `source: hf` for a task without one
    (which keeps its generator), rebuilt its splits and retrained everything on them."""
    return canonical(list(task_spec(config, name)))


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks; cached per (path, size, mtime)."""
    st = Path(path).stat()
    return _sha256(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


#: A sampling dtype (`evaluation.dtype`, `fast.dtype`) of bf16 where bf16 is native (a CUDA GPU, a
#: CPU with AVX512-BF16 or AMX), else model.dtype: on a CPU without it a bf16 matmul is emulated,
#: 3.8x slower than fp32's (SmolLM2's MLP shape, 64 rows, one thread; bench/HISTORY.md), where
#: with it bf16 generate was ~2x fp32's.
BF16_IF_NATIVE = "bfloat16_if_native"


def reads_model_dtype(wanted: str) -> bool:
    """Whether a sampling dtype `wanted` may resolve to model.dtype on some machine
    (`resolve_sample_dtype`): 'model' and `BF16_IF_NATIVE` do; an explicit dtype never reads it."""
    return wanted in ("model", BF16_IF_NATIVE)


def resolve_sample_dtype(wanted: str, model_dtype: str) -> str:
    """The dtype a sampler loads its weights in on this machine: model.dtype for 'model', and for
    `BF16_IF_NATIVE` bfloat16 where it is native (`native_bf16_available`), else model.dtype."""
    if wanted == "model":
        return model_dtype
    if wanted == BF16_IF_NATIVE:
        from fastslow.hardware import native_bf16_available

        return "bfloat16" if native_bf16_available() else model_dtype
    return wanted


def sample_dtype(config: Mapping[str, Any]) -> str:
    """The dtype evaluation samples in on this machine (`evaluation.dtype`, `resolve_sample_dtype`)."""
    return resolve_sample_dtype(config["evaluation"].get("dtype", "model"), config["model"]["dtype"])


#: Settings that bound a job's memory, not what it computes: left out of its params (`job_params`),
#: so changing one reruns nothing. The vLLM engines' shares of a GPU (the evaluations' and the
#: round's sampler, the RL steps' colocated engine) size their KV caches; raised after an
#: out-of-memory stop, they retrained every finished run.
MEMORY_BOUNDS = {"evaluation": ("divergence_tokens",), "generation": ("gpu_memory_utilization",),
                 "slow": ("vllm_gpu_memory_utilization",)}


@functools.lru_cache(maxsize=1)
def implied_defaults() -> dict[str, dict[str, Any]]:
    """Per section, its keys without a schema default and the value a left-out one takes
    (the schema's `x-implied`: SlowConfig's or FastConfig's default)."""
    sections = _parsed_schema(str(schema_path()))["properties"]
    implied = {name: {k: p["x-implied"] for k, p in sec.get("properties", {}).items() if "x-implied" in p}
               for name, sec in sections.items()}
    return {name: keys for name, keys in implied.items() if keys}


def _same_value(a: Any, b: Any) -> bool:
    """`a == b` where a bool never equals a number (True == 1 in Python)."""
    return (a is b) if isinstance(a, bool) or isinstance(b, bool) else a == b


def job_params(config: Mapping[str, Any], sections: Sequence[str]) -> dict[str, Any]:
    """A job's params: the config's `sections` (a run's effective settings) less their
    MEMORY_BOUNDS, and less the keys without a schema default written at the value they take
    left out (`implied_defaults`: the filled-in config lacks them, so spelling one out would
    rerun every job that carries it). Snakemake reruns a job whose params changed."""
    implied = implied_defaults()

    def kept(section: str, name: str, value: Any) -> bool:
        return name not in MEMORY_BOUNDS.get(section, ()) and not (
            name in implied.get(section, {}) and _same_value(value, implied[section][name]))

    return canonical({k: {n: v for n, v in config[k].items() if kept(k, n, v)}
                      if k in MEMORY_BOUNDS or k in implied else config[k] for k in sections})


def evaluation_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """`evaluate_weights`'s keyword arguments under this (run's effective) config, but its
    `base_dir`: the sampler, the dtypes, the batch and the KL/entropy pass's switch and bound."""
    gen, ev = config["generation"], config["evaluation"]
    return {"backend": gen["backend"], "dtype": config["model"]["dtype"], "batch_size": gen["batch_size"],
            "sample_dtype": sample_dtype(config), "divergence": ev["divergence"],
            "divergence_tokens": ev["divergence_tokens"],
            "gpu_memory_utilization": gen["gpu_memory_utilization"],
            "chat_template_kwargs": chat_template_kwargs(config)}


def chat_template_kwargs(config: Mapping[str, Any]) -> dict[str, Any]:
    """`model.chat_template_kwargs` (none: the template's defaults), as every prompt is rendered."""
    return dict(config["model"].get("chat_template_kwargs") or {})


def make_task(config: Mapping[str, Any], name: str):
    """The `Task` object for `name` under this config (see `task_spec`)."""
    from fastslow.tasks import get_task

    registry, options = task_spec(config, name)
    return get_task(registry, **options)
