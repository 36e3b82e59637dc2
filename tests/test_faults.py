"""Faults and bad input (issue 16): nothing lost, nothing hangs, every mistake a one-line error naming the fix.

Killed runs resume and finish, a stalled Hub costs a bounded wait, damaged checkpoints are skipped, changed
configs are refused on resume, and bad settings fail before the output folder is touched."""

import json
import os
import signal
import subprocess
import sys

import pytest
from kiln_testing import DEBUG, REPO, cli_in_process, losses, nan_loss_at_forward, run

from kiln.checkpoint_files import find_checkpoints
from kiln.errors import ConfigError
from kiln.trainer import Trainer

QUICK = ["--training.eval_steps", 0]


def _signal_self_at(monkeypatch, step: int):
    """Send this process a real SIGTERM once the loop logs `step` (the Trainer's own handler receives it)."""
    original = Trainer._log
    sent = []

    def log_then_signal(self, metrics):
        original(self, metrics)
        if self.state.global_step >= step and not sent:
            sent.append(step)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Trainer, "_log", log_then_signal)
    return sent


def _cli(args, *, launcher=(), env_extra=None, env_drop=()):
    env = {key: value for key, value in os.environ.items() if key not in env_drop}
    env = {**env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), **(env_extra or {})}
    return subprocess.Popen(
        [*launcher, str(REPO / "pretrain/run.py"), "--config", DEBUG, *map(str, args)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


# `kiln-launch` (kiln/launcher.py): `accelerate launch` that ends with the training processes' own status and line
KILN_LAUNCH = (
    sys.executable,
    "-m",
    "kiln.launcher",
    "--num_processes",
    "1",
    "--num_machines",
    "1",
    "--mixed_precision",
    "no",
    "--dynamo_backend",
    "no",
)
KILN_LAUNCH_2 = (
    *KILN_LAUNCH[:3],
    "--multi_gpu",
    "--num_processes",
    "2",
    "--main_process_port",
    "0",
    *KILN_LAUNCH[5:],
)
CPU_PROCESSES = {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}


# ----------------------------------------------------------------------------------------------------------
# item 3: save_total_limit


def test_save_total_limit_zero_keeps_every_checkpoint_and_negative_is_refused(tmp_path):
    out = tmp_path / "keep-all"
    run(out, "--training.max_steps", 4, "--training.save_steps", 2, "--training.save_total_limit", 0, *QUICK)
    assert [p.name for p in find_checkpoints(out)] == ["step-00000002", "step-00000004"]
    with pytest.raises(ConfigError, match="save_total_limit"):
        run(tmp_path / "neg", "--training.save_total_limit", -1)
    assert not (tmp_path / "neg").exists()


# ----------------------------------------------------------------------------------------------------------
# item 1: SIGTERM, then resume, finishes


def test_resume_after_sigterm_trains_to_the_end_and_writes_final(tmp_path, monkeypatch):
    out = tmp_path / "sig"
    common = ["--training.max_steps", 6, "--training.save_steps", 0, *QUICK]
    sent = _signal_self_at(monkeypatch, 3)
    stopped = run(out, *common)
    assert sent and stopped.stop_reason == "signal" and not (out / "final").exists()
    assert [p.name for p in find_checkpoints(out)] == [f"step-{stopped.global_step:08d}"]
    monkeypatch.undo()

    resumed = run(out, *common, "--training.resume_from_checkpoint", "latest")
    assert resumed.global_step == 6 and resumed.stop_reason == "max_steps"
    assert (out / "final" / "model.safetensors").is_file()
    # resuming once more (nothing left to train) still ends with a final model, not "stopped by signal"
    again = run(out, *common, "--training.resume_from_checkpoint", "latest")
    assert again.stop_reason != "signal"


def test_classify_resume_after_sigterm_writes_final(tmp_path, monkeypatch, kiln_checkpoints):
    from test_finetune_scripts import classify, write_sentiment

    encoder, _ = kiln_checkpoints
    files = write_sentiment(tmp_path, sizes=(64, 16, 8))
    out = tmp_path / "cls"
    args = [
        "--model.checkpoint",
        encoder,
        "--training.output_dir",
        out,
        "--logging.logging_steps",
        1,
        "--data.train_file",
        files["train"],
        "--data.validation_file",
        files["validation"],
        "--data.test_file",
        files["test"],
        "--training.num_train_epochs",
        2,
        "--training.per_device_train_batch_size",
        16,
    ]
    _signal_self_at(monkeypatch, 2)
    stopped = classify(*args)
    assert stopped.final_dir is None and stopped.state.stop_reason == "signal"
    monkeypatch.undo()
    result = classify(*args, "--training.resume_from_checkpoint", "latest")
    assert result.state.global_step == 8 and result.final_dir is not None
    assert (out / "final" / "model.safetensors").is_file() and (out / "predictions_test.jsonl").is_file()


# ----------------------------------------------------------------------------------------------------------
# item 2: a Hub that accepts connections and never answers


@pytest.mark.slow
def test_stalled_hub_costs_a_bounded_wait_then_one_line_error_and_exit_1(tmp_path, hub):
    hub.stall()
    out = tmp_path / "stalled"
    proc = _cli(
        [
            "--training.output_dir",
            out,
            "--training.max_steps",
            2,
            "--training.save_steps",
            0,
            *QUICK,
            "--hub.push_to_hub",
            "--hub.model_id",
            "kiln-test/stalled",
            "--hub.timeout_s",
            1,
            "--hub.final_push_timeout_s",
            3,
        ],
        launcher=KILN_LAUNCH,
    )
    try:
        output, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 1, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: the final model is saved locally in") and "did not complete" in last, (
        output
    )
    assert "Traceback" not in output
    assert (out / "final" / "model.safetensors").is_file()
    assert hub.requests(), "the run should have reached the stalling Hub"


# ----------------------------------------------------------------------------------------------------------
# item 7: SIGTERM to the launcher, and the launcher's ending: tests/test_launching.py


@pytest.mark.slow
def test_sigterm_during_set_up_stops_with_status_0_and_loses_nothing(tmp_path):
    """A SIGTERM while the tokenizer is trained and the data built (before the loop's handler): one line and
    status 0, or, where Python swallowed the stop (inside a callback), a stop at the first step with a checkpoint."""
    out = tmp_path / "early"
    proc = _cli(
        ["--training.output_dir", out, "--training.max_steps", 100000, "--training.save_steps", 0, *QUICK],
        launcher=(sys.executable,),
    )
    lines = []
    for line in proc.stdout:  # the tokenizer is trained once the corpus is read: set-up is under way
        lines.append(line)
        if "training a wordpiece tokenizer" in line:
            proc.send_signal(signal.SIGTERM)
            break
    try:
        rest, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    output = "".join(lines) + rest
    assert proc.returncode == 0, output
    last = output.strip().splitlines()[-1]
    if last.startswith("stopped by signal at step"):  # the fallback: the Trainer saw the pending signal
        (checkpoint,) = find_checkpoints(out)
        assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == max(losses(out))
    else:
        assert (
            last
            == "stopped by SIGTERM outside the training loop; checkpoints and models completed before it are kept"
        )
        assert not find_checkpoints(out)
        assert "Traceback" not in output
    # the folder (if made) holds no checkpoint, so the same command starts over in it
    again = run(out, "--training.max_steps", 2, "--training.save_steps", 0, *QUICK)
    assert again.global_step == 2 and (out / "final" / "model.safetensors").is_file()


def test_sigterm_during_the_final_export_lets_it_finish(tmp_path, monkeypatch):
    from kiln import export

    original = export.export_model

    def signalled_export(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler would, while final/ is being written
        return original(*args, **kwargs)

    monkeypatch.setattr(export, "export_model", signalled_export)
    out = tmp_path / "export"
    state = run(out, "--training.max_steps", 3, "--training.save_steps", 0, *QUICK)
    assert state.stop_reason == "max_steps" and state.global_step == 3
    assert (out / "final" / "model.safetensors").is_file() and not (out / "final.tmp").exists()


# ----------------------------------------------------------------------------------------------------------
# item 8: validate before touching the output folder; a folder without a checkpoint can be reused


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--model.hidden_size", 30, "--model.num_attention_heads", 4],
            "not divisible by --model.num_attention_heads",
        ),
        (["--training.lr_scheduler_type", "triangular"], "lr_scheduler_type 'triangular' is unknown"),
        (["--training.lr", -0.001], "training.lr must be a finite number > 0, got -0.001"),
        (["--training.max_steps", -5], r"or -1 \(train by num_train_epochs\), got -5"),
        (["--data.max_seq_length", 128], "exceeds --model.max_position_embeddings=64"),
        (
            ["--model.init_from", "/nonexistent/kiln-model"],
            "model.init_from /nonexistent/kiln-model is not a folder",
        ),
        (["--hub.push_to_hub", "--hub.model_id", "no-slash"], "hub.model_id must look like 'user/name'"),
        (
            ["--hub.push_to_hub", "--hub.model_id", "kiln-test/x", "--hub.timeout_s", 0],
            "hub.timeout_s must be a finite number > 0, got 0.0",
        ),
    ],
)
def test_bad_settings_fail_before_the_output_folder_is_touched(tmp_path, args, message):
    out = tmp_path / "untouched"
    with pytest.raises(ConfigError, match=message):
        run(out, *args)
    assert not out.exists()


