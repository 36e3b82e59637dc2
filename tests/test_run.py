"""The pretraining runner end to end on the debug config: checkpoints, exact resume, trackers, bad input."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from kiln_testing import DEBUG, DECODER, REPO, launch_two_processes, losses, run

from kiln.checkpoint_files import find_checkpoints
from kiln.errors import ConfigError


def test_debug_run_learns_and_leaves_a_loadable_model(tmp_path):
    from transformers import AutoModelForPreTraining, AutoTokenizer

    out = tmp_path / "enc"
    state = run(
        out,
        "--training.max_steps",
        40,
        "--training.lr",
        3e-3,
        "--training.save_steps",
        0,
        "--training.eval_steps",
        20,
    )
    assert state.global_step == 40
    curve = losses(out)
    first = sum(curve[s] for s in range(1, 6)) / 5
    last = sum(curve[s] for s in range(36, 41)) / 5
    # MLM starts at ln(vocab) + NSP ln(2) ~ 6.9; 40 steps of a 32-wide model reliably take off more than 0.3
    assert last < first - 0.3, f"loss did not fall: {first:.3f} -> {last:.3f}"

    final = out / "final"
    for name in (
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "README.md",
        "loss_curve.png",
        "kiln_config.yaml",
    ):
        assert (final / name).is_file(), name
    card = (final / "README.md").read_text()
    assert "mlm_accuracy" in card
    model = AutoModelForPreTraining.from_pretrained(final).eval()
    # the run trained with the sparse MLM fast paths; the saved model has BERT's output shapes
    assert not model.config.chunked_mlm_loss and not model.config.sparse_prediction
    tokenizer = AutoTokenizer.from_pretrained(final)
    batch = tokenizer("it was a dark night", "the rain fell", return_tensors="pt")
    out_logits = model(**batch)
    assert out_logits.prediction_logits.shape[-1] == model.config.vocab_size
    assert model.config.vocab_size % 64 == 0 and model.config.vocab_size >= len(tokenizer)
    eval_rows = [
        json.loads(line)
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if "eval/mlm_loss" in line
    ]
    assert len(eval_rows) == 2 and all(0 <= r["eval/nsp_accuracy"] <= 1 for r in eval_rows)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind,accumulation",
    [("encoder", 1), ("encoder", 2), ("decoder", 2), ("encoder-streaming", 1)],
)
def test_resume_continues_exactly(tmp_path, kind, accumulation):
    extra = {"decoder": DECODER, "encoder-streaming": ["--data.streaming"]}.get(kind, [])
    common = [
        *extra,
        "--training.gradient_accumulation_steps",
        accumulation,
        "--training.max_steps",
        8,
        "--training.eval_steps",
        0,
        "--training.save_total_limit",
        3,
    ]
    full = tmp_path / "full"
    run(full, *common, "--training.save_steps", 4)
    reference = losses(full)
    assert sorted(reference) == list(range(1, 9))

    # a second run picks up the step-4 checkpoint of the first and must retrace its steps 5..8 exactly
    resumed = tmp_path / "resumed"
    checkpoint = full / "checkpoints" / "step-00000004"
    state = run(resumed, *common, "--training.save_steps", 0, "--training.resume_from_checkpoint", checkpoint)
    assert state.global_step == 8
    again = losses(resumed)
    assert sorted(again) == [5, 6, 7, 8]
    for step in again:
        assert again[step] == reference[step], (step, again[step], reference[step])


def test_checkpoints_rotate_atomically(tmp_path):
    out = tmp_path / "rot"
    run(out, "--training.max_steps", 6, "--training.save_steps", 2, "--training.save_total_limit", 2)
    names = [p.name for p in find_checkpoints(out)]
    assert names == ["step-00000004", "step-00000006"]
    assert not list((out / "checkpoints").glob("*.tmp"))
    assert (
        json.loads((out / "checkpoints/step-00000006/trainer_state.json").read_text())["model_kind"]
        == "encoder"
    )
    # rotation removes only the files Kiln wrote: a user's file in a checkpoint stays, its folder set aside
    (out / "checkpoints/step-00000004/my_notes.txt").write_text("mine\n")
    run(
        out,
        "--training.max_steps",
        8,
        "--training.save_steps",
        2,
        "--training.save_total_limit",
        2,
        "--training.resume_from_checkpoint",
        "latest",
        "--training.allow_config_change",
        True,
    )
    assert [p.name for p in find_checkpoints(out)] == ["step-00000006", "step-00000008"]
    assert [p.name for p in (out / "checkpoints/step-00000004.kept").iterdir()] == ["my_notes.txt"]


def test_resume_latest_and_refusals(tmp_path):
    out = tmp_path / "run"
    run(out, "--training.max_steps", 3, "--training.save_steps", 3)
    with pytest.raises(ConfigError, match="already holds a run"):
        run(out, "--training.max_steps", 3)
    # latest: nothing left to do, but it must load and finish at the same step
    state = run(out, "--training.max_steps", 3, "--training.resume_from_checkpoint", "latest")
    assert state.global_step == 3
    with pytest.raises(ConfigError, match="model_kind"):
        run(out, *DECODER, "--training.max_steps", 3, "--training.resume_from_checkpoint", "latest")
    with pytest.raises(ConfigError, match="no checkpoint"):
        run(tmp_path / "empty", "--training.resume_from_checkpoint", "latest")
    with pytest.raises(ConfigError, match="not a Kiln checkpoint"):
        run(tmp_path / "other", "--training.resume_from_checkpoint", str(tmp_path))
    with pytest.raises(
        ConfigError, match=r"max_steps must be an integer >= 1, or -1 \(train by num_train_epochs\), got 0"
    ):
        run(tmp_path / "zero", "--training.max_steps", 0)
    state = run(out, "--training.max_steps", 2, "--training.overwrite_output_dir")
    assert state.global_step == 2 and [p.name for p in find_checkpoints(out)] == ["step-00000002"]


def test_trackers_write_files(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tracked"
    run(out, "--training.max_steps", 2, "--logging.report_to", "all", "--training.save_steps", 0)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = {(row["step"], key): value for row in rows for key, value in row.items() if key != "step"}
    assert {key for _, key in logged} >= {"train/loss", "train/lr", "eval/loss", "eval/mlm_accuracy"}
    # TensorBoard holds every value metrics.jsonl holds, at the same step (as float32)
    scalars = {}
    for folder in {path.parent for path in (out / "logs").rglob("events.out.tfevents.*")}:
        events = EventAccumulator(str(folder))
        events.Reload()
        scalars |= {
            (event.step, tag): event.value
            for tag in events.Tags()["scalars"]
            for event in events.Scalars(tag)
        }
    assert scalars.keys() == logged.keys()
    for key, value in logged.items():
        assert scalars[key] == pytest.approx(value, rel=1e-6), key
    # the offline wandb run holds them too: its record file carries each value as the JSON text metrics.jsonl has
    (record,) = (out / "wandb").glob("offline-run-*/*.wandb")
    raw = record.read_bytes()
    missing = [
        key
        for key, value in logged.items()
        if json.dumps(value).encode() not in raw or key[1].encode() not in raw
    ]
    assert not missing, missing


def _cli(args, env_extra=None, **kwargs):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    return subprocess.Popen(
        [sys.executable, str(REPO / "pretrain/run.py"), "--config", DEBUG, *map(str, args)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kwargs,
    )


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path):
    out = tmp_path / "sig"
    proc = _cli(
        [
            "--training.output_dir",
            out,
            "--training.max_steps",
            100000,
            "--training.save_steps",
            0,
            "--training.eval_steps",
            0,
        ]
    )
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    checkpoints = find_checkpoints(out)
    assert len(checkpoints) == 1, output
    saved_step = json.loads((checkpoints[0] / "trainer_state.json").read_text())["global_step"]
    assert saved_step >= 3 and max(losses(out)) == saved_step
    assert not (out / "final").exists()


def test_bad_config_is_one_line_error(tmp_path):
    proc = _cli(["--training.output_dir", tmp_path / "x", "--model.kind", "lstm"])
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert output.strip().splitlines()[-1].startswith("error: --model.kind must be")
    assert "Traceback" not in output


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_two_processes_match_one(tmp_path, kind):
    """DDP over 2 CPU processes with half the per-device batch follows the 1-process run (dropout off): the same
    losses and, for the encoder, the same masks (a function of seed, epoch and example, not of the rank) and
    the same evaluation (max_eval_batches counts batches of the whole evaluation), across an epoch boundary."""
    extra = (
        DECODER
        if kind == "decoder"
        else [
            "--data.max_train_documents",
            2,
            "--training.eval_steps",
            7,
            "--training.gradient_accumulation_steps",
            4,
        ]
    )
    common = [
        *extra,
        "--training.max_steps",
        4 if kind == "decoder" else 16,
        "--training.save_steps",
        0,
        "--model.hidden_dropout_prob",
        0,
        "--model.attention_probs_dropout_prob",
        0,
    ]
    if kind == "decoder":
        common += ["--training.eval_steps", 0]
    one = tmp_path / "one"
    run(one, *common, "--training.per_device_train_batch_size", 8)
    two = tmp_path / "two"
    launch_two_processes(two, *common, "--training.per_device_train_batch_size", 4)
    a, b = losses(one), losses(two)
    assert sorted(a) == sorted(b) == list(range(1, len(a) + 1)) and len(a) >= 4
    # tolerance: the same math in a different reduction order (gradient all-reduce, per-process sums)
    for step in a:
        assert abs(a[step] - b[step]) < 1e-4, (step, a[step], b[step])
    if kind == "encoder":
        rows = {}
        for name, folder in (("one", one), ("two", two)):
            lines = (folder / "metrics.jsonl").read_text().splitlines()
            rows[name] = [json.loads(line) for line in lines if "eval/mlm_loss" in line]
            assert max(r["train/epoch"] for r in map(json.loads, lines) if "train/epoch" in r) > 1
        assert len(rows["one"]) == len(rows["two"]) >= 2
        for x, y in zip(rows["one"], rows["two"]):
            assert x["eval/mlm_accuracy"] == pytest.approx(y["eval/mlm_accuracy"], abs=1e-9)
            assert x["eval/mlm_loss"] == pytest.approx(y["eval/mlm_loss"], abs=1e-4)


def test_stops_on_epochs_and_on_the_time_budget(tmp_path):
    by_epoch = run(
        tmp_path / "epochs",
        "--training.max_steps",
        -1,
        "--training.num_train_epochs",
        1,
        "--data.max_train_documents",
        12,
        "--training.per_device_train_batch_size",
        32,
        "--training.save_steps",
        0,
        "--training.eval_steps",
        0,
    )
    rows = [json.loads(line) for line in (tmp_path / "epochs" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "train/loss" in r]
    assert by_epoch.stop_reason == "epochs" and by_epoch.global_step == len(train_rows) > 1
    assert train_rows[-1]["train/epoch"] == pytest.approx(1.0)
    budget = run(
        tmp_path / "budget",
        "--training.max_steps",
        100000,
        "--training.max_train_time_s",
        0.001,
        "--training.save_steps",
        0,
        "--training.eval_steps",
        0,
    )
    # the budget is checked after each optimizer step: one step, then a checkpoint and the final export
    assert budget.stop_reason == "time_budget" and budget.global_step == 1
    assert [p.name for p in find_checkpoints(tmp_path / "budget")] == ["step-00000001"]
    assert (tmp_path / "budget" / "final" / "model.safetensors").is_file()


def test_total_batch_size_and_gradient_checkpointing(tmp_path):
    state = run(
        tmp_path / "gc",
        "--training.total_train_batch_size",
        12,
        "--training.gradient_accumulation_steps",
        2,
        "--training.gradient_checkpointing",
        "--training.max_steps",
        2,
        "--training.save_steps",
        0,
    )
    assert state.global_step == 2
    rows = [json.loads(line) for line in (tmp_path / "gc" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["train/tokens_per_s"] > 0 for r in rows if "train/loss" in r)
    # checkpointing recomputes activations in the backward pass (with the same dropout masks): the same training
    plain = run(
        tmp_path / "plain",
        "--training.total_train_batch_size",
        12,
        "--training.gradient_accumulation_steps",
        2,
        "--training.max_steps",
        2,
        "--training.save_steps",
        0,
    )
    assert plain.global_step == 2
    assert losses(tmp_path / "gc") == pytest.approx(losses(tmp_path / "plain"), rel=1e-6)
    saved = (tmp_path / "gc" / "config.yaml").read_text()
    # the saved config is the resolved one: 12 sequences = 1 process x 2 accumulation steps x 6
    assert "total_train_batch_size: 12" in saved and "per_device_train_batch_size: 6" in saved
    with pytest.raises(ConfigError, match="multiple of 2"):
        run(
            tmp_path / "odd",
            "--training.total_train_batch_size",
            7,
            "--training.gradient_accumulation_steps",
            2,
        )
