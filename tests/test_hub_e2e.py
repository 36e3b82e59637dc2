"""Pretraining runs that push to the (offline, loopback) Hub, load from it elsewhere, and resume from it."""

import json
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TEST_TOKEN, TEST_USER
from kiln_testing import losses, run

from kiln.hub import CHECKPOINT_FOLDER, HubPusher

# A fresh interpreter where the project is unimportable (also through the editable install's finder):
# the model must load from the Hub repo alone, code included.
LOAD_FROM_HUB = r"""
import importlib.abc, json, sys

class RefuseRepoPackages(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pretrain", "finetune"):
            raise ImportError(f"remote code must not import {name}")

sys.meta_path.insert(0, RefuseRepoPackages())
import torch
from transformers import AutoModelForPreTraining, AutoTokenizer

repo = "REPO"
model = AutoModelForPreTraining.from_pretrained(repo, trust_remote_code=True).eval()
tokenizer = AutoTokenizer.from_pretrained(repo, trust_remote_code=False)  # no prompt, no code
batch = tokenizer("the old man looked at the sea", "and the sea looked back", return_tensors="pt")
with torch.no_grad():
    out = model(**batch)
print(json.dumps({
    "ids": batch["input_ids"][0].tolist(),
    "mlm": out.prediction_logits[0, :4, :8].tolist(),
    "nsp": out.seq_relationship_logits[0].tolist(),
    "module": type(model).__module__,
    "imported_pretrain": "pretrain" in sys.modules,
}))
"""


def _assert_token_absent(*roots: Path, texts: tuple[str, ...] = ()):
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file():
                assert TEST_TOKEN.encode() not in path.read_bytes(), f"token leaked into {path}"
    for text in texts:
        assert TEST_TOKEN not in text


@pytest.mark.slow
def test_push_every_save_then_load_elsewhere(hub, tmp_path, fresh_process, capfd, caplog):
    repo = f"{TEST_USER}/kiln-e2e"
    out = tmp_path / "run"
    caplog.set_level("INFO")  # as a run logs: INFO and up from every logger
    run(
        out,
        "--training.max_steps",
        4,
        "--training.save_steps",
        2,
        "--logging.report_to",
        "tensorboard",
        "--hub.push_to_hub",
        "--hub.model_id",
        repo,
        "--hub.strategy",
        "every_save",
        "--hub.dataset_name",
        "my-corpus",
    )

    # the pushes made dozens of requests; none of them is a log line (httpx logs one INFO line per request)
    requests = [
        r.getMessage() for r in caplog.records if r.name.startswith(("httpx", "httpcore"))
    ]  # httpx2 too
    assert not requests, requests[:3]
    files = hub.files(repo)
    for name in (
        "model.safetensors",
        "config.json",
        "configuration_kiln.py",
        "modeling_kiln_encoder.py",
        "kiln_layers.py",
        "kiln_masks.py",
        "kiln_losses.py",
        "kiln_positions.py",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
        "loss_curve.png",
    ):
        assert name in files, f"{name} missing from the pushed repo: {sorted(files)}"
    config = json.loads(files["config.json"])
    assert config["auto_map"]["AutoModelForPreTraining"].endswith("KilnEncoderForPreTraining")
    card = files["README.md"].decode()
    metadata = yaml.safe_load(card.split("---")[1])
    metric_types = {m["type"] for r in metadata["model-index"][0]["results"] for m in r["metrics"]}
    assert {"mlm_loss", "mlm_accuracy", "nsp_accuracy"} <= metric_types
    assert "license" not in metadata and "kiln" in metadata["tags"]  # no --hub.license: none claimed
    assert "No license was chosen for this model" in card and "with Kiln on my-corpus." in card
    # newest first: the final push after the in-training pushes (steps 2 and 4, possibly coalesced)
    titles = [c.title for c in hub.commits(repo)]
    assert titles[0] == "Final model" and any("step" in t for t in titles[1:]), titles

    stdout = fresh_process(LOAD_FROM_HUB.replace("REPO", repo))
    result_lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert result_lines, stdout
    child = json.loads(result_lines[-1])
    assert not child["imported_pretrain"] and child["module"].startswith("transformers_modules")

    from transformers import AutoModelForPreTraining, AutoTokenizer

    local = AutoModelForPreTraining.from_pretrained(out / "final").eval()
    tokenizer = AutoTokenizer.from_pretrained(out / "final")
    batch = tokenizer("the old man looked at the sea", "and the sea looked back", return_tensors="pt")
    assert batch["input_ids"][0].tolist() == child["ids"]
    with torch.no_grad():
        expected = local(**batch)
    torch.testing.assert_close(
        torch.tensor(child["mlm"]), expected.prediction_logits[0, :4, :8], rtol=0, atol=1e-5
    )
    torch.testing.assert_close(
        torch.tensor(child["nsp"]), expected.seq_relationship_logits[0], rtol=0, atol=1e-5
    )

    captured = capfd.readouterr()
    _assert_token_absent(out, texts=(captured.out, captured.err, card))
    for name, data in files.items():
        assert TEST_TOKEN.encode() not in data, f"token in pushed {name}"