def test_missing_hub_token_fails_before_the_output_folder_is_touched(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    out = tmp_path / "no-token"
    with pytest.raises(ConfigError, match="no Hugging Face token"):
        run(out, "--hub.push_to_hub", "--hub.model_id", "kiln-test/x")
    assert not out.exists()


def test_a_folder_left_by_a_failed_run_is_reused_by_the_fixed_run(tmp_path):
    from pretrain.data import DataError

    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    out = tmp_path / "retry"
    with pytest.raises(DataError, match="empty"):  # found once the corpus is read, after the folder exists
        run(out, "--data.data_files", empty)
    state = run(out, "--training.max_steps", 2, "--training.save_steps", 0, *QUICK)
    assert state.global_step == 2 and (out / "final").is_dir()
    assert "data_files:\n  - data/pretrain/*.txt" in (out / "config.yaml").read_text()


# ----------------------------------------------------------------------------------------------------------
# item 6: resume compares the new config with the saved one and never overwrites it before succeeding


def test_resume_refuses_changed_settings_and_keeps_the_saved_config(tmp_path):
    out = tmp_path / "run"
    run(out, "--training.max_steps", 3, "--training.save_steps", 3, *QUICK)
    saved = (out / "config.yaml").read_text()
    latest = ["--training.resume_from_checkpoint", "latest", *QUICK]
    with pytest.raises(
        ConfigError, match=r"training.per_device_train_batch_size 8 -> 4, training.seed 42 -> 7"
    ):
        run(
            out,
            *latest,
            "--training.max_steps",
            3,
            "--training.per_device_train_batch_size",
            4,
            "--training.seed",
            7,
        )
    with pytest.raises(ConfigError, match=r"training.max_steps 3 -> 5.*--training.allow_config_change"):
        run(out, *latest, "--training.max_steps", 5)
    assert (out / "config.yaml").read_text() == saved
    # a deliberate change that then fails to load (another model shape) still leaves config.yaml alone
    with pytest.raises(ConfigError, match="does not fit this run"):
        run(
            out,
            *latest,
            "--training.max_steps",
            3,
            "--model.intermediate_size",
            96,
            "--training.allow_config_change",
        )
    assert (out / "config.yaml").read_text() == saved
    # harmless changes pass; a deliberate one passes with the flag, and becomes the run's config
    state = run(
        out,
        *latest,
        "--training.max_steps",
        5,
        "--training.allow_config_change",
        "--logging.logging_steps",
        2,
    )
    assert state.global_step == 5
    assert "max_steps: 5" in (out / "config.yaml").read_text()
    assert "max_steps: 5" in (find_checkpoints(out)[-1] / "kiln_config.yaml").read_text()


# ----------------------------------------------------------------------------------------------------------
# item 5: checkpoint integrity


def test_damaged_checkpoints_are_detected_and_latest_falls_back(tmp_path, caplog):
    common = ["--training.max_steps", 4, "--training.save_steps", 2, "--training.save_total_limit", 0, *QUICK]
    out = tmp_path / "run"
    run(out, *common)
    reference = losses(out)
    step2, step4 = find_checkpoints(out)
    assert (step4 / "checksums.json").is_file()
    weights = step4 / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # truncated

    optimizer = step2 / "optimizer.safetensors"
    pristine = optimizer.read_bytes()
    flipped = bytearray(pristine)
    flipped[len(flipped) // 2] ^= 0xFF  # silent bit rot: same size, other content
    optimizer.write_bytes(bytes(flipped))
    with pytest.raises(
        ConfigError, match=r"step-00000002 is damaged: optimizer.safetensors does not match its checksum"
    ):
        run(tmp_path / "other", *common, "--training.resume_from_checkpoint", step2)
    with pytest.raises(
        ConfigError, match=r"no valid checkpoint.*step-00000004: model.safetensors has \d+ bytes"
    ):
        run(out, *common, "--training.resume_from_checkpoint", "latest")
    optimizer.write_bytes(pristine)

    with caplog.at_level("WARNING", logger="kiln"):
        state = run(out, *common, "--training.resume_from_checkpoint", "latest")
    assert "resuming from step-00000002, the newest valid one" in caplog.text
    assert state.global_step == 4
    again = losses(out)
    # metrics.jsonl holds each step once: the rows of the replayed steps 3-4 were replaced, not repeated
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2, 3, 4]
    assert sorted(again) == [1, 2, 3, 4] and all(again[s] == reference[s] for s in again)


# ----------------------------------------------------------------------------------------------------------
# item 9: one-line errors, exit status 2


def test_user_mistakes_are_one_line_errors_with_exit_status_2(tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text('{"text": 123}\n{"text": 456}\n')
    cases = [
        (["--training.output_dir", a_file], f"error: --training.output_dir {a_file} is a file"),
        (["--training.output_dir", ""], "error: --training.output_dir is empty"),
        (
            ["--training.output_dir", tmp_path / "n", "--data.data_files", numbers],
            "error: column 'text' holds int",
        ),
        (
            ["--training.output_dir", tmp_path / "s", "--training.lr_scheduler_type", "x"],
            "error: --training.lr_sch",
        ),
        (
            ["--training.output_dir", tmp_path / "h", "--model.num_attention_heads", 3],
            "error: --model.hidden_size 32",
        ),
    ]
    for args, start in cases:
        code, lines = cli_in_process(capsys, *args)
        assert code == 2 and lines[-1].startswith(start), (args, lines)


def test_ctrl_c_outside_the_training_loop_is_one_line_with_status_130(capsys):
    from kiln.cli import run_cli

    def tokenizer_training(argv):
        raise KeyboardInterrupt  # Ctrl-C while the tokenizer trains or the data is prepared

    with pytest.raises(SystemExit) as exit_info:
        run_cli(tokenizer_training, [])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 130 and "Traceback" not in err
    assert err.splitlines() == [
        "error: interrupted (Ctrl-C); checkpoints completed before it are kept (continue with "
        "--training.resume_from_checkpoint latest)"
    ]


def test_disk_faults_are_one_line_errors(capsys):
    import errno

    from kiln.cli import run_cli

    def full_disk(argv):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/run/checkpoints/step-00000200.tmp")

    def read_only(argv):
        raise OSError(errno.EROFS, "Read-only file system", "/mnt/ro/run")

    for main, expected in (
        (full_disk, "error: no space left on the device holding /data/run/checkpoints"),
        (read_only, "error: /mnt/ro/run is on a read-only file system"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            run_cli(main, [])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err.strip().startswith(expected)


def test_fine_tuning_files_that_are_empty_or_hold_no_text_are_one_line_errors(
    tmp_path, capsys, kiln_checkpoints
):
    from test_finetune_scripts import write_sentiment

    from finetune.classify import main as classify_main
    from finetune.common import run_finetune_cli
    from finetune.data import (
        FinetuneDataError,
        load_classification_data,
        load_seq2seq_data,
        load_tagging_data,
    )

    files = write_sentiment(tmp_path, sizes=(32, 8, 8))
    empty = tmp_path / "test.jsonl"
    empty.write_bytes(b"")
    for load in (load_classification_data, load_tagging_data, load_seq2seq_data):
        with pytest.raises(
            FinetuneDataError, match=r"test.jsonl is empty \(0 bytes\): give a file with one JSON"
        ):
            load(train_file=str(files["train"]), test_file=str(empty))
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text(
        "".join(
            json.dumps({"sentence": i, "source": i, "target": "t", "label": i % 2}) + "\n" for i in range(20)
        )
    )
    with pytest.raises(
        FinetuneDataError, match=r"text column 'sentence' of the train split holds int values \(e.g."
    ):
        load_classification_data(train_file=str(numbers), validation_file=str(numbers))
    with pytest.raises(
        FinetuneDataError, match=r"source/target column 'source' of the train split holds int"
    ):
        load_seq2seq_data(train_file=str(numbers), validation_file=str(numbers))

    # the command: one line, exit status 2, nothing written
    encoder, _ = kiln_checkpoints
    out = tmp_path / "cls"
    with pytest.raises(SystemExit) as exit_info:
        run_finetune_cli(
            classify_main,
            [
                "--model.checkpoint",
                str(encoder),
                "--training.output_dir",
                str(out),
                "--data.train_file",
                str(files["train"]),
                "--data.test_file",
                str(empty),
            ],
        )
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert err.splitlines()[-1].startswith(f"error: {empty} is empty (0 bytes)"), err
    assert not out.exists()


# ----------------------------------------------------------------------------------------------------------
# items 9/10: a corpus too small for a validation split trains without evaluating, and says so


@pytest.mark.parametrize("kind", ["mlm", "mlm+sop", "decoder"])
def test_no_validation_examples_is_a_warning_not_a_crash(tmp_path, kind, caplog):
    from kiln_testing import DECODER

    one = tmp_path / "one.txt"
    one.write_text("It was a dark night. The rain fell hard on the old roof. " * 200)
    extra = DECODER[:-2] if kind == "decoder" else ["--model.objective", kind]
    with caplog.at_level("WARNING"):
        state = run(
            tmp_path / "run",
            *extra,
            "--data.data_files",
            one,
            "--training.max_steps",
            2,
            "--training.save_steps",
            0,
            "--training.eval_steps",
            1,
        )
    assert state.global_step == 2
    assert "no validation examples" in caplog.text and "will not evaluate" in caplog.text
    assert not any(key.startswith("eval/") for entry in state.history for key in entry)


# ----------------------------------------------------------------------------------------------------------
# item 4: non-finite loss or gradients


def test_a_diverged_run_stops_with_one_line_keeps_the_last_good_checkpoint_and_exports_nothing(tmp_path):
    from safetensors.torch import load_file

    from kiln.errors import RunError

    out = tmp_path / "diverged"
    with pytest.raises(
        RunError,
        match=r"training diverged: the loss or gradient norm was NaN/inf at steps 3-6; "
        r"the last good checkpoint is .*step-00000002",
    ):
        run(out, "--training.lr", 1e6, "--training.max_steps", 20, "--training.save_steps", 2, *QUICK)
    assert not (out / "final").exists()
    assert [p.name for p in find_checkpoints(out)] == ["step-00000002"]
    weights = load_file(str(find_checkpoints(out)[0] / "model.safetensors"))
    assert all(bool(t.isfinite().all()) for t in weights.values())


def test_an_isolated_non_finite_step_is_skipped_and_training_goes_on(tmp_path, monkeypatch, caplog):
    nan_loss_at_forward(monkeypatch, 3)
    out = tmp_path / "one-nan"
    with caplog.at_level("WARNING", logger="kiln"):
        state = run(out, "--training.max_steps", 6, "--training.save_steps", 0, *QUICK)
    assert (
        "step 3: the loss or gradient norm is not finite" in caplog.text
        and "(1 in a row, limit 3)" in caplog.text
    )
    assert state.global_step == 6 and (out / "final" / "model.safetensors").is_file()
    curve = losses(out)
    assert curve[3] != curve[3] and all(curve[s] == curve[s] for s in (1, 2, 4, 5, 6))  # only step 3 is NaN


# ----------------------------------------------------------------------------------------------------------
# item 10: smaller ones


def test_help_is_light_and_shows_list_values_and_a_missing_value_names_its_option():
    for script in ("pretrain/run.py", "finetune/classify.py", "finetune/tag.py", "finetune/seq2seq.py"):
        code = (
            "import runpy, sys\n"
            f"sys.argv = ['{script}', '--help']\n"
            f"try:\n    runpy.run_path('{script}', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('IMPORTED', sorted(m for m in ('torch', 'datasets', 'transformers') if m in sys.modules))\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert result.stdout.strip().splitlines()[-1] == "IMPORTED []", (
            result.stdout[-2000:] + result.stderr[-2000:]
        )
        if script == "pretrain/run.py":
            assert (
                "--data.data_files (list[str], default: ['data/pretrain/*.txt']; several as a,b or [a, b])"
                in (result.stdout)
            )

    from kiln.config import build_config
    from pretrain.config import RunConfig

    with pytest.raises(ConfigError, match=r"^--training.lr needs a value"):
        build_config(RunConfig, ["--training.lr", "--training.max_steps", "5"])


def test_model_card_names_the_run_and_uses_the_right_article(tmp_path):
    out = tmp_path / "my-encoder"
    run(out, "--training.max_steps", 1, "--training.save_steps", 0, *QUICK)
    card = (out / "final" / "README.md").read_text()
    assert "# my-encoder\n" in card and "# final\n" not in card
    assert "An encoder pretrained with Kiln" in card and "A encoder" not in card
    # the usage code names the folder, not where it lies on this machine (issue 24, item 2)
    assert 'from_pretrained("path/to/final"' in card and str(tmp_path) not in card and "final.tmp" not in card


@pytest.mark.slow
def test_resuming_from_a_missing_or_stalled_hub_repo_is_a_one_line_error(tmp_path, hub):
    with pytest.raises(
        ConfigError, match=r"cannot resume from hub:kiln-test/nothing: Hub repo kiln-test/nothing not"
    ):
        run(tmp_path / "missing", "--training.resume_from_checkpoint", "hub:kiln-test/nothing")
    hub.stall()
    proc = _cli(
        [
            "--training.output_dir",
            tmp_path / "stalled",
            "--hub.timeout_s",
            1,
            "--training.resume_from_checkpoint",
            "hub:kiln-test/stalled",
        ],
        launcher=(sys.executable,),
    )
    try:
        output, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 2, output
    assert output.strip().splitlines()[-1].startswith("error: cannot resume from hub:kiln-test/stalled"), (
        output
    )


# ----------------------------------------------------------------------------------------------------------
# item 9: disk faults in the checkpoint save and in the final export, with the kernel's own errors
#
# A file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) makes every write past it fail with EFBIG, as a full disk
# makes it fail with ENOSPC, without privileges: torch.save then raises a RuntimeError without any errno and
# safetensors a Rust "(os error 27)". The limit is set once the step-2 checkpoint is complete.


@pytest.fixture
def file_size_limit_after_first_checkpoint(monkeypatch):
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    original = Trainer.save_checkpoint

    def save_then_limit(self):
        saved = original(self)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))  # model.safetensors alone is larger
        return saved

    monkeypatch.setattr(Trainer, "save_checkpoint", save_then_limit)
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def _checkpoint_files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_disk_fault_in_a_checkpoint_save_is_one_line_and_keeps_the_last_checkpoint(
    tmp_path, capsys, file_size_limit_after_first_checkpoint, monkeypatch
):
    out = tmp_path / "limited"
    args = ["--training.output_dir", out, "--training.max_steps", 4, "--training.save_steps", 2, *QUICK]
    code, lines = cli_in_process(capsys, *args)
    last = lines[-1]
    assert code == 2, last
    assert last.startswith(f"error: file size limit exceeded writing {out}/checkpoints/step-00000004.tmp"), (
        last
    )
    assert [p.name for p in (out / "checkpoints").iterdir()] == [
        "step-00000002"
    ]  # no half-written folder left
    kept = _checkpoint_files(out / "checkpoints" / "step-00000002")

    monkeypatch.undo()  # the limit is lifted (the fixture's own finally runs later; the next run needs room)
    import resource

    resource.setrlimit(
        resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.getrlimit(resource.RLIMIT_FSIZE)[1])
    )
    state = run(out, *args[2:], "--training.resume_from_checkpoint", "latest")
    assert state.global_step == 4 and (out / "final" / "model.safetensors").is_file()
    assert _checkpoint_files(out / "checkpoints" / "step-00000002") == kept


def test_a_disk_fault_in_the_final_export_is_one_line_and_leaves_no_half_model(
    tmp_path, capsys, file_size_limit_after_first_checkpoint, monkeypatch
):
    out = tmp_path / "limited-final"
    args = ["--training.output_dir", out, "--training.max_steps", 2, "--training.save_steps", 2, *QUICK]
    code, lines = cli_in_process(capsys, *args)
    last = lines[-1]
    assert code == 2, last
    assert last.startswith(f"error: file size limit exceeded writing {out}/final (`ulimit -f`"), last
    # nor a staging folder left (a fresh `.final.*.staging` beside it, kiln.safe_write.staged_folder)
    assert not (out / "final").exists() and not list(out.glob(".final*"))
    assert [p.name for p in find_checkpoints(out)] == ["step-00000002"]

    monkeypatch.undo()
    import resource

    resource.setrlimit(
        resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.getrlimit(resource.RLIMIT_FSIZE)[1])
    )
    state = run(out, *args[2:], "--training.resume_from_checkpoint", "latest")
    assert state.global_step == 2 and (out / "final" / "model.safetensors").is_file()


