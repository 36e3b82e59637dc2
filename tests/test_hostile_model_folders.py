"""Trust and faults, round six (issue 52, items 1 and 5): one gate for every command that reads a model folder.

The same hostile folders, made from a tiny Kiln encoder saved by the code, go to every model-reading command:
pretraining's `--model.init_from`, fine-tuning's `--model.checkpoint`, `adapt`, GLUE, BLiMP, `convert` and ONNX
export. Each must answer with one line naming the problem (exit status 2, no traceback) before it builds anything
or writes its output. Every command is run once in a fresh process, as users run it; the other cases call the same
command line in this process, which is what keeps the test fast.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kiln_testing import DEBUG, REPO, one_torch_thread
from test_finetune_scripts import write_sentiment
from test_start_model_checks import kiln_folder
from test_trust import ONE_STEP, run_in_process

WRONG = "; point it at a folder written by save_pretrained"
AGAIN = "; copy or save it again"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    with one_torch_thread():
        return kiln_folder(tmp_path_factory.mktemp("tiny") / "encoder")


def _copy(source: Path, to: Path) -> Path:
    shutil.copytree(source, to)
    return to


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def _sharded(folder: Path, shard_name: str) -> None:
    """The weights moved out of the folder to `folder/../outside.safetensors`, and the folder's index naming them
    by `shard_name`: a loader that follows the name reads a file outside the folder."""
    from safetensors import safe_open

    outside = folder.parent / "outside.safetensors"
    os.replace(folder / "model.safetensors", outside)
    with safe_open(outside, "pt") as f:
        names = list(f.keys())
    index = {"metadata": {}, "weight_map": dict.fromkeys(names, shard_name)}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def hostile(kind: str, tiny: Path, root: Path) -> tuple[Path, str]:
    """(a copy of `tiny` made hostile in the way `kind` names, the problem its one line must state)."""
    folder = _copy(tiny, root / kind / "model")
    weights = folder / "model.safetensors"
    if kind == "deep":  # the audit's case: a config that asks for a million blocks over two
        _edit_config(folder, num_hidden_layers=1_000_000)
        return folder, f"its config.json's num_hidden_layers is 1000000 but its weights hold 2 blocks{WRONG}"
    if kind == "wrong-shape":  # one tensor of the second block: no check of the first block's alone finds it
        from safetensors.torch import load_file, save_file

        tensors = load_file(weights)
        name = "model.layers.1.mlp.fc_in.weight"
        expected = tuple(tensors[name].shape)
        tensors[name] = tensors[name][:-1].clone()
        save_file(tensors, weights, metadata={"format": "pt"})
        found = (expected[0] - 1, expected[1])
        return folder, (
            f"its weights' {name} is {found} but its config.json gives {expected} (KilnEncoderForPreTraining){WRONG}"
        )
    if kind == "shard-above":
        _sharded(folder, "../outside.safetensors")
        return (
            folder,
            f"its model.safetensors.index.json names shards outside its folder ('../outside.safetensors'){AGAIN}",
        )
    if kind == "shard-absolute":
        absolute = str(folder.parent / "outside.safetensors")
        _sharded(folder, absolute)
        return (
            folder,
            f"its model.safetensors.index.json names shards outside its folder ({absolute!r}){AGAIN}",
        )
    if kind == "link-out":  # model.safetensors itself a link to a file outside the folder
        outside = folder.parent / "outside.safetensors"
        os.replace(weights, outside)
        weights.symlink_to(outside)
        return (
            folder,
            f"its model.safetensors is a link leading out of its folder (to {outside.resolve()}){AGAIN}",
        )
    if kind == "truncated":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
        return (
            folder,
            f"its model.safetensors is damaged or truncated ({len(data) // 2:,} bytes; its header needs ",
        )
    raise AssertionError(kind)


KINDS = ("deep", "wrong-shape", "shard-above", "shard-absolute", "link-out", "truncated")


def blimp_data(root: Path) -> Path:
    folder = root / "blimp"
    folder.mkdir(exist_ok=True)
    pair = {"sentence_good": "A cat sleeps.", "sentence_bad": "A cat sleep.", "linguistics_term": "agreement"}
    (folder / "p.jsonl").write_text(json.dumps(pair) + "\n")
    return folder


# command -> (script as `run_in_process` names it, how it names the folder, argv for (folder, output, root))
COMMANDS = {
    "pretrain": (
        "pretrain/run.py",
        "--model.init_from",
        lambda m, out, root: ["--config", DEBUG, "--model.init_from", m, "--training.output_dir", out],
    ),
    "classify": (
        "finetune/classify.py",
        "--model.checkpoint",
        lambda m, out, root: [
            "--model.checkpoint",
            m,
            "--training.output_dir",
            out,
            *ONE_STEP,
            *(f"--data.{split}_file={path}" for split, path in write_sentiment(root, (8, 4, 4)).items()),
        ],
    ),
    "adapt": (
        "finetune/adapt.py",
        "--model.init_from",
        lambda m, out, root: [
            "--task",
            "classify",
            f"--task_data.train_file={write_sentiment(root, (8, 4, 4))['train']}",
            "--task_data.text_columns=[sentence]",
            "--config",
            DEBUG,
            "--model.init_from",
            m,
            "--training.output_dir",
            out,
        ],
    ),
    "glue": (
        "finetune/glue.py",
        "--checkpoint",
        lambda m, out, root: ["--checkpoint", m, "--tasks", "sst2", "--glue-dir", root, "--output-dir", out],
    ),
    "blimp": (
        "pretrain.zero_shot.__main__",
        "--model",
        lambda m, out, root: ["blimp", "--model", m, "--data", blimp_data(root), "--json", out],
    ),
    "convert": ("pretrain.convert", "", lambda m, out, root: [m, out]),
    "export_onnx": ("pretrain.export_onnx", "", lambda m, out, root: [m, out]),
}


def expected_line(command: str, folder: Path, problem: str) -> str:
    option = COMMANDS[command][1]
    return f"error: {option} {folder}: {problem}" if option else f"error: {folder}: {problem}"


def assert_refused(command: str, folder: Path, problem: str, code: int, output: str, out: Path) -> None:
    """Exit status 2, no traceback, exactly one line naming the problem (the command's only line of its own:
    launchers and libraries may add nothing), and no output written."""
    lines = [line for line in output.strip().splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in output, (command, code, output[-3000:])
    assert len(lines) == 1, (command, output[-3000:])
    assert lines[0].startswith(expected_line(command, folder, problem)), (command, lines[0])
    assert not out.exists(), f"{command} wrote {out} before refusing"


@pytest.mark.parametrize("kind", KINDS)
def test_every_model_reading_command_refuses_a_hostile_folder_in_one_line(tiny, tmp_path, capsys, kind):
    folder, problem = hostile(kind, tiny, tmp_path)
    for command, (script, _, argv) in COMMANDS.items():
        out = tmp_path / f"out-{command}"
        code, output = run_in_process(capsys, script, *argv(folder, out, tmp_path))
        assert_refused(command, folder, problem, code, output, out)


def test_the_gate_lets_the_folder_it_was_made_from_through(tiny, tmp_path):
    """The control: the untouched folder passes the gate (so each refusal above is the hostile change's)."""
    from pretrain.model_gate import check_model_folder

    names = check_model_folder(str(tiny), "--model.init_from")
    assert "model.layers.1.mlp.fc_in.weight" in names
    # the same weights as a plain sharded checkpoint (its shard inside the folder) pass too
    sharded = _copy(tiny, tmp_path / "sharded")
    os.replace(sharded / "model.safetensors", sharded / "model-00001-of-00001.safetensors")
    index = {"weight_map": dict.fromkeys(names, "model-00001-of-00001.safetensors")}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    assert check_model_folder(str(sharded), "--model.init_from") == names


def test_each_command_refuses_in_a_fresh_process_as_users_run_it(tiny, tmp_path):
    """One hostile folder per command, each command in its own process (`python SCRIPT` or `python -m MODULE`),
    started together: the one line is what a user sees, with nothing a library prints around it."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    started = {}
    for i, (command, (script, _, argv)) in enumerate(COMMANDS.items()):
        kind = KINDS[i % len(KINDS)]
        folder, problem = hostile(kind, tiny, tmp_path / command)
        out = tmp_path / command / "out"
        entry = [str(REPO / script)] if script.endswith(".py") else ["-m", script.removesuffix(".__main__")]
        args = [sys.executable, *entry, *map(str, argv(folder, out, tmp_path / command))]
        proc = subprocess.Popen(
            args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        started[command] = (proc, folder, problem, out)
    for command, (proc, folder, problem, out) in started.items():
        output = proc.communicate(timeout=300)[0]
        assert_refused(command, folder, problem, proc.returncode, output, out)
