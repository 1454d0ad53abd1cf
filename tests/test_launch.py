"""fastslow.launch: the command that runs training on a job's GPUs (accelerate for more than one).

No GPU here: the command construction is checked exactly, every shipped accelerate config is
parsed by accelerate's own config loader, and one real `accelerate launch` with two processes
(torch.distributed on CPU, gloo) checks the launcher end to end: ranks, world size, rendezvous
port, arguments. What needs GPUs (NCCL, FSDP2 sharding, vLLM colocate) is not exercised.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastslow import launch

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "profiles" / "slurm" / "accelerate"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    for key in (launch.ENV_CONFIG_DIR, launch.ENV_STRATEGY, "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(key, raising=False)


@pytest.mark.parametrize("gpus", [0, 1])
def test_one_gpu_or_none_runs_the_module_directly(gpus):
    cmd = launch.build_command("fastslow.slow.train", ["--spec", "job.json"], gpus=gpus, python="/venv/bin/python")
    assert cmd == ["/venv/bin/python", "-m", "fastslow.slow.train", "--spec", "job.json"]


def test_several_gpus_go_through_accelerate_launch():
    cmd = launch.build_command("fastslow.slow.train", ["--spec", "job.json", 3], gpus=8, port=41234,
                               python="/venv/bin/python")
    assert cmd == ["/venv/bin/python", "-m", "accelerate.commands.launch",
                   "--config_file", str(CONFIGS / "fsdp2.yaml"),
                   "--num_processes", "8", "--num_machines", "1", "--machine_rank", "0",
                   "--main_process_port", "41234",
                   "-m", "fastslow.slow.train", "--spec", "job.json", "3"]


def test_strategy_config_file_and_extra_accelerate_args(tmp_path, monkeypatch):
    cmd = launch.build_command("m", gpus=2, strategy="zero3", port=1)
    assert cmd[cmd.index("--config_file") + 1] == str(CONFIGS / "zero3.yaml")
    monkeypatch.setenv(launch.ENV_STRATEGY, "ddp")
    cmd = launch.build_command("m", gpus=2, port=1)
    assert cmd[cmd.index("--config_file") + 1] == str(CONFIGS / "ddp.yaml")
    own = tmp_path / "mine.yaml"
    own.write_text("distributed_type: MULTI_GPU\n")
    cmd = launch.build_command("m", ["a"], gpus=4, config_file=own, port=1,
                               accelerate_args=["--mixed_precision", "no"])
    assert cmd[cmd.index("--config_file") + 1] == str(own)
    assert cmd[-5:] == ["--mixed_precision", "no", "-m", "m", "a"]


def test_python_defaults_to_this_interpreter_and_port_is_free():
    cmd = launch.build_command("m", gpus=2)
    assert cmd[0] == sys.executable  # SLURM jobs keep the workflow's virtual environment
    # 0: accelerate takes a free port as it launches (test_two_process_launch_runs_on_cpu), not
    # its default 29500, which jobs sharing a node would collide on
    assert cmd[cmd.index("--main_process_port") + 1] == "0"


def test_config_dir_from_environment(tmp_path, monkeypatch):
    (tmp_path / "fsdp2.yaml").write_text("distributed_type: FSDP\n")
    monkeypatch.setenv(launch.ENV_CONFIG_DIR, str(tmp_path))
    assert launch.accelerate_config() == tmp_path / "fsdp2.yaml"
    with pytest.raises(FileNotFoundError) as err:  # the message was the bare path
        launch.accelerate_config("zero3")
    assert str(err.value) == (f"no accelerate config zero3.yaml for strategy 'zero3' in {tmp_path} "
                              f"(${launch.ENV_CONFIG_DIR} chooses the folder)")
    monkeypatch.setenv(launch.ENV_STRATEGY, "fsdp")  # a typo in the environment, named as such
    with pytest.raises(ValueError, match=rf"^unknown accelerate strategy 'fsdp' \(from \${launch.ENV_STRATEGY}\): "):
        launch.accelerate_config()


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="strategy"):
        launch.build_command("m", gpus=2, strategy="megatron")
    with pytest.raises(ValueError, match="module"):
        launch.build_command("m; rm -rf /", gpus=2)
    with pytest.raises(ValueError, match="gpus"):
        launch.build_command("m", gpus=-1)


@pytest.mark.parametrize("resources,expected", [
    ({"gpu": 8}, 8), ({"gpu": "2"}, 2), ({"gpu": 0}, 0), ({}, 0), ({"gres": "gpu:4"}, 4),
    ({"gres": "gpu:h100:2"}, 2), ({"gres": "gpu"}, 1), ({"gres": "shard:2"}, 0),
    ({"gpu": 1, "gres": "gpu:4"}, 1), ({"gpu": 0, "gres": "gpu:4"}, 0), ({"gpu": "", "gres": "gpu:4"}, 4),
    ({"gres": "shard:1,gpu:a100:3"}, 3), ({"gres": "gpu:h100"}, 1),
])
def test_gpus_requested_from_snakemake_resources(resources, expected):
    assert launch.gpus_requested(resources) == expected


@pytest.mark.parametrize(("gpu", "message"), [
    (-1, "resource gpu must be >= 0, got -1"), ("two", "resource gpu must be an integer, got 'two'"),
])
def test_gpus_requested_names_a_bad_gpu_resource(gpu, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        launch.gpus_requested({"gpu": gpu})


def test_env_int(monkeypatch):
    """FASTSLOW_TRAIN_PROCESSES, WORLD_SIZE, RANK: the default when unset or blank, the minimum
    itself allowed, a bad value named with its variable."""
    monkeypatch.delenv("FASTSLOW_N", raising=False)
    assert launch.env_int("FASTSLOW_N", 7) == 7
    monkeypatch.setenv("FASTSLOW_N", "  ")
    assert launch.env_int("FASTSLOW_N", 7) == 7
    monkeypatch.setenv("FASTSLOW_N", " 3 ")
    assert launch.env_int("FASTSLOW_N", 7) == 3
    monkeypatch.setenv("FASTSLOW_N", "1")
    assert launch.env_int("FASTSLOW_N") == 1
    monkeypatch.setenv("FASTSLOW_N", "0")
    assert launch.env_int("FASTSLOW_N", minimum=0) == 0
    with pytest.raises(ValueError, match=r"^FASTSLOW_N must be an integer >= 1, got 0$"):
        launch.env_int("FASTSLOW_N")
    monkeypatch.setenv("FASTSLOW_N", "2.5")
    with pytest.raises(ValueError, match=r"^FASTSLOW_N must be an integer >= 1, got '2.5'$"):
        launch.env_int("FASTSLOW_N")


def test_gpus_requested_reads_attribute_style_resources():
    class Res:  # snakemake.io.Resources: attribute access and .get
        gpu = 4

    assert launch.gpus_requested(Res()) == 4


def test_visible_gpus_and_mismatch(monkeypatch):
    assert launch.visible_gpus({}) is None
    assert launch.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2"}) == 3
    assert launch.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert launch.visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == 0  # CUDA's "no device"
    assert launch.visible_gpus({"CUDA_VISIBLE_DEVICES": "0, 1,"}) == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert launch.visible_gpus() == 2
    with pytest.raises(RuntimeError, match="4 GPUs requested"):
        launch.launch("m", gpus=4)
    with pytest.raises(RuntimeError, match="^3 GPUs requested but CUDA_VISIBLE_DEVICES shows 2$"):
        launch.launch("m", gpus=3)  # one short is short too
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with pytest.raises(RuntimeError, match="^2 GPUs requested but CUDA_VISIBLE_DEVICES shows 1$"):
        launch.launch("m", gpus=2, env={"CUDA_VISIBLE_DEVICES": "3"})  # the ranks' environment counts


def test_config_dir_from_the_working_directory_then_the_checkout(tmp_path, monkeypatch):
    """Snakemake jobs run in the workflow directory: its configs come before the source checkout's."""
    monkeypatch.chdir(tmp_path)
    assert launch.config_dir() == CONFIGS  # none here: the checkout's
    (tmp_path / "profiles/slurm/accelerate").mkdir(parents=True)
    assert launch.config_dir() == tmp_path / "profiles/slurm/accelerate"
    assert launch.config_dir(ROOT) == CONFIGS  # a root given: only there
    with pytest.raises(FileNotFoundError) as err:
        launch.config_dir(tmp_path / "elsewhere")
    assert str(err.value) == (f"no {Path('profiles/slurm/accelerate')} under {tmp_path / 'elsewhere'}; "
                              f"set {launch.ENV_CONFIG_DIR}")


