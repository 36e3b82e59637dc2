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


# ----------------------------------------------------------------------------------------------------------
# weights only in torch's pickle format (pytorch_model.bin): never unpickled unless the user opts in

WRONG_TENSOR = "model.layers.1.mlp.fc_in.weight"


def pickled(tiny: Path, root: Path, wrong_shape: bool = False) -> Path:
    """A copy of `tiny` whose weights are only in pytorch_model.bin (`torch.save` of its tensors, as
    `save_pretrained(safe_serialization=False)` writes them); with `wrong_shape`, one tensor of the second block a
    row short (found only by reading every tensor's shape)."""
    import torch
    from safetensors.torch import load_file

    folder = _copy(tiny, root / ("pickled-wrong-shape" if wrong_shape else "pickled") / "model")
    tensors = load_file(folder / "model.safetensors")
    if wrong_shape:
        tensors[WRONG_TENSOR] = tensors[WRONG_TENSOR][:-1].clone()
    torch.save(tensors, folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    return folder


def pickle_problem(command: str, folder: Path) -> str:
    """The one line's problem and fix for a folder of pickled weights, without the opt-in: the fix is convert's
    --trust_pickles (for convert itself, the flag; for ONNX export, a round trip back to a Kiln folder)."""
    from pretrain.convert import PICKLE_FIX as CONVERT_FIX
    from pretrain.export_onnx import PICKLE_FIX as EXPORT_FIX

    said = (
        "its weights are only in pytorch_model.bin, torch's pickle format, which Kiln does not unpickle unless you "
        "opt in (unpickling can run code); "
    )
    if command == "convert":
        return said + CONVERT_FIX
    if command == "export_onnx":
        return said + EXPORT_FIX.format(folder=folder)
    option = COMMANDS[command][1]
    return said + (
        f"convert them to safetensors first with `python -m pretrain.convert {folder} DST --trust_pickles` (only "
        f"for a file you trust) and point {option} at DST"
    )


def shape_problem(tiny: Path) -> str:
    from safetensors import safe_open

    with safe_open(tiny / "model.safetensors", "pt") as f:
        expected = tuple(f.get_slice(WRONG_TENSOR).get_shape())
    found = (expected[0] - 1, expected[1])
    return f"its weights' {WRONG_TENSOR} is {found} but its config.json gives {expected} (KilnEncoderForPreTraining){WRONG}"


@pytest.mark.parametrize("wrong_shape", [False, True], ids=["pickled", "pickled-wrong-shape"])
def test_every_command_refuses_pickled_weights_without_the_opt_in(
    tiny, tmp_path, capsys, monkeypatch, wrong_shape
):
    """Whatever the pickle holds, no command loads it: the gate refuses first, naming the fix."""
    import torch

    folder = pickled(tiny, tmp_path, wrong_shape)
    loads = []
    real_load = torch.load
    monkeypatch.setattr(
        torch, "load", lambda *args, **kwargs: loads.append(args) or real_load(*args, **kwargs)
    )
    for command, (script, _, argv) in COMMANDS.items():
        out = tmp_path / f"out-{command}"
        code, output = run_in_process(capsys, script, *argv(folder, out, tmp_path))
        assert_refused(command, folder, pickle_problem(command, folder), code, output, out)
        assert output.strip().endswith(pickle_problem(command, folder)), (command, output)
    assert not loads, f"a pickle was loaded: {loads}"


def test_convert_with_the_opt_in_checks_every_pickled_tensor_then_converts(tiny, tmp_path, capsys):
    """`--trust_pickles`: the shapes are read from the loaded state dict and checked against the config before
    anything is built (a wrong one is one line); right ones convert to the same weights as the safetensors do."""
    import torch
    from safetensors.torch import load_file

    wrong = pickled(tiny, tmp_path, wrong_shape=True)
    out = tmp_path / "out-wrong"
    code, output = run_in_process(capsys, "pretrain.convert", wrong, out, "--trust_pickles")
    assert_refused("convert", wrong, shape_problem(tiny), code, output, out)

    folder = pickled(tiny, tmp_path)
    code, output = run_in_process(capsys, "pretrain.convert", folder, tmp_path / "bert", "--trust_pickles")
    assert code == 0, output[-3000:]
    code, output = run_in_process(capsys, "pretrain.convert", tiny, tmp_path / "bert-from-safetensors")
    assert code == 0, output[-3000:]
    ours, theirs = (
        load_file(tmp_path / name / "model.safetensors") for name in ("bert", "bert-from-safetensors")
    )
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[key], theirs[key]) for key in ours)


