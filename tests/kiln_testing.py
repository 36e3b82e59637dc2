"""Helpers shared by test modules: run the pretraining entry point in-process on the debug config, launch it
on two processes, and the fresh interpreters and launch environments several test modules need."""

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEBUG = str(REPO / "configs/pretrain/debug.yaml")
FSDP_YAML = REPO / "configs/accelerate/fsdp.yaml"
DEEPSPEED_YAML = REPO / "configs/accelerate/deepspeed-zero2.yaml"
DECODER = [
    "--model.kind",
    "decoder",
    "--model.hidden_act",
    "gelu_new",
    "--model.layer_norm_eps",
    "1e-5",
    "--data.data_files",
    str(REPO / "data/tinystories/*.txt"),
]


def free_port() -> int:
    """A TCP port free on this machine now, for launches that must agree on one (several nodes); a single-node
    launch takes `--main_process_port 0` and lets accelerate pick."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def reset_accelerate():
    """accelerate keeps process-wide singletons; each in-process run must start from a clean state."""
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    PartialState._reset_state()


def run_main(main, *args):
    """A script's `main(argv)` in this process, from a clean accelerate state, leaving one behind."""
    reset_accelerate()
    try:
        return main([str(arg) for arg in args])
    finally:
        reset_accelerate()


def run(output_dir, *overrides):
    """`accelerate launch pretrain/run.py --config configs/pretrain/debug.yaml ...` in this process."""
    from pretrain.run import main

    return run_main(main, "--config", DEBUG, "--training.output_dir", output_dir, *overrides)


@contextlib.contextmanager
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and under `pytest -n 2` on two cores the workers'
    threads oversubscribe the CPU and slow everything down several times over."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def cli_in_process(capsys, *overrides) -> tuple[int, list[str]]:
    """`pretrain/run.py --config configs/pretrain/debug.yaml ...` as the command line runs it (its one-line
    errors), in this process: (exit status, the lines it wrote to stderr); no traceback."""
    import pytest

    from pretrain.run import cli

    reset_accelerate()
    try:
        with pytest.raises(SystemExit) as exit_info:
            cli(["--config", DEBUG, *map(str, overrides)])
    finally:
        reset_accelerate()
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return exit_info.value.code, err.splitlines()


def finetune_cli_error(script: str, capsys, *args) -> str:
    """`finetune/<script>.py ARGS` (classify, tag, seq2seq) as its command line runs it, in this process: it must
    refuse with status 2 and one `error: ` line, no traceback; returns that line."""
    import pytest

    from finetune.common import run_finetune_cli

    main = __import__(f"finetune.{script}", fromlist=["main"]).main
    reset_accelerate()
    try:
        with pytest.raises(SystemExit) as exit_info:
            run_finetune_cli(main, [str(arg) for arg in args])
    finally:
        reset_accelerate()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error: ") and "Traceback" not in "\n".join(err), err
    return err[-1]


