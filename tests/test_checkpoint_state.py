"""Every field of every state file of a checkpoint is checked before anything is loaded (kiln/checkpoint_state.py).

A real checkpoint of a tiny encoder, two AdamW steps in, is written with `save_training_state`; each case changes
one field of one file as anyone editing a checkpoint can (the file stays valid JSON / safetensors), and
`check_training_state` must refuse it with a `DamagedCheckpoint` naming the file and the field or parameter,
leaving the run's model, optimizer and schedule untouched. The end-to-end cases (through the training command,
locally and from the test Hub) are in test_checkpoint_trust.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from kiln_testing import tiny_encoder_config
from safetensors import safe_open
from safetensors.torch import save_file

from kiln.checkpoint_state import (
    COUNT,
    COUNTERS,
    LOOP_STATE,
    MICRO_BATCHES,
    NUMBER,
    OBJECT,
    ROWS,
    SECONDS,
    STOP_REASON,
    DamagedCheckpoint,
    Expected,
    ModelMismatch,
    Table,
    check_tensors,
    check_training_state,
    load_training_state,
    save_training_state,
)
from kiln.config import TrainingConfig
from kiln.train_state import TrainState

EXPECTED = Expected(
    global_step=2, folder_step=None, total_steps=10, steps_per_epoch=5, accumulation=1, same_schedule=True
)


def build(hidden: int = 32):
    from accelerate import Accelerator
    from transformers import get_scheduler

    from kiln.trainer import build_optimizer
    from pretrain.modeling import KilnEncoderForPreTraining

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model = KilnEncoderForPreTraining(tiny_encoder_config(hidden_size=hidden, num_attention_heads=2))
    optimizer = build_optimizer(model, TrainingConfig(lr=1e-3), torch.device("cpu"))
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=1, num_training_steps=10)
    return accelerator, model, optimizer, scheduler


def train(model, optimizer, scheduler, steps: int) -> None:
    for step in range(steps):
        ids = torch.randint(5, 250, (4, 16), generator=torch.Generator().manual_seed(step))
        labels = torch.full_like(ids, -100)
        labels[:, 2::5] = ids[:, 2::5]
        model(input_ids=ids, labels=labels, next_sentence_label=torch.tensor([0, 1, 1, 0])).loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def write_checkpoint(folder: Path, hidden: int = 32) -> None:
    accelerator, model, optimizer, scheduler = build(hidden)
    train(model, optimizer, scheduler, 2)
    state = TrainState(
        global_step=2,
        batches_in_epoch=2,
        tokens_seen=128,
        train_time_s=0.5,
        history=[{"step": 1, "train/loss": 6.0}, {"step": 2, "train/loss": 5.9}],
        lowest_loss=5.9,
        lowest_loss_step=2,
    )
    save_training_state(accelerator, model, optimizer, scheduler, state, folder, writer=True)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("state")
    write_checkpoint(root / "checkpoint")
    write_checkpoint(root / "smaller", hidden=16)
    write_checkpoint(root / "larger", hidden=48)
    return root


def edit_json(name: str, change):
    def damage(folder: Path) -> None:
        data = json.loads((folder / name).read_text())
        change(data)
        (folder / name).write_text(json.dumps(data))

    return damage


def counters(**values):
    return edit_json("loop_state.json", lambda loop: loop["counters"].update(values))


def scheduler(**values):
    return edit_json("loop_state.json", lambda loop: loop["scheduler"].update(values))


def edit_safetensors(name: str, key: str, change):
    """Rewrite `name` with the JSON header `key` (or, for key None, the tensors) changed by `change`."""

    def damage(folder: Path) -> None:
        with safe_open(str(folder / name), "pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            meta = dict(f.metadata())
        if key is None:
            change(tensors)
        else:
            header = json.loads(meta[key])
            change(header)
            meta[key] = json.dumps(header)
        save_file(tensors, folder / name, metadata=meta)

    return damage


def optimizer_groups(change):
    return edit_safetensors("optimizer.safetensors", "kiln_optimizer", lambda h: change(h["param_groups"]))


def optimizer_tensors(change):
    return edit_safetensors("optimizer.safetensors", None, change)


def from_run(other: str):
    def damage(folder: Path) -> None:
        shutil.copy(folder.parent / other / "optimizer.safetensors", folder / "optimizer.safetensors")

    return damage


def set_tensor(key: str, value):
    return optimizer_tensors(lambda t: t.__setitem__(key, value(t[key])))


def nan_lr(loop):
    loop["scheduler"]["_last_lr"] = [float("nan")] * 2


def python_random(change):
    return edit_safetensors("rng_state_0.safetensors", "kiln_random", lambda plain: change(plain["python"]))


FIRST_WEIGHT = "model.embeddings.word_embeddings.weight"  # parameter 0 of the decay group (optimizer index 0)
POSITIONS = "model.embeddings.position_embeddings.weight"  # a weight tied to no other

CASES = {
    # the optimizer's tensors against the model's parameters
    "smaller-run": (
        from_run("smaller"),
        f"optimizer.safetensors: the state of {FIRST_WEIGHT}: exp_avg is "
        "torch.float32 [256, 16], the parameter is torch.float32 [256, 32]",
    ),
    "larger-run": (
        from_run("larger"),
        f"optimizer.safetensors: the state of {FIRST_WEIGHT}: exp_avg is "
        "torch.float32 [256, 48], the parameter is torch.float32 [256, 32]",
    ),
    "float64": (
        set_tensor("0/exp_avg_sq", lambda t: t.double()),
        f"the state of {FIRST_WEIGHT}: exp_avg_sq is "
        "torch.float64 [256, 32], the parameter is torch.float32 [256, 32]",
    ),
    "nan-moment": (
        set_tensor("0/exp_avg", lambda t: t * float("nan")),
        f"the state of {FIRST_WEIGHT}: exp_avg holds NaN or infinite values",
    ),
    "negative-second-moment": (
        set_tensor("0/exp_avg_sq", lambda t: -t - 1),
        f"the state of {FIRST_WEIGHT}: exp_avg_sq holds negative values",
    ),
    "step-10**18": (
        set_tensor("0/step", lambda t: torch.tensor(1e18)),
        f"the state of {FIRST_WEIGHT}: step is 1e+18, not a count from 0 to the checkpoint's 2",
    ),
    "step-vector": (
        set_tensor("0/step", lambda t: torch.zeros(3)),
        "step is a torch.float32 [3], not one number",
    ),
    "missing-moment": (
        optimizer_tensors(lambda t: t.pop("0/exp_avg")),
        f"the state of {FIRST_WEIGHT} holds ['exp_avg_sq', 'step'], not",
    ),
    "stranger-parameter": (
        optimizer_tensors(lambda t: t.__setitem__("9999/exp_avg", torch.zeros(1))),
        "tensor 9999/exp_avg belongs to no parameter",
    ),
    "group-layout": (
        optimizer_groups(lambda g: g[0]["params"].reverse()),
        f"parameter group 0 lists 14 parameters, this run's 14; the first that differs is {FIRST_WEIGHT}",
    ),
    "group-count": (
        optimizer_groups(lambda g: g.pop()),
        "the optimizer's parameter groups differ from this run's",
    ),
    "lr-not-the-schedule": (
        optimizer_groups(lambda g: g[0].update(lr=0.5)),
        "parameter group 0.lr is 0.5 but the saved schedule's rate is",
    ),
    "lr-NaN-string": (
        optimizer_groups(lambda g: g[0].update(lr="NaN")),
        'parameter group 0.lr is "NaN", not a finite number',
    ),
    "betas": (
        optimizer_groups(lambda g: g[0].update(betas=[0.9, 1.5])),
        "betas is [0.9, 1.5], not two numbers",
    ),
    "weight-decay": (
        optimizer_groups(lambda g: g[0].update(weight_decay=0.5)),
        "parameter group 0.weight_decay is 0.5, this run's is 0.0",
    ),
    "amsgrad": (optimizer_groups(lambda g: g[1].update(amsgrad=True)), "parameter group 1.amsgrad is true"),
    # the model's weights
    "weights-shape": (
        edit_safetensors(
            "model.safetensors", None, lambda t: t.update({POSITIONS: t[POSITIONS][:, :16].contiguous()})
        ),
        f"model.safetensors: {POSITIONS} is torch.float32 [40, 16], the model's is torch.float32 [40, 32]",
    ),
    "weights-nan": (
        edit_safetensors("model.safetensors", None, lambda t: t[POSITIONS].fill_(float("nan"))),
        f"model.safetensors: {POSITIONS} holds NaN or infinite values",
    ),
    # the loop's counters
    "step-beyond-the-run": (
        counters(global_step=10**18),
        "counters.global_step is 1000000000000000000 but the checkpoint's trainer_state.json says step 2",
    ),
    "position": (
        counters(batches_in_epoch=1),
        "counters.batches_in_epoch is 1 in epoch 0, which is not the checkpoint's step 2",
    ),
    "position-beyond": (
        counters(batches_in_epoch=7),
        "counters.batches_in_epoch is 7 in epoch 0, more micro-batches than the checkpoint's 2 steps leave",
    ),
    "epoch-beyond": (counters(epoch=3), "counters.epoch is 3, more epochs than the checkpoint's 2 steps"),
    "group-params-floats": (
        optimizer_groups(lambda g: g[1].update(params=[float(i) for i in g[1]["params"]])),
        "parameter group 1 does not list its parameters",
    ),
    "lambda-none": (
        scheduler(lr_lambdas=[None, 3]),
        "scheduler.lr_lambdas[0] does not hold the expected fields",
    ),
    "best-step": (
        counters(best_metric=1.0, best_step=3),
        "counters.best_step is 3, beyond the checkpoint's step 2",
    ),
    "best-pair": (counters(best_metric=1.0), "counters.best_metric and counters.best_step disagree"),
    "patience": (
        counters(evals_without_improvement=10**18),
        "counters.evals_without_improvement is 1000000000000000000, beyond the checkpoint's step 2",
    ),
    "history": (counters(history=[{"step": 7, "train/loss": 1.0}]), "counters.history row 0 is at step 7"),
    "history-value": (
        counters(history=[{"step": 1, "train/loss": "low"}]),
        'counters.history row 0: train/loss is "low", not a number',
    ),
    # the schedule
    "nan-lr": (edit_json("loop_state.json", nan_lr), "scheduler._last_lr[0] is nan, not a finite number"),
    "string-lr": (scheduler(_last_lr=["NaN", "NaN"]), 'scheduler._last_lr[0] is "NaN", not a finite number'),
    "negative-lr": (
        scheduler(_last_lr=[-1.0, -1.0]),
        "scheduler._last_lr[0] is -1.0, a negative learning rate",
    ),
    "lr-off-the-schedule": (
        scheduler(_last_lr=[0.5, 0.5]),
        "scheduler._last_lr[0] is 0.5, but the schedule gives 0.000888889 at step 2",
    ),
    "schedule-step": (
        scheduler(last_epoch=10**18, _step_count=10**18 + 1),
        "scheduler.last_epoch is 1000000000000000000, not a step from 0 to the checkpoint's 2",
    ),
    "schedule-base": (scheduler(base_lrs=[1.0, 1.0]), "scheduler.base_lrs[0] is 1.0, this run's is 0.001"),
    "schedule-lambda-state": (
        scheduler(lr_lambdas=[{"__call__": 1}, {}]),
        "scheduler.lr_lambdas[0] does not hold the expected fields",
    ),
    "accelerator-step": (
        edit_json("loop_state.json", lambda loop: loop.update(accelerator_step=-3)),
        "accelerator_step is -3, not a count of the checkpoint's micro-batches",
    ),
    # the random states
    "python-random-version": (
        python_random(lambda p: p.__setitem__(0, 2)),
        "rng_state_0.safetensors does not hold the random states of a process",
    ),
    "python-random-word": (
        python_random(lambda p: p[1].__setitem__(3, 2**40)),
        "rng_state_0.safetensors does not hold the random states of a process",
    ),
    "torch-random-length": (
        edit_safetensors("rng_state_0.safetensors", None, lambda t: t.update(torch=t["torch"][:100].clone())),
        "rng_state_0.safetensors does not hold the random states of a process",
    ),
}


def test_every_counter_of_the_loop_has_its_check():
    """A field added to TrainState must come with its row (kind, range, agreement) in the COUNTERS table."""
    names = [field.name for field in COUNTERS.fields]
    assert names[0] == "global_step"
    assert set(names) == {f.name for f in dataclasses.fields(TrainState)}


# ----------------------------------------------------------------------------------------------------------
# refusals generated from the loop state's table (kiln.checkpoint_state.LOOP_STATE): every field of a wrong
# kind, null where it may not be, missing, and a field the table does not have, each refused in one line

MISFITS = {  # each kind of field: how a refusal names it, and values that are not of it
    COUNT: ("a count", ["2", -1, 1.5, True]),
    MICRO_BATCHES: ("a count of the checkpoint's micro-batches", [-3, 2.0]),
    NUMBER: ("a finite number", ["NaN", float("nan"), float("inf"), False]),
    SECONDS: ("a finite number of seconds", [float("inf"), -1.0, "1"]),
    OBJECT: ("a JSON object", [[], 1]),
    ROWS: ("a list of logged rows", [{}, "rows"]),
    STOP_REASON: (
        "one of ('max_steps', 'epochs', 'early_stopping', 'time_budget', 'signal')",
        ["rm -rf", 1],
    ),
}

WINDOW = {"steps": 1, "tokens": 64, "seconds": 0.5, "sums": {"loss": [6.0]}, "dtypes": {"loss": "float32"}}
"""A logging window one step in (the checkpoint's own is null: it logged every step)."""


def table_fields(table: Table, where: str = ""):
    """(place, field, the table holding it) of every field of `table` and of the tables within it."""
    for field in table.fields:
        place = f"{where}.{field.name}" if where else field.name
        yield place, field, table
        if isinstance(field.kind, Table):
            yield from table_fields(field.kind, place)


def shown(value) -> str:
    return repr(value) if isinstance(value, float) and not math.isfinite(value) else json.dumps(value)


def misfit_cases():
    """(the field's place, its value, the refusal): each field of a wrong kind, null where it may not be and
    missing where it may not be; a field no table has, in each table."""
    tables = [("", LOOP_STATE)]
    for place, field, holder in table_fields(LOOP_STATE):
        if isinstance(field.kind, Table):
            tables.append((place, field.kind))
            words, values = None, [[]]
        else:
            words, values = MISFITS.get(field.kind, (None, []))  # a kind without misfits fails a test below
        for value in values + ([] if field.null else [None]):
            refusal = f"loop_state.json: {place} is {shown(value)}, not {words}"
            if words is None:
                refusal = f"loop_state.json does not hold {field.kind.holds}"
            yield pytest.param(place, value, refusal, id=f"{place}={shown(value)}")
        if not field.absent:
            refusal = f"loop_state.json does not hold {holder.holds}"
            yield pytest.param(place, KeyError, refusal, id=f"{place} missing")
    for place, table in tables:
        refusal = f"loop_state.json does not hold {table.holds}"
        yield pytest.param(f"{place}.surprise".lstrip("."), 1, refusal, id=f"{place or 'loop'}.surprise")


@pytest.fixture(scope="module")
def run_objects():
    """One run's model, optimizer and schedule, which a refused check leaves as they were."""
    return build()


@pytest.fixture(scope="module")
def intact_loop(saved) -> dict:
    """The checkpoint's loop_state.json with a logging window (the fields of every table present)."""
    loop = json.loads((saved / "checkpoint" / "loop_state.json").read_text())
    loop["log_window"] = dict(WINDOW)
    return loop


def test_the_loop_state_with_a_logging_window_loads(saved, tmp_path, run_objects, intact_loop):
    shutil.copytree(saved / "checkpoint", tmp_path / "checkpoint")
    (tmp_path / "checkpoint" / "loop_state.json").write_text(json.dumps(intact_loop))
    checked = check_training_state(*run_objects, tmp_path / "checkpoint", EXPECTED, 1)
    assert checked.loop["log_window"] == WINDOW


def test_every_kind_of_field_has_its_misfits():
    """A kind added to the table comes with values a test refuses (and the words its refusal uses)."""
    kinds = {field.kind for _, field, _ in table_fields(LOOP_STATE) if not isinstance(field.kind, Table)}
    assert kinds <= set(MISFITS), kinds - set(MISFITS)
    assert all(kind.name == words for kind, (words, _) in MISFITS.items())


@pytest.mark.parametrize("place, value, refusal", list(misfit_cases()))
def test_a_field_out_of_the_table_is_refused(tmp_path, run_objects, intact_loop, place, value, refusal):
    """One field of loop_state.json changed (or removed, or added): refused in one line naming it."""
    loop = json.loads(json.dumps(intact_loop))
    *parents, name = place.split(".")
    fields = loop
    for parent in parents:
        fields = fields[parent]
    if value is KeyError:
        del fields[name]
    else:
        fields[name] = value
    (tmp_path / "loop_state.json").write_text(json.dumps(loop))
    with pytest.raises(DamagedCheckpoint) as err:
        check_training_state(*run_objects, tmp_path, EXPECTED, 1)
    assert str(err.value) == refusal


def test_an_intact_checkpoint_loads(saved, tmp_path):
    accelerator, model, optimizer, scheduler_ = build()
    state = TrainState()
    load_training_state(accelerator, model, optimizer, scheduler_, state, saved / "checkpoint", EXPECTED, 1)
    assert state.global_step == 2 and scheduler_.last_epoch == 2
    assert int(optimizer.state_dict()["state"][0]["step"]) == 2


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_changed_field_is_refused_before_anything_is_loaded(saved, tmp_path, case):
    damage, message = CASES[case]
    shutil.copytree(saved, tmp_path / "saved")
    folder = tmp_path / "saved" / "checkpoint"
    damage(folder)
    accelerator, model, optimizer, scheduler_ = build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(DamagedCheckpoint) as err:
        check_training_state(accelerator, model, optimizer, scheduler_, folder, EXPECTED, 1)
    assert message in str(err.value), str(err.value)
    assert "\n" not in str(err.value)
    assert isinstance(err.value, ModelMismatch) == case.startswith("weights-shape")
    # nothing of the run changed: its weights, its optimizer (no state yet), its schedule
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert optimizer.state_dict()["state"] == {} and scheduler_.last_epoch == 0


def test_one_tensor_check_for_weights_and_optimizer_state():
    """check_tensors, as the model's weights and each parameter's optimizer state use it: the names, each a tensor
    of the expected shape and dtype (else the caller's mismatch), every floating-point one finite."""
    expected = {"a": torch.zeros(2, 3), "b": torch.zeros(4, dtype=torch.int64)}
    check_tensors(
        {"a": torch.ones(2, 3), "b": torch.ones(4, dtype=torch.int64)}, expected, "f", "the model's"
    )
    for saved, refusal, kind in [
        (
            {"a": torch.ones(2, 3)},
            "f holds other tensors than the model's (missing ['b'], unexpected [])",
            ModelMismatch,
        ),
        (
            {"a": torch.ones(2, 3), "b": torch.ones(4, dtype=torch.int64), "c": torch.ones(1)},
            "f holds other tensors than the model's (missing [], unexpected ['c'])",
            ModelMismatch,
        ),
        ({"a": 1.0, "b": torch.ones(4, dtype=torch.int64)}, "f: a is not a tensor", DamagedCheckpoint),
        (
            {"a": torch.ones(3, 2), "b": torch.ones(4, dtype=torch.int64)},
            "f: a is torch.float32 [3, 2], the model's is torch.float32 [2, 3]",
            ModelMismatch,
        ),
        (
            {"a": torch.ones(2, 3), "b": torch.ones(4, dtype=torch.int32)},
            "f: b is torch.int32 [4], the model's is torch.int64 [4]",
            ModelMismatch,
        ),
        (
            {"a": torch.full((2, 3), float("inf")), "b": torch.ones(4, dtype=torch.int64)},
            "f: a holds NaN or infinite values",
            DamagedCheckpoint,
        ),
    ]:
        with pytest.raises(DamagedCheckpoint) as err:
            check_tensors(saved, expected, "f", "the model's", mismatch=ModelMismatch)
        assert str(err.value) == refusal and type(err.value) is kind


def test_the_checkpoint_must_agree_with_its_folder_name_and_the_run(saved, tmp_path):
    accelerator, model, optimizer, scheduler_ = build()
    folder = saved / "checkpoint"
    for expected, message in [
        (
            dataclasses.replace(EXPECTED, folder_step=3),
            "counters.global_step is 2 but the checkpoint's folder is named for step 3",
        ),
        (
            dataclasses.replace(EXPECTED, total_steps=1),
            "counters.global_step is 2, beyond this run's 1 steps",
        ),
        (dataclasses.replace(EXPECTED, folder_step=2), None),
    ]:
        if message is None:
            check_training_state(accelerator, model, optimizer, scheduler_, folder, expected, 1)
            continue
        with pytest.raises(DamagedCheckpoint, match=message):
            check_training_state(accelerator, model, optimizer, scheduler_, folder, expected, 1)
    # with --training.allow_config_change the schedule and the optimizer settings may be another run's
    loose = dataclasses.replace(EXPECTED, same_schedule=False)
    other = tmp_path / "other-schedule"
    shutil.copytree(folder, other)
    scheduler(_last_lr=[0.5, 0.5])(other)
    optimizer_groups(lambda groups: [g.update(lr=0.5) for g in groups])(other)
    assert math.isclose(
        check_training_state(accelerator, model, optimizer, scheduler_, other, loose, 1).loop["scheduler"][
            "_last_lr"
        ][0],
        0.5,
    )
