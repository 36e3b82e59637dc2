"""Trust (issue 24): no code runs that the user did not ask for, nothing private is published, files follow the
umask; and the one-line refusals of settings that would silently do something else.

Every case runs as a user runs it, `accelerate launch` in a fresh process, but for a few refusals whose way
through a fresh process another case proves: those go through the same command line in this process
(`run_in_process`)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kiln_testing import DEBUG, REPO
from test_finetune_scripts import write_sentiment

ACCELERATE = (
    sys.executable,
    "-m",
    "accelerate.commands.launch",
    "--num_processes",
    "1",
    "--num_machines",
    "1",
    "--mixed_precision",
    "no",
    "--dynamo_backend",
    "no",
)
ONE_STEP = ["--training.max_steps", 1, "--training.eval_steps", 0, "--training.save_steps", 0]


def launch(script: str, *args, env_extra=None, umask: int = -1) -> subprocess.Popen:
    """`accelerate launch SCRIPT ARGS` from the repo root, started (not waited for)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), **(env_extra or {})}
    return subprocess.Popen(
        [*ACCELERATE, str(REPO / script), *map(str, args)],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        umask=umask,
    )


def finish(*procs: subprocess.Popen) -> list[tuple[int, str]]:
    """Wait for processes started together (they run side by side); (exit status, output) of each."""
    return [(proc.wait(timeout=240), proc.stdout.read()) for proc in procs]


def script_cli(script: str):
    """The command line of `script` ("pretrain/run.py", "finetune/classify.py", or a module run with `python -m`,
    "pretrain.convert") as its `__main__` runs it, to call in this process."""
    import importlib

    if script == "pretrain/run.py":
        from pretrain.run import cli

        return cli
    if script.startswith("finetune/"):
        from finetune.common import run_finetune_cli

        main = importlib.import_module(script[: -len(".py")].replace("/", ".")).main
        return lambda argv: run_finetune_cli(main, argv)
    return importlib.import_module(script).main


def run_in_process(capsys, script: str, *args) -> tuple[int, str]:
    """`script ARGS` through the same command line as `launch` runs it (its one-line errors, exit statuses), in
    this process, for a case whose way through a fresh process another case proves: (exit status, what it wrote
    to stdout and stderr)."""
    from kiln_testing import one_torch_thread, reset_accelerate

    capsys.readouterr()
    reset_accelerate()
    try:
        with one_torch_thread():
            script_cli(script)([str(arg) for arg in args])
        code = 0
    except SystemExit as exit_info:
        code = exit_info.code
    finally:
        reset_accelerate()
    captured = capsys.readouterr()
    output = captured.out + captured.err
    if isinstance(code, str):  # sys.exit("error: ..."): the interpreter prints it and exits with status 1
        output, code = output + code + "\n", 1
    return code or 0, output


def error_line(output: str) -> str:
    """The training process's one-line error."""
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, output[-3000:]
    return errors[0]


# ----------------------------------------------------------------------------------------------------------
# item 1: a checkpoint's own code (auto_map) never runs unless the user passes --model.trust_remote_code

STRANGER_CODE = """import pathlib
pathlib.Path({marker!r}).write_text("the checkpoint's code ran")
from transformers import PretrainedConfig
class StrangerConfig(PretrainedConfig):
    model_type = {model_type!r}
"""