def launch_two_processes(output_dir, *overrides, config=DEBUG, timeout=600) -> subprocess.CompletedProcess:
    """`accelerate launch --multi_gpu --num_processes 2 pretrain/run.py --config X ...` on CPU (gloo), X the
    debug config or `config`; waited for, it must succeed."""
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            "2",
            "--main_process_port",
            "0",
            str(REPO / "pretrain/run.py"),
            "--config",
            str(config),
            "--training.output_dir",
            str(output_dir),
            *map(str, overrides),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def launch_env(config_file) -> dict[str, str]:
    """The ACCELERATE_*/FSDP_* environment `accelerate launch --config_file FILE` gives the training
    script."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(config_file), "pretrain/run.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    if args.use_deepspeed:  # what launch_command adds before calling the DeepSpeed launcher
        fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mp_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        assert args.use_fsdp
        env = prepare_multi_gpu_env(args)
    return {k: v for k, v in env.items() if k.startswith(("ACCELERATE_", "FSDP_"))}


def run_under_fsdp(script, *args, timeout=300) -> subprocess.CompletedProcess:
    """`python SCRIPT ARGS` on 2 gloo processes (torchrun) with the environment that `accelerate launch
    --config_file configs/accelerate/fsdp.yaml` gives (accelerate runs FSDP on CPU only at this level), waited
    for; it must succeed."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "FSDP_"))}
    env = {**keep, **launch_env(FSDP_YAML), "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    port = str(free_port())
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port]
    done = subprocess.run(
        [*command, str(script), *map(str, args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def nan_loss_at_forward(monkeypatch, forward: int = 3) -> list:
    """Make the model that `pretrain.run.build_model` builds return a NaN loss (every loss part) at its
    `forward`-th forward call; returns the list that counts the forward calls."""
    import pretrain.run as run_module

    original, forwards = run_module.build_model, []

    def build_model_with_one_nan_loss(*args, **kwargs):
        model = original(*args, **kwargs)

        def poison(module, args, kwargs, output):
            forwards.append(1)
            if len(forwards) == forward:
                for key in [k for k in output.keys() if k.endswith("loss")]:
                    output[key] = output[key] * float("nan")
            return output

        model.register_forward_hook(poison, with_kwargs=True)
        return model

    monkeypatch.setattr(run_module, "build_model", build_model_with_one_nan_loss)
    return forwards


# A fresh interpreter in which `kiln`, `pretrain` and `finetune` cannot be imported (also not through the
# editable install's finder), as on a machine that has only the Hub folder: prepend it to a child script run
# as `python -c CHILD REPO ...` (sys.argv[1] is the repository, taken off sys.path)
WITHOUT_THE_PROJECT = r"""
import importlib.abc, sys
from pathlib import Path

class RefuseRepoPackages(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("kiln", "pretrain", "finetune"):
            raise ImportError(f"remote code must not import {name}")

sys.meta_path.insert(0, RefuseRepoPackages())
repo_root = Path(sys.argv[1]).resolve()
sys.path = [p for p in sys.path if p and Path(p).resolve() != repo_root]
"""


def losses(output_dir) -> dict[int, float]:
    rows = [json.loads(line) for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["train/loss"] for row in rows if "train/loss" in row}


def assert_checkpointing_keeps_gradients(model, loss) -> None:
    """`model.gradient_checkpointing_enable()` changes none of the gradients of `loss()` (a call of the model
    returning its loss), and checkpointing is on in its layers."""
    import warnings

    import torch

    def gradients():
        model.zero_grad()
        loss().backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    plain = gradients()
    with warnings.catch_warnings():
        # transformers 5.2x deprecates the name in favour of activation_checkpointing_enable
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_enable()
    assert model.model.layers[0].gradient_checkpointing
    checkpointed = gradients()
    assert plain.keys() == checkpointed.keys() and len(plain) > 10
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], msg=name)


def tiny_encoder_config(**overrides):
    """A KilnEncoderConfig small enough for unit tests (hidden 32, 2 layers, 4 heads), without dropout."""
    from pretrain.modeling import KilnEncoderConfig

    settings = dict(
        vocab_size=256,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return KilnEncoderConfig(**{**settings, **overrides})


def tiny_decoder_config(**overrides):
    """A KilnDecoderConfig small enough for unit tests (hidden 32, 2 layers, 4 heads), without dropout."""
    from pretrain.modeling import KilnDecoderConfig

    settings = dict(
        vocab_size=256,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=48,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        pad_token_id=0,
    )
    return KilnDecoderConfig(**{**settings, **overrides})


def with_terminal_signals() -> None:
    """`preexec_fn` for a command started as from a terminal: SIGINT handled by default. pytest-xdist's workers
    ignore SIGINT, and an ignored signal is inherited, so a command started from them would take Ctrl-C as a
    background job does (ignore it), which is not what its tests mean to check."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
