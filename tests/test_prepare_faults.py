"""Faults around a prepared corpus, met the way users meet them, each through the real command in a fresh process.

`python -m pretrain.data prepare`: a worker killed outright (the out-of-memory killer), Ctrl-C and SIGTERM with
worker processes, a full disk and a second prepare of the same part into one folder each end promptly in one
line, leave no process behind, and keep the finished shards. Training from the folder
(`pretrain/run.py --data.prepared`): a manifest cut short, a shard dropped from the manifest by hand, a shard
with flipped bits and a shard mangled beyond parsing (its checksum made to match) are each refused in one line
before anything trains.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from kiln_testing import with_terminal_signals

REPO = Path(__file__).resolve().parent.parent
DEBUG = REPO / "configs/pretrain/debug.yaml"


def _corpus(folder: Path, documents: int = 1300) -> None:
    lines = []
    for path in sorted((REPO / "data/pretrain").glob("*.txt")):
        lines += [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    folder.mkdir(parents=True)
    lines = lines[:documents]
    for number in range(3):
        part = lines[number::3]
        (folder / f"part{number}.txt").write_text("\n\n".join(part) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(config path, a prepared folder) of a small encoder corpus in 3 files, prepared by the CLI."""
    root = tmp_path_factory.mktemp("prepare-faults")
    _corpus(root / "corpus")
    config = yaml.safe_load(DEBUG.read_text())
    config["data"].update(data_files=[str(root / "corpus" / "*.txt")], max_train_documents=None)
    config["tokenizer"].update(input_sentence_size=2000)
    config_path = root / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    done = _prepare(config_path, root / "prepared")
    assert done.returncode == 0, done.stdout + done.stderr
    return config_path, root / "prepared"


@pytest.fixture(scope="module")
def long_setup(tmp_path_factory):
    """(config path, a prepared folder) of a corpus large enough that a prepare still has most of its ~1,700 shards
    ahead when its first one is written: a signal or a lost worker then always lands mid-prepare, on a busy
    machine or an idle one."""
    root = tmp_path_factory.mktemp("prepare-faults-long")
    _corpus(root / "corpus")
    for part in (root / "corpus").glob("*.txt"):
        part.write_text(part.read_text(encoding="utf-8") * 30, encoding="utf-8")
    config = yaml.safe_load(DEBUG.read_text())
    config["data"].update(data_files=[str(root / "corpus" / "*.txt")], max_train_documents=None)
    config["tokenizer"].update(input_sentence_size=2000)
    config_path = root / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    done = _prepare(config_path, root / "prepared", "--num_proc", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    return config_path, root / "prepared"


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def _prepare_argv(config_path, output, *extra) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pretrain.data",
        "prepare",
        "--config",
        str(config_path),
        "--output",
        str(output),
        "--shard_size_mb",
        "0.01",
        *map(str, extra),
    ]