def test_a_fault_while_overwriting_a_saved_model_folder_keeps_the_previous_one(tmp_path):
    """Fine-tuning overwrites best/ at each new best: a fault midway must leave the previous best whole."""
    import errno
    import resource

    from accelerate import Accelerator
    from kiln_testing import tiny_encoder_config

    from kiln.export import save_model_folder
    from pretrain.modeling import KilnEncoderForMaskedLM

    accelerator = Accelerator(cpu=True)
    best = tmp_path / "best"
    save_model_folder(accelerator, KilnEncoderForMaskedLM(tiny_encoder_config()), None, best)
    before = _checkpoint_files(best)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
        with pytest.raises(OSError) as fault:
            save_model_folder(accelerator, KilnEncoderForMaskedLM(tiny_encoder_config()), None, best)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert fault.value.errno == errno.EFBIG and fault.value.filename == str(tmp_path / "best")
    assert _checkpoint_files(best) == before and sorted(p.name for p in tmp_path.iterdir()) == ["best"]


def test_library_write_errors_are_named_as_the_disk_fault_behind_them(tmp_path):
    import errno
    import resource

    from kiln.disk import as_disk_fault, disk_error_message

    # what safetensors and tokenizers raise on a full disk (a Rust I/O error), seen on a 1 MiB tmpfs
    rust = Exception("Error while serializing: I/O error: No space left on device (os error 28)")
    fault = as_disk_fault(rust, tmp_path / "step.tmp")
    assert fault.errno == errno.ENOSPC
    assert disk_error_message(fault).startswith(f"no space left on the device holding {tmp_path}/step.tmp;")
    # what torch.save raises on a full disk: no errno at all; a plain write in the folder tells the fault
    torch_save = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert as_disk_fault(torch_save, tmp_path) is None  # the disk is fine: not a disk fault
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
        fault = as_disk_fault(torch_save, tmp_path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)
    assert fault is not None and fault.errno == errno.EFBIG and fault.filename == str(tmp_path)
    assert not any(tmp_path.iterdir())  # the probe file is gone
    assert as_disk_fault(ValueError("some other problem"), tmp_path) is None


