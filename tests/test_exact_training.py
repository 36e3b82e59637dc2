"""The loop is exact off the easy path: accumulation windows, epochs of whole global batches, per-token loss normalisation
across accumulation and processes, truncated evaluations, and resume at every step across epoch boundaries."""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import torch
from kiln_testing import REPO, reset_accelerate
from transformers.utils import ModelOutput

WINDOW_SCRIPT = REPO / "tests" / "window_gradients.py"


KINDS = ["encoder", "electra", "decoder"]


def _window(kind, accumulation, batch, out):
    """One optimizer step of the window script on one process, in this process (`python tests/window_gradients.py`
    is the same `main`; the 2-process step is the launched one below)."""
    import window_gradients

    reset_accelerate()
    try:
        window_gradients.main(kind, accumulation, batch, str(out))
    finally:
        reset_accelerate()
    return torch.load(out)


@pytest.fixture(scope="module")
def two_process_windows(tmp_path_factory):
    """`accelerate launch --multi_gpu --num_processes 2 tests/window_gradients.py` with batch 4 per process, once
    for the three kinds (one Trainer after another in the launched processes): {kind: saved step}."""
    folder = tmp_path_factory.mktemp("windows") / "p2b4"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--main_process_port",
        "0",
        str(WINDOW_SCRIPT),
    ]  # 0: a free port
    result = subprocess.run(
        [*command, ",".join(KINDS), "1", "4", str(folder)],
        cwd=folder.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return {kind: torch.load(folder / f"{kind}.pt") for kind in KINDS}


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_accumulation_and_processes_take_the_same_step(tmp_path, kind, two_process_windows):
    """accumulation 4 x batch 2 == accumulation 1 x batch 8 == 2 processes x batch 4: the same gradient, although
    the 8 sequences hold 1..9 masked tokens (encoder; ELECTRA: with 5..12 real tokens, over which its
    discriminator loss averages) or 1..10 predicted tokens (decoder, padded)."""
    one_batch = _window(kind, 1, 8, tmp_path / "a1b8.pt")
    accumulated = _window(kind, 4, 2, tmp_path / "a4b2.pt")
    two_procs = two_process_windows[kind]
    for other in (accumulated, two_procs):
        assert other["loss"] == pytest.approx(one_batch["loss"], abs=1e-5)
        assert other["grads"].keys() == one_batch["grads"].keys()
        for name, grad in one_batch["grads"].items():
            torch.testing.assert_close(other["grads"][name], grad, atol=1e-6, rtol=1e-4, msg=name)
    for name, grad in one_batch[
        "direct"
    ].items():  # ELECTRA: lambda weighs the discriminator's part of the step
        torch.testing.assert_close(one_batch["grads"][name], grad, atol=1e-6, rtol=1e-4, msg=name)
    # not vacuous: per-micro-batch means (the old loop) would have given another gradient
    assert any(g.abs().max() > 1e-3 for g in one_batch["grads"].values())


class _CountingModel(torch.nn.Module):
    """loss = -mean(w * x) with x = 1 and w = 1: -1 for any batch, gradient -1 for any exact normalisation."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(()))
        self.forwards = 0

    def forward(self, x, **_):
        self.forwards += int(self.training)
        return ModelOutput(loss=-(self.w * x).mean())


def _toy_trainer(tmp_path, micro_batches=10, **overrides):
    from kiln.config import LoggingConfig, TrainingConfig
    from kiln.run_setup import start_run
    from kiln.trainer import Trainer

    reset_accelerate()
    settings = dict(
        output_dir=str(tmp_path / "toy"),
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        gradient_accumulation_steps=4,
        max_steps=-1,
        num_train_epochs=2,
        lr=1e-12,  # > 0, as the range asks; AdamW moves w by ~lr a step, so the loss stays -1 to 1e-9
        eval_steps=0,
        save_steps=0,
        lr_scheduler_type="constant",
        seed=0,
    )
    training = TrainingConfig(**{**settings, **overrides})
    logging_cfg = LoggingConfig(logging_steps=1, report_to="none")
    accelerator = start_run(training, logging_cfg)
    rows = [{"x": torch.ones(3)} for _ in range(2 * micro_batches)]
    model = _CountingModel()

    def collate(features):
        return {"x": torch.stack([f["x"] for f in features])}

    def evaluator(model, loader, accelerator):
        return {"batches": float(sum(1 for _ in loader))}

    trainer = Trainer(
        accelerator,
        model,
        training=training,
        logging_cfg=logging_cfg,
        train_dataset=lambda epoch: rows,
        collator=collate,
        eval_dataset=rows[:12],
        evaluator=evaluator,
    )
    steps_at = []
    inner = trainer.optimizer.optimizer
    real_step = inner.step

    def record_step(*args, **kwargs):
        steps_at.append(model.forwards)
        return real_step(*args, **kwargs)

    inner.step = record_step
    return trainer, steps_at


def test_an_epoch_is_its_whole_global_batches(tmp_path):
    """20 examples, global batch 8 (2 per device x accumulation 4), 2 epochs: 2 steps an epoch over 16 examples
    (the last 4 of each epoch's order are left out, in any layout), each with loss -1, grad 1."""
    trainer, steps_at = _toy_trainer(tmp_path)
    try:
        assert trainer.total_steps == 4 and trainer.steps_per_epoch == 2
        state = trainer.train()
    finally:
        reset_accelerate()
    assert steps_at == [4, 8, 12, 16]
    train_rows = [row for row in state.history if "train/loss" in row]
    assert [row["step"] for row in train_rows] == [1, 2, 3, 4]
    assert all(row["train/loss"] == pytest.approx(-1.0) for row in train_rows)
    assert all(row["train/grad_norm"] == pytest.approx(1.0) for row in train_rows)
    assert train_rows[-1]["train/epoch"] == pytest.approx(2.0)
    assert state.stop_reason == "epochs" and state.global_step == 4


def test_truncated_evaluation_does_not_move_the_steps(tmp_path):
    """An evaluation cut short by max_eval_batches after every step leaves the windows as they were."""
    trainer, steps_at = _toy_trainer(tmp_path, eval_steps=1, max_eval_batches=2)
    try:
        state = trainer.train()
    finally:
        reset_accelerate()
    assert steps_at == [4, 8, 12, 16]
    evals = [row for row in state.history if "eval/batches" in row]
    assert len(evals) == 4 and all(row["eval/batches"] == 2 for row in evals)


def test_fractional_epochs_and_step_count(tmp_path):
    trainer, steps_at = _toy_trainer(tmp_path, num_train_epochs=1.5)
    try:
        assert trainer.total_steps == 3  # 2 + ceil(0.5 x 2)
        state = trainer.train()
    finally:
        reset_accelerate()
    assert state.global_step == 3 and steps_at == [4, 8, 12]


def test_fused_adamw_follows_the_accelerator_device():
    from kiln.config import TrainingConfig
    from kiln.trainer import build_optimizer

    model = torch.nn.Linear(4, 4)
    # the decision is read from the device accelerate will put the model on, not from where it is now (CPU)
    assert build_optimizer(model, TrainingConfig(), torch.device("cpu")).defaults["fused"] is True
    assert build_optimizer(model, TrainingConfig(), torch.device("cuda")).defaults["fused"] is True
    assert build_optimizer(model, TrainingConfig(), torch.device("meta")).defaults["foreach"] is True


def test_fused_cpu_adamw_takes_the_foreach_steps():
    """The fused CPU kernel is a fast path: the same weights as the foreach AdamW after several steps."""
    from kiln.config import TrainingConfig
    from kiln.trainer import build_optimizer

    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))]
    models.append(copy.deepcopy(models[0]))
    training = TrainingConfig(lr=1e-2, weight_decay=0.1)
    optimizers = [build_optimizer(models[0], training, torch.device("cpu"))]
    optimizers.append(build_optimizer(models[1], training, torch.device("meta")))  # foreach
    assert optimizers[0].defaults["fused"] and optimizers[1].defaults["foreach"]
    inputs = torch.randn(5, 32, 8)
    for step in range(5):
        for model, optimizer in zip(models, optimizers):
            model(inputs[step]).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    for fused, foreach in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(fused, foreach, atol=1e-6, rtol=1e-5)