def stranger_checkpoint(folder: Path, kiln_folder: Path, model_type: str, marker: Path) -> Path:
    """A copy of `kiln_folder` whose config.json and tokenizer_config.json name `stranger.py` (auto_map), a file
    that writes `marker` when imported; config.json says `model_type`."""
    shutil.copytree(kiln_folder, folder)
    (folder / "stranger.py").write_text(STRANGER_CODE.format(marker=str(marker), model_type=model_type))
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = model_type
    config["auto_map"] = {name: "stranger.StrangerConfig" for name in config["auto_map"]}
    config["auto_map"]["AutoTokenizer"] = [None, "stranger.StrangerConfig"]
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer_config["auto_map"] = {"AutoTokenizer": [None, "stranger.StrangerConfig"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    return folder


def classify_args(tmp_path: Path, checkpoint, name: str) -> list:
    files = write_sentiment(tmp_path, sizes=(16, 8, 8))
    return [
        "--model.checkpoint",
        checkpoint,
        "--training.output_dir",
        tmp_path / name,
        *ONE_STEP,
        "--data.train_file",
        files["train"],
        "--data.validation_file",
        files["validation"],
        "--data.test_file",
        files["test"],
        "--training.per_device_train_batch_size",
        8,
    ]


def pretrain_and_fine_tune_from(
    tmp_path: Path,
    checkpoint,
    *pretraining_args,
    env_extra=None,
    umask=-1,
    fine_tuning_args=(),
    fine_tune_here=None,
):
    """Pretraining (--model.init_from) and fine-tuning (--model.checkpoint) from `checkpoint`, launched side
    by side (fine-tuning in this process meanwhile where `fine_tune_here` is pytest's capsys; `fine_tuning_args`
    replace its defaults): (exit status, output) of each."""
    pretraining = launch(
        "pretrain/run.py",
        "--config",
        DEBUG,
        "--training.output_dir",
        tmp_path / "p",
        "--model.init_from",
        checkpoint,
        *pretraining_args,
        *ONE_STEP,
        env_extra=env_extra,
        umask=umask,
    )
    args = [*classify_args(tmp_path, checkpoint, "f"), *map(str, fine_tuning_args)]
    if fine_tune_here is not None:
        fine_tuning = run_in_process(fine_tune_here, "finetune/classify.py", *args)
        return [*finish(pretraining), fine_tuning]
    return finish(pretraining, launch("finetune/classify.py", *args, env_extra=env_extra, umask=umask))


@pytest.mark.slow
def test_a_checkpoint_of_another_type_with_code_is_refused_without_running_it(
    tmp_path, kiln_checkpoints, capsys
):
    """Pretraining in a fresh process, fine-tuning through its command line in this process (both fresh: the
    Hub's case below)."""
    encoder, _ = kiln_checkpoints
    marker = tmp_path / "MARKER"
    stranger = stranger_checkpoint(tmp_path / "stranger", encoder, "stranger_bert", marker)
    (p_code, p_out), (f_code, f_out) = pretrain_and_fine_tune_from(
        tmp_path, stranger, "--tokenizer.name_or_path", stranger, fine_tune_here=capsys
    )
    assert not marker.exists(), "the checkpoint's own code ran"
    assert p_code != 0 and f_code != 0
    assert "Do you wish to run the custom code" not in p_out + f_out  # refused, not asked about
    assert error_line(p_out) == (
        f"error: --model.init_from {stranger} is a stranger_bert checkpoint with Python code of its own (auto_map), "
        "which Kiln runs only with --model.trust_remote_code; point it at a Kiln encoder checkpoint or a "
        "transformers BERT or ELECTRA one (converted on the way in)"
    )
    assert error_line(f_out).startswith(f"error: --model.checkpoint {stranger} is a stranger_bert checkpoint")
    assert not (tmp_path / "p").exists() and not (tmp_path / "f").exists()


@pytest.mark.slow
def test_a_kiln_checkpoint_naming_other_code_trains_with_kilns_classes_and_saves_by_the_umask(
    tmp_path, kiln_checkpoints
):
    """Item 1, and item 3 (every file a run writes follows the umask, the weights included) on the same
    fine-tuning run, which evaluates and saves a checkpoint at each of its 2 steps (best/ is written)."""
    encoder, _ = kiln_checkpoints
    marker = tmp_path / "MARKER"
    stranger = stranger_checkpoint(tmp_path / "stranger", encoder, "kiln_encoder", marker)
    every_step = ["--training.max_steps", 2, "--training.save_steps", 1, "--training.eval_steps", 1]
    (p_code, p_out), (f_code, f_out) = pretrain_and_fine_tune_from(
        tmp_path, stranger, "--tokenizer.name_or_path", stranger, umask=0o022, fine_tuning_args=every_step
    )
    assert not marker.exists(), "the checkpoint's own code ran"
    assert p_code == 0, p_out[-3000:]
    assert f_code == 0, f_out[-3000:]
    # what the runs save names Kiln's code only, never the stranger's file it did not run
    for final in (tmp_path / "p" / "final", tmp_path / "f" / "final"):
        assert not (final / "stranger.py").exists()
        for name in ("config.json", "tokenizer_config.json"):
            assert "stranger" not in (final / name).read_text(), (final, name)

    out = tmp_path / "f"
    folders = [out / "final", out / "best", *sorted((out / "checkpoints").iterdir())]
    assert len(folders) >= 3 and all(folder.is_dir() for folder in folders)
    modes = {
        str(p.relative_to(out)): oct(p.stat().st_mode & 0o777)
        for f in folders
        for p in f.rglob("*")
        if p.is_file()
    }
    assert any(name.endswith("model.safetensors") for name in modes)
    assert {name: mode for name, mode in modes.items() if mode != oct(0o644)} == {}


@pytest.mark.slow
def test_a_hub_checkpoint_of_another_type_with_code_is_refused_without_running_it(
    tmp_path, hub, kiln_checkpoints
):
    from huggingface_hub import HfApi

    encoder, _ = kiln_checkpoints
    marker = tmp_path / "MARKER"
    stranger = stranger_checkpoint(tmp_path / "stranger", encoder, "stranger_bert", marker)
    hub.create_repo("stranger/bert-init")
    HfApi().upload_folder(repo_id="stranger/bert-init", folder_path=stranger, commit_message="init")
    home = {"HF_HOME": str(tmp_path / "hf-home")}  # a fresh machine: nothing cached
    (p_code, p_out), (f_code, f_out) = pretrain_and_fine_tune_from(
        tmp_path, "stranger/bert-init", env_extra=home
    )
    assert not marker.exists(), "the checkpoint's own code ran"
    assert p_code != 0 and f_code != 0
    assert "Do you wish to run the custom code" not in p_out + f_out
    assert error_line(p_out).startswith(
        "error: --model.init_from stranger/bert-init is a stranger_bert checkpoint with"
    )
    assert error_line(f_out).startswith(
        "error: --model.checkpoint stranger/bert-init is a stranger_bert checkpoint"
    )
    # only config.json was read; none of the repo's Python files was even downloaded
    downloaded = [str(p) for p in (tmp_path / "hf-home").rglob("*.py")]
    assert downloaded == []


# ----------------------------------------------------------------------------------------------------------
# item 2: what is published names data by what it is, never by where it lay on the user's disk: tests/test_privacy.py
# (a launched pretraining run pushing its checkpoints, on data in the user's home with HOME pointing there, then
# fine-tuning from it; every file pushed or written for publishing is searched for the user's paths)


def pushed_files(hub, repo_id: str) -> dict[str, bytes]:
    """Every file of every commit of `repo_id` on the test Hub, by `commit/path`."""
    repo = hub.repo(repo_id)
    return {
        f"{oid[:8]}/{path}": blob.data
        for oid, commit in repo.commits.items()
        for path, blob in commit.files.items()
    }


# ----------------------------------------------------------------------------------------------------------
# item 3: every file a run writes follows the umask, the weights included: with item 1's fine-tuning run, above


# ----------------------------------------------------------------------------------------------------------
# items 6, 9, 15, 18: settings that would silently do something else are one line


def test_settings_that_would_train_otherwise_than_asked_are_one_line(tmp_path, capsys):
    """The first case launched in a fresh process, the others through the same command line in this process."""
    (tmp_path / "a.yaml").write_text("_base_: b.yaml\ntraining:\n  max_steps: 2\n")
    (tmp_path / "b.yaml").write_text("_base_: a.yaml\nmodel:\n  hidden_size: 32\n")
    cases = {
        "lr 0": (
            ["--config", DEBUG, "--training.lr", 0],
            "error: --training.lr must be a finite number > 0, got 0.0",
        ),
        "fp8 typo": (
            ["--config", DEBUG, "--training.mixed_precision", "fp8x"],
            "error: --training.mixed_precision 'fp8x' is unknown; use one of: no, bf16, fp16, fp8",
        ),
        "fp16 on CPU": (
            ["--config", DEBUG, "--training.mixed_precision", "fp16"],
            "error: --training.mixed_precision fp16 is not applied on a CPU",
        ),
        "base loop": (
            ["--config", tmp_path / "a.yaml"],
            f"error: the _base_ chain of {tmp_path / 'a.yaml'} loops: a.yaml -> b.yaml -> a.yaml",
        ),
    }
    runs = {
        name: [*args, "--training.output_dir", tmp_path / name.replace(" ", "-")]
        for name, (args, _) in cases.items()
    }
    fresh = launch("pretrain/run.py", *runs["lr 0"])
    done = {
        name: run_in_process(capsys, "pretrain/run.py", *args)
        for name, args in runs.items()
        if name != "lr 0"
    }
    done["lr 0"] = finish(fresh)[0]
    for name, (_, expected) in cases.items():
        code, output = done[name]
        assert code != 0, (name, output[-2000:])
        assert error_line(output).startswith(expected), (name, error_line(output))
        assert "Traceback" not in output.split("error: ")[0], (
            name,
            output[-2000:],
        )  # the training process's own
        assert not (tmp_path / name.replace(" ", "-")).exists(), name