def _prepare(config_path, output, *extra, timeout=300):
    return subprocess.run(
        _prepare_argv(config_path, output, *extra),
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _start(config_path, output, *extra):
    return subprocess.Popen(
        _prepare_argv(config_path, output, *extra),
        cwd=REPO,
        env=_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=with_terminal_signals,
    )


def _wait_for_a_shard(process, output: Path, timeout: float = 240) -> None:
    """Return once the prepare has written its first shard, with every process of it stopped (SIGSTOP), so that
    what the test does next lands mid-prepare however the machine schedules; `_resume` lets it go on."""
    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None and not list(output.glob("train-*.json")):
        time.sleep(0.005)
    os.killpg(process.pid, signal.SIGSTOP)
    assert process.poll() is None, process.communicate()
    assert list(output.glob("train-*.json")), "no shard was written in time"
    assert not (output / "manifest.json").exists(), "the prepare finished before it could be stopped"


def _resume(process) -> None:
    os.killpg(process.pid, signal.SIGCONT)


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def _no_process_left(group: int) -> None:
    deadline = time.time() + 10
    while time.time() < deadline:
        alive = [p for p in psutil.process_iter(["pid"]) if _group(p) == group]
        if not alive:
            return
        time.sleep(0.1)
    raise AssertionError(f"processes of the prepare still run: {alive}")


def _group(process) -> int | None:
    try:
        return os.getpgid(process.pid)
    except OSError:
        return None


def _finishes_like_the_reference(config_path, output: Path, reference: Path) -> None:
    done = _prepare(config_path, output, "--num_proc", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "already done" in done.stdout
    assert json.loads((output / "manifest.json").read_text()) == json.loads(
        (reference / "manifest.json").read_text()
    )


# ------------------------------------------------------------------------------------------------- prepare
@pytest.mark.slow
def test_a_worker_killed_outright_ends_the_prepare_in_one_line(long_setup, tmp_path):
    config_path, reference = long_setup
    output = tmp_path / "out"
    process = _start(config_path, output, "--num_proc", "2")
    _wait_for_a_shard(process, output)
    workers = psutil.Process(process.pid).children()
    assert len(workers) == 2, workers
    workers[0].send_signal(signal.SIGKILL)  # as the out-of-memory killer does
    _resume(process)
    _, stderr = process.communicate(timeout=60)  # a multiprocessing.Pool waited here forever
    assert process.returncode == 2
    assert "a worker process was killed (out of memory?" in _one_error_line(stderr)
    _no_process_left(process.pid)
    _finishes_like_the_reference(config_path, output, reference)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stopped_prepare_with_workers_says_one_line_and_leaves_no_process(long_setup, tmp_path, stop):
    config_path, reference = long_setup
    output = tmp_path / "out"
    process = _start(config_path, output, "--num_proc", "2")
    _wait_for_a_shard(process, output)
    if stop == signal.SIGINT:
        os.killpg(process.pid, stop)  # Ctrl-C reaches every process of the terminal's group
    else:
        process.send_signal(stop)  # a scheduler stops the command it started
    _resume(process)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert _one_error_line(stderr) == (
        "error: prepare: interrupted; finished shards are kept: run the same command again to continue"
    )
    _no_process_left(process.pid)
    _finishes_like_the_reference(config_path, output, reference)


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root")
def test_a_full_disk_during_prepare_is_one_line(setup, tmp_path):
    """The output folder on a 160 kB tmpfs (its own mount namespace): the tokenizer fits, the shards do not."""
    config_path, _ = setup
    output = tmp_path / "small-disk"
    output.mkdir()
    argv = " ".join(f"'{a}'" for a in _prepare_argv(config_path, output))
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=160k tmpfs '{output}' && {argv}"],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    line = _one_error_line(done.stderr)
    assert f"no space left on the device of {output}" in line and "run the same command again" in line


def test_a_second_prepare_of_the_same_part_into_one_folder_is_refused(setup, tmp_path):
    config_path, _ = setup
    output = tmp_path / "busy"
    output.mkdir()
    with open(output / ".prepare-0-of-1.lock", "a+") as held:  # what a running prepare holds
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242\n")
        held.flush()
        done = _prepare(config_path, output)
    assert done.returncode == 2
    assert _one_error_line(done.stderr) == (
        f"error: another prepare (PID 4242) is writing part 0/1 of {output}; wait for it to finish (or stop it), "
        "or prepare into another --output"
    )
    assert not list(output.glob("*.arrow")) and not (output / "tokenizer").exists()
    # another part of the same folder is not held up by it (parts on several machines share one folder)
    with open(output / ".prepare-0-of-2.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        done = _prepare(config_path, output, "--shard", "1/2")
    assert done.returncode == 0, done.stdout + done.stderr


# ------------------------------------------------------------------------------------------------- training
def _damage_copy(reference: Path, target: Path, damage) -> Path:
    shutil.copytree(reference, target)
    damage(target)
    return target


def _truncate_manifest(folder: Path) -> None:
    text = (folder / "manifest.json").read_text()
    (folder / "manifest.json").write_text(text[: len(text) // 2])


def _drop_a_shard(folder: Path) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["shards"]["train"].pop()
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _flip_bits(folder: Path) -> None:
    shard = folder / "train-00001.arrow"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10  # one bit inside a token id: the file still parses
    shard.write_bytes(bytes(data))


def _mangle_and_match_the_checksum(folder: Path) -> None:
    from pretrain.data.prepare import file_sha256

    shard = folder / "train-00001.arrow"
    data = bytearray(shard.read_bytes())
    data[: len(data) // 2] = os.urandom(len(data) // 2)
    shard.write_bytes(bytes(data))
    manifest = json.loads((folder / "manifest.json").read_text())
    for record in manifest["shards"]["train"]:
        if record["file"] == shard.name:
            record["sha256"] = file_sha256(str(shard))
    (folder / "manifest.json").write_text(json.dumps(manifest))


CASES = {
    "manifest-cut-short": (_truncate_manifest, "manifest.json is not valid JSON (cut short?); delete it"),
    "shard-dropped-from-manifest": (
        _drop_a_shard,
        "manifest.json does not list the shards plan.json planned",
    ),
    "bits-flipped": (_flip_bits, "shard train-00001.arrow differs from the sha256 its manifest records"),
    "mangled-beyond-parsing": (_mangle_and_match_the_checksum, "shard train-00001.arrow cannot be read"),
}


def _train(config_path, folder, out) -> subprocess.Popen:
    """`pretrain/run.py --data.prepared FOLDER` in a fresh process, as users run it."""
    return subprocess.Popen(
        [
            sys.executable,
            "pretrain/run.py",
            "--config",
            str(config_path),
            "--data.prepared",
            str(folder),
            "--training.output_dir",
            str(out),
            "--training.max_steps",
            "2",
        ],
        cwd=REPO,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _train_in_process(capsys, config_path, folder, out) -> tuple[int, str]:
    """The same command line in this process (`pretrain.run.cli`, its one-line errors): (exit status, stderr)."""
    from kiln_testing import reset_accelerate

    from pretrain.run import cli

    capsys.readouterr()
    reset_accelerate()
    try:
        with pytest.raises(SystemExit) as exit_info:
            cli(
                [
                    "--config",
                    str(config_path),
                    "--data.prepared",
                    str(folder),
                    "--training.output_dir",
                    str(out),
                    "--training.max_steps",
                    "2",
                ]
            )
    finally:
        reset_accelerate()
    return exit_info.value.code, capsys.readouterr().err


@pytest.mark.slow
def test_damaged_prepared_folders_are_refused_in_one_line_before_training(setup, tmp_path, capsys):
    """The first case through the command in a fresh process (run alongside), the others in this process through
    the same command line (`pretrain.run.cli`); the undamaged folder trains."""
    from kiln_testing import run_main

    from pretrain.run import main

    config_path, reference = setup
    assert len(json.loads((reference / "manifest.json").read_text())["shards"]["train"]) >= 3
    fresh = None
    for name, (damage, message) in CASES.items():
        folder = _damage_copy(reference, tmp_path / name, damage)
        if fresh is None:
            fresh = (name, message, _train(config_path, folder, tmp_path / f"run-{name}"))
            continue
        status, stderr = _train_in_process(capsys, config_path, folder, tmp_path / f"run-{name}")
        assert status == 2, (name, stderr[-3000:])
        line = _one_error_line(stderr)
        assert message in line, (name, line)
        assert not (tmp_path / f"run-{name}" / "final").exists()
    name, message, proc = fresh
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 2, (name, stderr[-3000:])
    line = _one_error_line(stderr)
    assert message in line, (name, line)
    assert not (tmp_path / f"run-{name}" / "final").exists()
    # the undamaged folder trains
    state = run_main(
        main,
        "--config",
        config_path,
        "--data.prepared",
        reference,
        "--training.output_dir",
        tmp_path / "run-ok",
        "--training.max_steps",
        2,
    )
    assert state.global_step == 2 and (tmp_path / "run-ok" / "final").is_dir()


# ------------------------------------------------------------------------------- a manifest names its own files
def _record(folder: Path, name: str) -> dict:
    return next(
        r for r in json.loads((folder / "manifest.json").read_text())["shards"]["train"] if r["file"] == name
    )


def _rename_in_manifest(folder: Path, name: str, new: str) -> None:
    """The shard `name` called `new` in manifest.json and plan.json alike (so that the two still agree)."""
    manifest = json.loads((folder / "manifest.json").read_text())
    for record in manifest["shards"]["train"]:
        if record["file"] == name:
            record["file"] = new
    (folder / "manifest.json").write_text(json.dumps(manifest))
    plan = json.loads((folder / "plan.json").read_text())
    stem, new_stem = name.rsplit(".", 1)[0], new.rsplit(".", 1)[0]
    plan["shards"]["train"] = [new_stem if n == stem else n for n in plan["shards"]["train"]]
    (folder / "plan.json").write_text(json.dumps(plan))


def _outside(folder: Path, how: str) -> None:
    """The shard train-00001.arrow moved out of the folder, its bytes (and so its size and sha256) unchanged, and
    named by the manifest as a path leading out of the folder, by an absolute path, through a symbolic link, or by
    plan.json (manifest.json deleted: training merges the shards' .json files)."""
    outside = folder.parent / f"{folder.name}-outside"
    outside.mkdir()
    moved = outside / "train-00001.arrow"
    (folder / "train-00001.arrow").rename(moved)
    if how == "dotdot":
        _rename_in_manifest(folder, "train-00001.arrow", f"../{outside.name}/train-00001.arrow")
    elif how == "absolute":
        _rename_in_manifest(folder, "train-00001.arrow", str(moved))
    elif how == "symlink":
        (folder / "train-00001.arrow").symlink_to(moved)
    else:  # plan.json names ../outside/train-00001, whose .json sidecar names the shard's file
        (folder / "train-00001.json").rename(outside / "train-00001.json")
        plan = json.loads((folder / "plan.json").read_text())
        plan["shards"]["train"] = [
            f"../{outside.name}/train-00001" if n == "train-00001" else n for n in plan["shards"]["train"]
        ]
        (folder / "plan.json").write_text(json.dumps(plan))
        (folder / "manifest.json").unlink()


def _another_dtype(folder: Path) -> None:
    """train-00001.arrow rewritten with the same column names but 64-bit token ids and a text hash, its size and
    sha256 recorded in the manifest (as anyone editing a folder can)."""
    import pyarrow as pa

    from pretrain.data.prepare import file_sha256

    shard = folder / "train-00001.arrow"
    with pa.memory_map(str(shard)) as source:
        table = pa.ipc.open_stream(source).read_all()
    table = table.cast(
        pa.schema([("sentence_ids", pa.list_(pa.list_(pa.int64()))), ("document_hash", pa.string())])
    )
    with pa.OSFile(str(shard), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    manifest = json.loads((folder / "manifest.json").read_text())
    for record in manifest["shards"]["train"]:
        if record["file"] == shard.name:
            record.update(bytes=shard.stat().st_size, sha256=file_sha256(str(shard)))
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.slow
def test_a_manifest_names_only_files_of_its_own_folder(setup, tmp_path, capsys):
    """Shard names are plain file names inside the prepared folder: a name leading out of it (`../x`, an absolute
    path, a symbolic link, or such a name in plan.json) is refused in one line before the file is read, even when
    the file outside is a valid shard with the recorded sha256; a shard with the right column names but other
    types is one line too. Through the training command: `../x` in a fresh process (run alongside), the others
    through the same command line in this process (`pretrain.run.cli`)."""
    config_path, reference = setup
    cases = {how: (lambda f, how=how: _outside(f, how)) for how in ("dotdot", "absolute", "symlink", "plan")}
    cases["dtype"] = _another_dtype
    folders = {name: _damage_copy(reference, tmp_path / name, damage) for name, damage in cases.items()}
    fresh = _train(config_path, folders["dotdot"], tmp_path / "run-dotdot")
    expected = {
        "dotdot": f"manifest.json names the shard '../{'dotdot'}-outside/train-00001.arrow', which is not a plain "
        "file name in the folder",
        "absolute": f"manifest.json names the shard '{tmp_path / 'absolute-outside' / 'train-00001.arrow'}', which "
        "is not a plain file name in the folder",
        "symlink": "manifest.json names the shard 'train-00001.arrow', which is a symbolic link leading out of the "
        "folder",
        "plan": "plan.json names the shard '../plan-outside/train-00001.json', which is not a plain file name",
        "dtype": "shard train-00001.arrow cannot be read (ArrowInvalid: columns sentence_ids: "
        "list<item: list<item: int64>>, document_hash: string, not those of a prepared shard)",
    }
    for name, folder in sorted(
        folders.items(), key=lambda item: item[0] == "dotdot"
    ):  # the fresh process last
        if name == "dotdot":
            _, stderr = fresh.communicate(timeout=300)
            status = fresh.returncode
        else:
            status, stderr = _train_in_process(capsys, config_path, folder, tmp_path / f"run-{name}")
        assert status == 2, (name, stderr[-3000:])
        line = _one_error_line(stderr)
        assert line.startswith(f"error: --data.prepared {folder}"), (name, line)
        assert expected[name] in line, (name, line)
        assert not (tmp_path / f"run-{name}" / "final").exists()