def test_skipped_fp16_step_holds_the_schedule_and_tokens_count_real_ones(tmp_path, monkeypatch, caplog):
    """When the fp16 scaler skips an optimizer step, the learning-rate schedule must not move; tokens_seen
    counts the tokens under the attention mask, not the padding; the start-up summary says how it trains."""
    import logging

    from accelerate import Accelerator

    trainer, _ = _toy_trainer(tmp_path, max_steps=3, num_train_epochs=1)
    rows = [
        {"x": torch.ones(3), "attention_mask": torch.tensor([1] * (1 + i % 4) + [0] * (4 - i % 4))}
        for i in range(24)
    ]
    trainer.train_dataset = lambda epoch: rows
    trainer.collator = lambda features: {key: torch.stack([f[key] for f in features]) for key in features[0]}
    monkeypatch.setattr(Accelerator, "optimizer_step_was_skipped", property(lambda self: True))
    try:
        with caplog.at_level(logging.INFO, logger="kiln"):
            state = trainer.train()
    finally:
        reset_accelerate()
    assert trainer.scheduler.last_epoch == 0  # never stepped: every step was "skipped"
    # 3 steps of 4 micro-batches of 2 = the whole epoch of 24 rows: 60 real tokens among 120 positions
    assert state.global_step == 3 and state.tokens_seen == 60
    summary = caplog.text
    threads = torch.get_num_threads()
    for part in (
        "examples = 24",
        "processes = 1",
        "gradient accumulation = 4",
        "optimizer steps = 3",
        "trainable parameters = 1",
        f"device = cpu, {threads} thread{'' if threads == 1 else 's'} per process",
    ):
        assert part in summary, summary