def test_convert_with_the_opt_in_still_builds_no_object_a_pickle_names(tiny, tmp_path, capsys):
    """The opt-in reads tensors only (torch's restricted unpickler): a pickle that would run code when loaded
    is refused in one line, and its code never runs."""
    import pickle

    folder = _copy(tiny, tmp_path / "planted" / "model")
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "ran"

    class Planted:
        def __reduce__(self):
            return (Path.write_text, (marker, "the pickle's code ran"))

    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"weight": Planted()}))
    out = tmp_path / "out"
    code, output = run_in_process(capsys, "pretrain.convert", folder, out, "--trust_pickles")
    problem = (
        "its pytorch_model.bin is not a plain tensor file (it holds Python objects, which are not loaded)"
    )
    assert_refused("convert", folder, problem, code, output, out)
    assert not marker.exists()


@pytest.mark.slow
def test_each_command_refuses_in_a_fresh_process_as_users_run_it(tiny, tmp_path):
    """Each command in its own process (`python SCRIPT` or `python -m MODULE`), all started together, each given
    another of the hostile folders (the six kinds above, and pickled weights holding a wrong shape), and
    `convert --trust_pickles` on the pickled one: the one line on stderr is all a user sees, with nothing a library
    prints around it and nothing on stdout (exit status 2, nothing written). The tests above give every folder to
    every command in this process."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    pickle_folder = pickled(tiny, tmp_path, wrong_shape=True)
    assert (
        len(COMMANDS) == len(KINDS) + 1
    )  # one folder a command: every kind, and the pickle, in a fresh process
    runs = []
    for command, kind in zip(COMMANDS, (*KINDS, "pickled")):
        if kind == "pickled":
            folder, problem = pickle_folder, pickle_problem(command, pickle_folder)
        else:
            folder, problem = hostile(kind, tiny, tmp_path / command)
        runs.append((command, folder, [], problem))
    runs.append(("convert", pickle_folder, ["--trust_pickles"], shape_problem(tiny)))
    started = []
    for i, (command, folder, extra, problem) in enumerate(runs):
        script, _, argv = COMMANDS[command]
        out, root = tmp_path / f"out-{i}", tmp_path / f"root-{i}"
        root.mkdir()
        entry = [str(REPO / script)] if script.endswith(".py") else ["-m", script.removesuffix(".__main__")]
        args = [sys.executable, *entry, *map(str, argv(folder, out, root)), *extra]
        proc = subprocess.Popen(
            args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        started.append((command, folder, proc, problem, out))
    for command, folder, proc, problem, out in started:
        stdout, stderr = proc.communicate(timeout=300)
        assert_refused(command, folder, problem, proc.returncode, stdout + stderr, out)
        assert problem in stderr and not stdout.strip(), (command, stdout, stderr)


def test_a_hub_repo_is_told_pickle_only_from_the_hub_or_from_the_cache_offline(tmp_path, monkeypatch):
    """`hub_pickle_only`, which makes the gate refuse a Hub id before anything is downloaded: from the Hub's file
    list online (no safetensors weights, a pytorch_model.bin), from the Hugging Face cache offline; a Hub that
    cannot answer says nothing (the load that follows says why)."""
    from huggingface_hub import HfApi, constants

    from kiln.model_files import hub_pickle_only

    present: set[str] = set()
    monkeypatch.setattr(HfApi, "file_exists", lambda self, repo, name, revision=None: name in present)
    present |= {"config.json", "pytorch_model.bin"}
    assert hub_pickle_only("someone/pickled") is True
    present.add("model.safetensors")
    assert hub_pickle_only("someone/pickled") is False
    present -= {"model.safetensors", "pytorch_model.bin"}
    present.add("pytorch_model.bin.index.json")  # sharded pickles
    assert hub_pickle_only("someone/pickled") is True

    def unreachable(self, repo, name, revision=None):
        raise OSError("no network")

    monkeypatch.setattr(HfApi, "file_exists", unreachable)
    assert hub_pickle_only("someone/pickled") is False

    # offline: what the cache holds (huggingface_hub's layout: refs/main names the snapshot)
    cache = tmp_path / "hub"
    snapshot = cache / "models--someone--cached" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (cache / "models--someone--cached" / "refs").mkdir()
    (cache / "models--someone--cached" / "refs" / "main").write_text("a" * 40)
    (snapshot / "config.json").write_text("{}")
    (snapshot / "pytorch_model.bin").write_bytes(b"\x80\x02")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert hub_pickle_only("someone/cached") is True
    (snapshot / "model.safetensors").write_bytes(b"")
    assert hub_pickle_only("someone/cached") is False
    assert hub_pickle_only("someone/not-cached") is False
