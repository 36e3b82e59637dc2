"""The shipped BERT-base plan (configs/pretrain/bert-base-wiki-books.yaml, docs/scaling.md) as a CPU dry run: the
corpus prepared with that config, then 2 processes train from the prepared folder with the same config. Only
what a 2-core CI machine cannot hold is overridden, each for a stated reason (the full-size CPU dry run is in
docs/scaling.md)."""

from __future__ import annotations

import json

import pytest
import yaml
from kiln_testing import REPO, launch_two_processes

CONFIG = REPO / "configs/pretrain/bert-base-wiki-books.yaml"
TINY_CORPUS = ["--data.data_files", str(REPO / "data/pretrain/the_time_machine.txt")]  # one shipped book
MUST_SHRINK = [
    # BERT-base is 90M parameters with this corpus's vocabulary: minutes a step pair on CI's 2 cores
    "--model.num_hidden_layers",
    "2",
    "--model.hidden_size",
    "64",
    "--model.num_attention_heads",
    "2",
    "--model.intermediate_size",
    "256",
    # 1,024 sequences a step; 8 keeps 2 processes x 4 (the per-device batch is derived from the total as on GPUs)
    "--training.total_train_batch_size",
    "8",
    # 250k steps, 10k of warm-up, an evaluation every 10k, a checkpoint every 25k: 3 steps, each kind once
    "--training.max_steps",
    "3",
    "--training.warmup_steps",
    "1",
    "--training.eval_steps",
    "2",
    "--training.save_steps",
    "2",
    "--training.max_eval_batches",
    "1",
    # bf16 is the GPUs' precision; on CPU the accelerate config's (none) applies
    "--training.mixed_precision",
    "null",
    # no tracker to write to in CI; DataLoader workers would compete for the 2 cores
    "--logging.report_to",
    "none",
    "--logging.logging_steps",
    "1",
    "--data.num_workers",
    "0",
]


@pytest.mark.slow
def test_bert_base_config_dry_run_on_two_processes(tmp_path):
    from pretrain.data.__main__ import prepare_main

    shipped = yaml.safe_load(CONFIG.read_text())
    assert shipped["training"]["total_train_batch_size"] == 1024 and shipped["data"]["prepared"]
    prepared = tmp_path / "prepared"
    assert prepare_main(["--config", str(CONFIG), *TINY_CORPUS, "--output", str(prepared)]) == 0
    out = tmp_path / "run"
    launch_two_processes(out, *TINY_CORPUS, "--data.prepared", prepared, *MUST_SHRINK, config=CONFIG)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3]
    assert any("eval/mlm_loss" in r for r in rows)
    saved = yaml.safe_load((out / "config.yaml").read_text())
    # everything not overridden is the shipped plan's
    assert saved["model"]["objective"] == "mlm+nsp" and saved["tokenizer"]["vocab_size"] == 30522
    assert saved["data"]["max_seq_length"] == 128 and saved["training"]["lr"] == shipped["training"]["lr"]
    assert saved["training"]["per_device_train_batch_size"] == 4
    assert (out / "checkpoints" / "step-00000002").is_dir() and (
        out / "final" / "model.safetensors"
    ).is_file()