class _PaddingModel(_CountingModel):
    def __init__(self):
        super().__init__()
        self.padding, self.positions = 0, 0

    def forward(self, input_ids, attention_mask, **_):
        if self.training:
            self.padding += int((attention_mask == 0).sum())
            self.positions += attention_mask.numel()
        return super().forward(torch.ones(1))


@pytest.mark.parametrize("group", [False, True])
def test_group_by_length_batches_similar_lengths_and_stays_seeded(tmp_path, group):
    from kiln.config import LoggingConfig, TrainingConfig
    from kiln.run_setup import start_run
    from kiln.trainer import Trainer
    from pretrain.data.collator import pad_batch

    g = torch.Generator().manual_seed(0)
    rows = [
        {"input_ids": torch.ones(int(n), dtype=torch.long)} for n in torch.randint(1, 60, (400,), generator=g)
    ]
    fractions, orders = [], []
    for attempt in range(2):
        reset_accelerate()
        training = TrainingConfig(
            output_dir=str(tmp_path / f"r{attempt}"),
            per_device_train_batch_size=8,
            max_steps=-1,
            num_train_epochs=1,
            save_steps=0,
            eval_steps=0,
            lr=1e-12,  # > 0, as the range asks; AdamW moves w by ~lr a step, so the loss stays -1 to 1e-9
            group_by_length=group,
        )
        logging_cfg = LoggingConfig(logging_steps=10, report_to="none")
        accelerator = start_run(training, logging_cfg)
        model = _PaddingModel()
        seen = []

        def collate(features, seen=seen):
            seen.append(tuple(len(f["input_ids"]) for f in features))
            return pad_batch(features, 0, None)

        trainer = Trainer(
            accelerator,
            model,
            training=training,
            logging_cfg=logging_cfg,
            train_dataset=lambda epoch: rows,
            collator=collate,
        )
        try:
            trainer.train()
        finally:
            reset_accelerate()
        fractions.append(model.padding / model.positions)
        orders.append(seen)
    assert orders[0] == orders[1]  # the same order in a second run
    assert sum(len(batch) for batch in orders[0]) == 400
    if group:
        assert fractions[0] < 0.1  # random batches of lengths 1..59 are about half padding
    else:
        assert fractions[0] > 0.3