def test_an_explicit_strategy_is_not_blamed_on_the_environment(monkeypatch):
    monkeypatch.setenv(launch.ENV_STRATEGY, "ddp")
    with pytest.raises(ValueError, match=r"^unknown accelerate strategy 'megatron': expected one of "):
        launch.accelerate_config("megatron")


def test_training_strategy_refuses_deepspeed_and_settings_read_the_config(tmp_path, monkeypatch):
    """The shipped configs' meaning for a cycle (sharded: FSDP; bf16), and DeepSpeed refused
    however its distributed_type is spelled."""
    assert launch.check_training_strategy("fsdp2") == CONFIGS / "fsdp2.yaml"
    assert launch.check_training_strategy("ddp") == CONFIGS / "ddp.yaml"
    with pytest.raises(ValueError, match=r"zero3.yaml is DeepSpeed \(distributed_type: DEEPSPEED\), .* "
                                         rf"set {launch.ENV_STRATEGY}=fsdp2 or ddp$"):
        launch.check_training_strategy("zero3")
    assert launch.strategy_settings(CONFIGS / "fsdp2.yaml") == {"sharded": True, "bf16": True}
    assert launch.strategy_settings(CONFIGS / "ddp.yaml") == {"sharded": False, "bf16": True}
    (tmp_path / "fsdp2.yaml").write_text("distributed_type: deepspeed\nmixed_precision: fp16\n")
    monkeypatch.setenv(launch.ENV_CONFIG_DIR, str(tmp_path))
    with pytest.raises(ValueError, match="is DeepSpeed"):
        launch.check_training_strategy()
    assert launch.strategy_settings(tmp_path / "fsdp2.yaml") == {"sharded": False, "bf16": False}
    (tmp_path / "empty.yaml").write_text("")
    assert launch.strategy_settings(tmp_path / "empty.yaml") == {"sharded": False, "bf16": False}
    # an accelerate config being edited that does not parse: one line naming it (yaml's own error
    # spans lines and names "<unicode string>"), before the cycle's fast round
    (tmp_path / "fsdp2.yaml").write_text("distributed_type: FSDP\nfsdp_config: {fsdp_version: 2\nnum_machines: 1\n")
    for call in (launch.check_training_strategy, lambda: launch.strategy_settings(tmp_path / "fsdp2.yaml")):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == f"{tmp_path / 'fsdp2.yaml'} does not parse as YAML (expected ',' or '}}', but got ':', line 3)"