# ----------------------------------------------------------------------------------------------------------
# item 9, on a real file system: a small tmpfs that fills up (ENOSPC) and is then remounted read-only (EROFS),
# through the command line. Mounting needs CAP_SYS_ADMIN (root in this project's CI containers).


@pytest.fixture
def small_disk(tmp_path):
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1600k", "tmpfs", mount_point], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", mount_point], capture_output=True)


def _remount(mount_point, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", mount_point], check=True, capture_output=True)


@pytest.mark.slow
def test_a_full_then_read_only_disk_is_one_line_and_keeps_every_completed_checkpoint(small_disk, capsys):
    """The full disk through the command in a fresh process; the read-only disk (the same one-line path for a disk
    fault) and the resume with room again through the same command line in this process."""
    out = small_disk / "run"
    args = [
        "--training.output_dir",
        out,
        "--training.max_steps",
        40,
        "--training.save_steps",
        2,
        "--training.save_total_limit",
        0,
        *QUICK,
    ]
    proc = _cli(args, launcher=(sys.executable,))
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: no space left on the device holding ") and str(out) in last, output
    assert "Traceback" not in output
    completed = find_checkpoints(out)
    assert completed and not list((out / "checkpoints").glob("*.tmp")), output  # the half-written one is gone
    kept = {c.name: _checkpoint_files(c) for c in completed}

    _remount(small_disk, "ro")  # e.g. the kernel's answer to I/O errors on a failing disk
    code, lines = cli_in_process(capsys, *args, "--training.resume_from_checkpoint", "latest")  # no Traceback
    assert code == 2, lines
    assert lines[-1].startswith("error: ") and "read-only file system" in lines[-1], lines

    _remount(small_disk, "rw,size=64m")  # room again: the run continues from its last complete checkpoint
    state = run(*args[1:], "--training.resume_from_checkpoint", "latest")
    assert state.global_step == 40 and state.stop_reason == "max_steps"
    assert (out / "final" / "model.safetensors").is_file()
    assert {c.name: _checkpoint_files(c) for c in find_checkpoints(out) if c.name in kept} == kept


@pytest.mark.slow
def test_a_full_disk_under_a_multi_process_launch_ends_every_process_with_the_one_line(small_disk):
    """The disk fills while the first process writes a checkpoint: the others (waiting for it) must not hang."""
    out = small_disk / "run"
    args = [
        "--training.output_dir",
        out,
        "--training.max_steps",
        40,
        "--training.save_steps",
        2,
        "--training.save_total_limit",
        0,
        *QUICK,
    ]
    proc = _cli(args, launcher=KILN_LAUNCH_2, env_extra=CPU_PROCESSES)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: no space left on the device holding ") and str(out) in last, output
    assert "Traceback" not in output and "ChildFailedError" not in output
    completed = find_checkpoints(out)
    assert completed, output
    kept = {c.name: _checkpoint_files(c) for c in completed}

    _remount(small_disk, "rw,size=64m")
    proc = _cli(
        [*args, "--training.resume_from_checkpoint", "latest"],
        launcher=KILN_LAUNCH_2,
        env_extra=CPU_PROCESSES,
    )
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    assert (out / "final" / "model.safetensors").is_file()
    assert not list((out / "checkpoints").glob("*.tmp"))  # a folder another process was still writing is gone
    assert {c.name: _checkpoint_files(c) for c in find_checkpoints(out) if c.name in kept} == kept
