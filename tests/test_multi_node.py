"""Two nodes x one process on loopback (gloo), on one shared run folder and on node-local disks: both nodes end
with status 0, the tokenizer and data reach node 1, checkpoints are written where each layout needs them, and
`--training.resume_from_checkpoint latest` continues the run exactly on both layouts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from kiln_testing import DEBUG, REPO, free_port, losses

from kiln import run_folder
from kiln.checkpoint_files import find_checkpoints

ARGS = [
    "--data.max_train_documents",
    8,
    "--training.max_steps",
    4,
    "--training.save_steps",
    2,
    "--training.eval_steps",
    0,
    "--training.max_eval_batches",
    1,
    "--training.per_device_train_batch_size",
    4,
    "--model.hidden_dropout_prob",
    0,
    "--model.attention_probs_dropout_prob",
    0,
]


def _can_unshare() -> str | None:
    """Why node-local disks cannot be simulated here (None: they can)."""
    if os.geteuid() != 0:
        return "node-local disks are simulated with a private mount namespace (unshare -m, mount --bind): needs root"
    if shutil.which("unshare") is None:
        return "node-local disks are simulated with unshare -m, which is not installed"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30)
    if probe.returncode:
        return f"unshare -m is not permitted here ({probe.stderr.decode().strip()[:100]})"
    return None


def start_two_nodes(run_dir, port: int, node_local: bool, *args) -> list[subprocess.Popen]:
    """Node 0 and node 1 of `accelerate launch --num_machines 2`, one process each, started. Node-local: node
    1 runs in its own mount namespace with its own disk bound over the run folder (it sees none of node 0's
    files and node 0 none of its own; a bind mount rather than a tmpfs so the disk outlives the namespace for
    the resume) and its own HF_HOME (its own datasets cache)."""
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_machines",
        "2",
        "--num_processes",
        "2",
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        str(port),
        "--rdzv_backend",
        "static",
    ]
    script = [
        str(REPO / "pretrain/run.py"),
        "--config",
        DEBUG,
        "--training.output_dir",
        str(run_dir),
        *map(str, args),
    ]
    run_dir.mkdir(parents=True, exist_ok=True)
    nodes = []
    for rank in (0, 1):
        command = [*launch, "--machine_rank", str(rank), *script]
        node_env = dict(env)
        if rank == 1 and node_local:
            disk = run_dir.with_name(run_dir.name + "-node1-disk")
            disk.mkdir(exist_ok=True)
            node_env["HF_HOME"] = str(run_dir.with_name(run_dir.name + "-node1-hf"))
            shell = f'mount --bind "{disk}" "{run_dir}" && exec "$@"'
            command = ["unshare", "-m", "sh", "-c", shell, "node1", *command]
        nodes.append(
            subprocess.Popen(
                command, cwd=REPO, env=node_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    return nodes


def finish(nodes: list[subprocess.Popen]) -> list[subprocess.CompletedProcess]:
    """What each node printed (stdout and stderr) and its status, once both have ended."""
    results = []
    try:
        for node in nodes:
            output, _ = node.communicate(timeout=600)
            results.append(subprocess.CompletedProcess(node.args, node.returncode, output))
    finally:
        for node in nodes:
            node.kill()
    return results


def two_nodes(run_dir, port: int, node_local: bool, *args) -> list[subprocess.CompletedProcess]:
    """`start_two_nodes`, waited for: both nodes must succeed."""
    results = finish(start_two_nodes(run_dir, port, node_local, *args))
    for rank, result in enumerate(results):
        assert result.returncode == 0, f"node {rank}:\n" + result.stdout[-3000:]
    return results


def _resume_latest(run_dir, disks, port: int, node_local: bool):
    """Drop the last checkpoint and the final model from every disk, resume `latest`: steps 3-4 again."""
    reference = losses(run_dir)
    for disk in disks:
        shutil.rmtree(find_checkpoints(disk)[-1])
        shutil.rmtree(disk / "final", ignore_errors=True)
    two_nodes(run_dir, port, node_local, *ARGS, "--training.resume_from_checkpoint", "latest")
    assert losses(run_dir) == reference  # steps 3 and 4 logged again, bit-identical


@pytest.mark.slow
def test_two_nodes_share_one_run_folder(tmp_path):
    run_dir = tmp_path / "run"
    two_nodes(run_dir, free_port(), False, *ARGS)
    checkpoint = find_checkpoints(run_dir)[-1]
    # one writer: both processes' random states in the one checkpoint, the files once
    assert {"rng_state_0.safetensors", "rng_state_1.safetensors", "model.safetensors"} <= {
        p.name for p in checkpoint.iterdir()
    }
    assert "save_on_each_node: false" in (run_dir / "config.yaml").read_text()
    _resume_latest(run_dir, [run_dir], free_port(), False)


@pytest.mark.slow
def test_two_nodes_with_node_local_disks(tmp_path):
    reason = _can_unshare()
    if reason:
        pytest.skip(reason)
    run_dir = tmp_path / "run"
    two_nodes(run_dir, free_port(), True, *ARGS)
    node1 = tmp_path / "run-node1-disk"
    # each node holds what it needs to go on: the config, the tokenizer and whole checkpoints
    for disk, rank in ((run_dir, 0), (node1, 1)):
        assert (disk / "tokenizer" / "tokenizer.json").is_file() and (disk / "config.yaml").is_file()
        assert [p.name for p in find_checkpoints(disk)] == ["step-00000002", "step-00000004"]
        names = {p.name for p in find_checkpoints(disk)[-1].iterdir()}
        assert {
            "model.safetensors",
            "optimizer.safetensors",
            "trainer_state.json",
            f"rng_state_{rank}.safetensors",
        } <= names
        assert json.loads((find_checkpoints(disk)[-1] / "trainer_state.json").read_text())["global_step"] == 4
        # each node's own record lists what that node wrote, so an overwrite there removes Kiln's files
        recorded = run_folder.read_record(disk) or {}
        written = {p.relative_to(disk).as_posix() for p in disk.rglob("*") if p.is_file()}
        assert {n for n in written if n.startswith(("checkpoints/", "tokenizer/"))} | {"config.yaml"} <= set(
            recorded
        )
    assert (run_dir / "tokenizer/tokenizer.json").read_bytes() == (
        node1 / "tokenizer/tokenizer.json"
    ).read_bytes()
    assert "save_on_each_node: true" in (run_dir / "config.yaml").read_text()
    assert (run_dir / "final" / "model.safetensors").is_file() and not (node1 / "final").exists()
    _resume_latest(run_dir, [run_dir, node1], free_port(), True)


@pytest.mark.slow
def test_a_refusal_on_node_1_is_said_by_node_1_and_no_link_is_written_through(tmp_path):
    """Node-local disks, node 1's folder refused at the start: a link at a staging name only node 1 writes (a
    tokenizer file's, written there as rank 0's tokenizer reaches node 1's disk), and a user's file where the
    overwritten run would write. Node 1 says why, in one line with its rank; node 0 says which node failed and
    where its error is; the file the link leads to is as it was."""
    from kiln.safe_write import link_refusal

    reason = _can_unshare()
    if reason:
        pytest.skip(reason)
    outside = tmp_path / "outside.json"
    outside.write_text('{"mine": true}\n')
    link_run, user_run = tmp_path / "link" / "run", tmp_path / "user" / "run"
    link = link_run.with_name("run-node1-disk") / "tokenizer" / ".tokenizer.json.tmp"
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    user_disk = user_run.with_name("run-node1-disk")
    user_disk.mkdir(parents=True)
    run_folder.start_record(user_disk)  # node 1's copy of a run, holding a user's file where the export goes
    (user_disk / "final").mkdir()
    (user_disk / "final" / "README.md").write_text("my notes\n")
    overwrite = "--training.overwrite_output_dir"
    starts = [start_two_nodes(run, free_port(), True, *ARGS, overwrite) for run in (link_run, user_run)]
    expected = {
        # as node 1 sees it: its own disk at the run folder's path
        link_run: link_refusal(link).replace(str(link), str(link_run / "tokenizer" / ".tokenizer.json.tmp")),
        user_run: f"output_dir {user_run} holds files Kiln did not write there or that changed since "
        "(final/README.md); move them out of the folder, or pick another --training.output_dir: "
        "--training.overwrite_output_dir removes only the files on the run's record, unchanged, and the new "
        "run would write where these are",
    }
    for run, nodes in zip(expected, starts):
        node0, node1 = finish(nodes)
        said = [line for line in node1.stdout.splitlines() if line.startswith("error: ")]
        assert said == [f"error: {expected[run]} (node 1, rank 1 of 2)"], node1.stdout[-3000:]
        assert "error: " not in node0.stdout, node0.stdout[-3000:]
        assert "stopped: node 1, rank 1 of 2 failed; its error is in that node's output" in node0.stdout
        assert node0.returncode != 0 and node1.returncode != 0
    assert outside.read_text() == '{"mine": true}\n' and os.readlink(link) == str(outside)
    assert (user_run.with_name("run-node1-disk") / "final" / "README.md").read_text() == "my notes\n"