def test_cli_prints_the_command():
    out = subprocess.run([sys.executable, "-m", "fastslow.launch", "--gpus", "4", "--strategy", "ddp",
                          "--print", "--", "fastslow.slow.train", "--spec", "j.json"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "accelerate.commands.launch --config_file" in out.stdout and "ddp.yaml" in out.stdout
    assert out.stdout.split()[-4:] == ["-m", "fastslow.slow.train", "--spec", "j.json"]


@pytest.mark.parametrize(("argv", "env", "expected"), [
    (["--print", "--gpus", "-1", "fastslow.slow.train"], {}, "gpus must be >= 0, got -1"),
    (["--print", "--gpus", "2", "fastslow/slow/train.py"], {}, "not a module name: 'fastslow/slow/train.py'"),
    (["--print", "--gpus", "2", "fastslow.slow.train"], {"FASTSLOW_ACCELERATE_STRATEGY": "fsdp"},
     "unknown accelerate strategy 'fsdp' (from $FASTSLOW_ACCELERATE_STRATEGY): expected one of ['ddp', 'fsdp2', 'zero3']"),
    (["--gpus", "4", "fastslow.slow.train"], {"CUDA_VISIBLE_DEVICES": "0"},
     "4 GPUs requested but CUDA_VISIBLE_DEVICES shows 1"),
    (["--print", "--gpus", "2", "--config-file", "nope.yaml", "fastslow.slow.train"], {},
     "--config-file: no such file 'nope.yaml'"),
])
def test_the_cli_names_a_bad_value_in_one_line(argv, env, expected, monkeypatch, capsys):
    """These were tracebacks (the functions' messages, uncaught); now argparse's error line."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_info:
        launch.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.strip().splitlines()[-1] == f"python -m fastslow.launch: error: {expected}", err


def test_cli_strips_the_separator_and_counts_visible_gpus(monkeypatch, capsys):
    """`--` after the module separates its own arguments (the docstring's shell rule puts it
    first, where argparse takes it); without --gpus, CUDA_VISIBLE_DEVICES says how many."""
    assert launch.main(["--print", "--gpus", "0", "fastslow.slow.train", "--", "--spec", "j.json"]) == 0
    assert capsys.readouterr().out.split()[1:] == ["-m", "fastslow.slow.train", "--spec", "j.json"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert launch.main(["--print", "fastslow.slow.train"]) == 0
    out = capsys.readouterr().out.split()
    assert out[out.index("--num_processes") + 1] == "2"


def test_run_raises_on_failure_and_names_a_missing_command(tmp_path):
    launch.run([sys.executable, "-c", "pass"])
    with pytest.raises(subprocess.CalledProcessError) as err:
        launch.run([sys.executable, "-c", "raise SystemExit(3)"])
    assert err.value.returncode == 3 and err.value.cmd == [sys.executable, "-c", "raise SystemExit(3)"]
    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    with pytest.raises(subprocess.CalledProcessError) as err:  # the ranks killed (out of memory) is no success
        launch.run(killed)
    assert err.value.returncode == -signal.SIGKILL
    with pytest.raises(FileNotFoundError, match="no such command: 'no-such-command-here'"):
        launch.run(["no-such-command-here"])
    with open(tmp_path / "log", "w") as fh:  # the rule's log file
        launch.run([sys.executable, "-c", "print('rank says hi')"], stdout=fh)
    assert (tmp_path / "log").read_text() == "rank says hi\n"


@pytest.mark.parametrize(("code", "status"), [("raise SystemExit(3)", 3),
                                              ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", 143)])
def test_cli_exits_with_the_commands_status(tmp_path, monkeypatch, code, status):
    """A command killed by signal N exits 128 + N, as a shell would report it."""
    (tmp_path / "probe_exit.py").write_text(code + "\n")
    monkeypatch.chdir(tmp_path)  # `python -m` finds the module in the working directory
    assert launch.main(["--gpus", "0", "probe_exit"]) == status


def test_stop_process_group_kills_what_ignores_sigterm_and_skips_what_ended():
    ended = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    ended.wait()
    launch.stop_process_group(ended)  # its group is gone: nothing to signal, no error
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                 "signal.SIG_IGN); print('ready', flush=True); time.sleep(5)"],
                                start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline().strip() == "ready"
    start = time.monotonic()
    launch.stop_process_group(stubborn, grace=0.2)
    assert stubborn.returncode == -signal.SIGKILL and time.monotonic() - start < 4
    stubborn.stdout.close()


@pytest.mark.parametrize("name", sorted(launch.STRATEGIES))
def test_shipped_configs_load_in_accelerate(name):
    from accelerate.commands.config.config_args import load_config_from_file

    cfg = load_config_from_file(str(CONFIGS / launch.STRATEGIES[name]))
    assert cfg.num_machines == 1 and cfg.mixed_precision == "bf16"
    assert cfg.distributed_type.value == {"fsdp2": "FSDP", "zero3": "DEEPSPEED", "ddp": "MULTI_GPU"}[name]
    if name == "fsdp2":
        assert cfg.fsdp_config["fsdp_version"] == 2


PROBE = """
import json, os, sys
import torch.distributed as dist
from accelerate import PartialState

state = PartialState(cpu=True)  # what TRL's use_cpu=True gives: gloo on CPU
t = __import__("torch").tensor([state.process_index + 1.0])
dist.all_reduce(t)
# One file per rank: two ranks printing to one pipe can interleave their lines.
open(f"rank{state.process_index}.json", "w").write(json.dumps({"rank": state.process_index, "world": state.num_processes, "sum": t.item(),
                  "port": os.environ.get("MASTER_PORT"), "argv": sys.argv[1:],
                  "fsdp": os.environ.get("ACCELERATE_USE_FSDP"),
                  # would transformers load real weights on rank 0 only (zeros elsewhere) now?
                  "rank0_only_loading": __import__("transformers.integrations").integrations.is_fsdp_enabled()}))
dist.barrier()
dist.destroy_process_group()  # an un-destroyed gloo group can abort the process at exit
"""


@pytest.mark.slow
def test_two_process_launch_runs_on_cpu(tmp_path):
    """The command build_command makes really starts N ranks that rendezvous (gloo on CPU)."""
    (tmp_path / "probe_mod.py").write_text(PROBE)
    cmd = launch.build_command("probe_mod", ["--x", "1"], gpus=2)  # port 0: accelerate picks a free one
    # The default config (fsdp2.yaml): accelerate's multi-GPU launcher (torch.distributed.run)
    # spawns the ranks with ACCELERATE_USE_FSDP set; on CPU they join a gloo process group.
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    ranks = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert ranks[0]["port"] == ranks[1]["port"] and int(ranks[0]["port"]) not in (0, 29500)
    assert all(r["world"] == 2 and r["sum"] == 3.0 and r["argv"] == ["--x", "1"] and r["fsdp"] == "true"
               for r in ranks)
    # fsdp2.yaml keeps transformers' CPU-RAM-efficient loading off: with it, transformers < 5.18
    # (the GPU pin set) gives ranks > 0 zeros for a model made once the process group exists
    # (TRL's KL reference model), which nothing broadcasts into
    assert [r["rank0_only_loading"] for r in ranks] == [False, False]
