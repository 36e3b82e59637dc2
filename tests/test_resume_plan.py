"""One resume plan (issue 53, step 2): a resume is decided once (kiln.resume), each checkpoint file is read and
hashed once per process, and the user's config is never rewritten with what the engine derives."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from pathlib import Path

import yaml
from kiln_testing import DEBUG, reset_accelerate, run

import kiln.file_hash
from kiln.checkpoint_files import CHECKSUMS_FILE, find_checkpoints

QUICK = ["--training.max_steps", 2, "--training.save_steps", 2, "--training.eval_steps", 0]


def test_a_resume_hashes_each_checkpoint_file_once(tmp_path, monkeypatch, caplog):
    """Before the plan, a local resume verified the checkpoint in run_job, start_run, prepare_output and
    Trainer.resume: 4 reads of every file per process (about 380 GB before step 1 for a 1B AdamW checkpoint on
    8 processes). Now the plan verifies it and nothing else hashes it."""
    out = tmp_path / "run"
    run(out, *QUICK, "--training.max_steps", 4)
    checkpoint = find_checkpoints(out)[0]
    assert checkpoint.name == "step-00000002"
    manifest = json.loads((checkpoint / CHECKSUMS_FILE).read_text())["files"]
    assert "model.safetensors" in manifest and "optimizer.safetensors" in manifest

    hashed: Counter[str] = Counter()
    real = kiln.file_hash.hash_file

    def counting(path):
        path = Path(path)
        if path.parent.resolve() == checkpoint.resolve() or checkpoint.resolve() in path.resolve().parents:
            hashed[path.resolve().relative_to(checkpoint.resolve()).as_posix()] += 1
        return real(path)

    monkeypatch.setattr(kiln.file_hash, "hash_file", counting)
    caplog.set_level(logging.INFO, logger="kiln")
    state = run(out, *QUICK, "--training.max_steps", 4, "--training.resume_from_checkpoint", checkpoint)
    assert f"resumed from {checkpoint} at step 2" in caplog.text and state.global_step == 4
    assert dict(hashed) == dict.fromkeys(manifest, 1)


def test_the_users_config_is_never_rewritten_and_the_run_records_what_was_derived(tmp_path):
    """The engine derives settings (the precision a run names none of, the per-device batch of a
    total_train_batch_size, a resume's batch layout): they go into the run's copy of the config, which
    config.yaml records, never into the config object the app handed run_job."""
    from kiln.config import build_config
    from pretrain.run import RunConfig, run_pretraining

    argv = ["--config", DEBUG, "--training.output_dir", str(tmp_path / "run"), *map(str, QUICK)]
    argv += ["--training.total_train_batch_size", "4", "--training.per_device_train_batch_size", "32"]
    config = build_config(RunConfig, argv)
    given = dataclasses.asdict(config)
    assert given["training"]["mixed_precision"] is None
    reset_accelerate()
    try:
        state = run_pretraining(config)
    finally:
        reset_accelerate()
    assert state.global_step == 2
    assert dataclasses.asdict(config) == given
    recorded = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["training"]
    assert recorded["per_device_train_batch_size"] == 4 and recorded["mixed_precision"] is not None
