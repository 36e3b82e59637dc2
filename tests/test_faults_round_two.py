"""Faults and bad input, round two (issue 24): each case run the way a user meets it, the script's command line
or `accelerate launch` in a fresh process, ending on one line that names the problem and the fix."""

import os
import subprocess
import sys

from kiln_testing import DEBUG, REPO
from test_finetune_scripts import kiln_checkpoints, synthetic_ner_sentences, write_conll  # noqa: F401


def script_cli(script: str, *args, env_extra=None, timeout=300) -> tuple[int, str]:
    """`python SCRIPT ARGS...` from the repo root in a fresh process: (exit status, stdout + stderr)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env_extra or {})}
    done = subprocess.run([sys.executable, str(REPO / script), *map(str, args)], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)  # fmt: skip
    return done.returncode, done.stdout


def assert_one_line_error(status: int, output: str) -> str:
    assert status == 2 and "Traceback" not in output, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: "), output
    return last


# ----------------------------------------------------------------------------------------------------------
# item 7: a CoNLL line that lost its tag column


def test_a_conll_word_line_without_its_tag_is_named_not_learnt_as_a_tag(kiln_checkpoints, tmp_path):  # noqa: F811
    encoder, _ = kiln_checkpoints
    train = write_conll(tmp_path / "train.txt", synthetic_ner_sentences(16, 0))
    lines = train.read_text().splitlines()
    broken = next(i for i, line in enumerate(lines) if line.endswith(" O") and i > 4)
    lines[broken] = lines[broken].split()[0]  # "w2 O" -> "w2"
    train.write_text("\n".join(lines) + "\n")
    out = tmp_path / "tag"
    status, output = script_cli("finetune/tag.py", "--model.checkpoint", encoder, "--training.output_dir", out,
                                "--data.train_file", train, "--data.validation_file", train,
                                "--data.test_file", train, "--training.max_steps", 1)  # fmt: skip
    message = assert_one_line_error(status, output)
    assert message == (f"error: {train}:{broken + 1} has no tag column (just {lines[broken]!r}); give every word "
                       "line its tag, or pick --data.tag_column / --data.token_column"), output  # fmt: skip
    assert not out.exists()


# ----------------------------------------------------------------------------------------------------------
# item 13: MLM alone on more than one process


def multi_process_launch(script: str, *args, env_extra=None, timeout=300) -> tuple[int, str]:
    """`accelerate launch --multi_gpu --num_processes 2 SCRIPT ARGS...` on CPU (torchrun's agent, gloo)."""
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]  # fmt: skip
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ACCELERATE_", "FSDP_"))}
    env = {**env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
           "ACCELERATE_USE_CPU": "1", **(env_extra or {})}  # fmt: skip
    done = subprocess.run([*launch, str(REPO / script), *map(str, args)], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)  # fmt: skip
    return done.returncode, done.stdout


def test_mlm_alone_trains_on_two_processes_and_exports_a_fill_mask_model(tmp_path):
    import json

    import torch
    from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoTokenizer

    import pretrain.modeling  # noqa: F401  (registers Kiln with the Auto classes, as the fine-tuning scripts do)

    out = tmp_path / "mlm"
    status, output = multi_process_launch(
        "pretrain/run.py", "--config", DEBUG, "--model.objective", "mlm", "--training.output_dir", out,
        "--training.max_steps", 3, "--training.eval_steps", 3, "--training.save_steps", 0,
    )  # fmt: skip
    assert status == 0, output[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "train/loss" in row] == [1, 2, 3]
    assert any("eval/mlm_loss" in row for row in rows)
    final = out / "final"
    assert json.loads((final / "config.json").read_text())["architectures"] == ["KilnEncoderForMaskedLM"]
    # what the fine-tuning scripts and transformers' Auto classes do with it: no pooler or NSP head was trained
    tokenizer = AutoTokenizer.from_pretrained(final)
    model = AutoModelForMaskedLM.from_pretrained(final, trust_remote_code=True).eval()
    inputs = tokenizer(f"the {tokenizer.mask_token} sat", return_tensors="pt")
    with torch.no_grad():
        assert model(**inputs).logits.shape[-1] == model.config.vocab_size
    _, info = AutoModelForSequenceClassification.from_pretrained(final, output_loading_info=True, num_labels=2)
    assert all(key.startswith(("classifier.", "model.pooler.")) for key in info["missing_keys"]), info
