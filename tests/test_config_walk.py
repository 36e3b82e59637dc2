"""The engine owns the run: followed as data, a fine-tuning run's config goes from the app to the engine and does not
bounce back and forth between them (issue 25, item 3).

What is counted (`kiln.walk.trace_walk`): `finetune/classify.py`'s `main(argv)` runs in this process on the shipped
authorship sample, starting from a tiny encoder pretrained here for one step. From the moment
`kiln.config.build_config` returns the run config, every call to a function of `kiln/`, `finetune/` or `pretrain/`
that receives the whole run config as an argument (`self` aside), or a dataclass carrying it (a job), is recorded
with its module (its room). Consecutive calls in one module are one stay; a stay in a module that had an earlier one
is a return to a room already left. Calls that receive only a section (`config.training`, ...) are not counted.
Before the engine took the whole run (commit 44ce8dd) this walk was 18 stays in 7 rooms with 11 returns. The
pretraining run that makes the encoder is traced too: its config goes to the engine's entrance right after the
app's own checks and comes back to `pretrain/run.py` once, to build (before, `main` called the engine's steps).
"""

import pytest
from kiln_testing import DEBUG, one_torch_thread, reset_accelerate, run_main

from kiln.walk import trace_walk


@pytest.mark.slow
@one_torch_thread()
def test_a_runs_config_enters_the_engine_once_and_a_fine_tuning_walk_returns_at_most_four_times(tmp_path):
    from finetune.classify import main as classify
    from pretrain.run import main as pretrain

    pretraining, _ = trace_walk(
        lambda: run_main(
            pretrain,
            "--config",
            DEBUG,
            "--training.output_dir",
            tmp_path / "encoder",
            "--training.max_steps",
            1,
            "--training.eval_steps",
            0,
            "--training.save_steps",
            0,
            "--data.max_train_documents",
            100,
            "--tokenizer.max_training_texts",
            500,
        )
    )
    print(pretraining.describe())
    # pretraining checks its own sections, then hands the engine the job, which comes back to the app once: to build
    stays = pretraining.stays
    assert stays[:2] == ["pretrain/run.py", "kiln/job.py"], pretraining.describe()
    assert stays[1:].count("pretrain/run.py") == 1, pretraining.describe()

    reset_accelerate()
    try:
        walk, result = trace_walk(
            lambda: classify(
                [
                    "--model.checkpoint",
                    str(tmp_path / "encoder" / "final"),
                    "--training.output_dir",
                    str(tmp_path / "run"),
                    "--training.max_steps",
                    "2",
                    "--data.max_train_samples",
                    "32",
                    "--data.max_eval_samples",
                    "16",
                    "--data.max_predict_samples",
                    "8",
                ]
            )
        )
    finally:
        reset_accelerate()
    assert result.state.global_step == 2 and (tmp_path / "run" / "final" / "model.safetensors").is_file()
    print(walk.describe())
    assert walk.returns <= 4, walk.describe()
    # the config is handed to the engine's entrance before the app builds anything, and once the engine has prepared
    # the output folder the app never gets the whole config again
    assert walk.rooms[0] == "kiln/job.py", walk.describe()
    # (run_setup is visited first for read-only start checks: the folder, the inputs in it, the Hub and trackers;
    # its last visit prepares the folder)
    prepared = len(walk.stays) - 1 - walk.stays[::-1].index("kiln/run_setup.py")
    after_output = walk.stays[prepared:]
    assert not any(room.startswith("finetune/") for room in after_output), walk.describe()