def test_resume_from_the_hub_continues_exactly(hub, tmp_path):
    common = ["--training.max_steps", 6, "--training.eval_steps", 0]
    reference = tmp_path / "reference"
    run(reference, *common, "--training.save_steps", 3)

    # the `checkpoint` strategy pushes the resumable state under last-checkpoint/
    pushed = tmp_path / "pushed"
    run(
        pushed,
        *common,
        "--training.save_steps",
        3,
        "--hub.push_to_hub",
        "--hub.model_id",
        f"{TEST_USER}/with-state",
        "--hub.strategy",
        "checkpoint",
    )
    state_files = {k for k in hub.files(f"{TEST_USER}/with-state") if k.startswith(f"{CHECKPOINT_FOLDER}/")}
    assert f"{CHECKPOINT_FOLDER}/trainer_state.json" in state_files
    assert f"{CHECKPOINT_FOLDER}/optimizer.safetensors" in state_files
    _assert_token_absent(pushed)

    # a mid-run state on the Hub (step 3 of the reference run), continued on "another machine"
    pusher = HubPusher(f"{TEST_USER}/mid-run")
    pusher.push(
        reference / "checkpoints/step-00000003", path_in_repo=CHECKPOINT_FOLDER, commit_message="state"
    )
    assert pusher.wait()
    other = tmp_path / "other-machine"
    state = run(
        other,
        *common,
        "--training.save_steps",
        0,
        "--training.resume_from_checkpoint",
        f"hub:{TEST_USER}/mid-run",
    )
    assert state.global_step == 6
    expected, again = losses(reference), losses(other)
    assert sorted(again) == [4, 5, 6]
    assert all(again[step] == expected[step] for step in again), (again, expected)


def test_failing_hub_neither_stops_training_nor_loses_the_final_push(hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    # LFS path without xet: a failed commit comes back at once instead of after the client's own retries
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(HubPusher, "retry_backoff_s", 0.5)
    repo = f"{TEST_USER}/flaky"
    out = tmp_path / "flaky"
    hub.fail(status=500)

    def recover_once_exported():  # the Hub comes back only after training and the export are over
        deadline = time.time() + 300
        while time.time() < deadline and not (out / "final" / "README.md").exists():
            time.sleep(0.05)
        hub.recover()

    watcher = threading.Thread(target=recover_once_exported, daemon=True)
    watcher.start()
    state = run(
        out,
        "--training.max_steps",
        6,
        "--training.save_steps",
        2,
        "--hub.push_to_hub",
        "--hub.model_id",
        repo,
        "--hub.strategy",
        "every_save",
    )
    watcher.join(timeout=10)
    assert state.global_step == 6 and state.stop_reason == "max_steps"
    failed = [r for r in hub.requests() if r.status >= 500]
    assert failed, "pushes during training should have reached the failing Hub"
    files = hub.files(repo)
    assert "model.safetensors" in files and "README.md" in files
    assert hub.commits(repo)[0].title == "Final model"


def test_bad_hub_settings_are_one_line_errors(tmp_path):
    from kiln.errors import ConfigError

    with pytest.raises(ConfigError, match="--hub.model_id"):
        run(tmp_path / "a", "--hub.push_to_hub")
    with pytest.raises(ConfigError, match="hub.strategy"):
        run(tmp_path / "b", "--hub.push_to_hub", "--hub.model_id", "u/m", "--hub.strategy", "sometimes")
