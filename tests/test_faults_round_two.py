"""Faults and bad input, round two (issue 24): each case run the way a user meets it, the script's command line
or `accelerate launch` in a fresh process, ending on one line that names the problem and the fix."""

import os
import subprocess
import sys

import pytest
from kiln_testing import DEBUG, REPO
from test_finetune_scripts import synthetic_ner_sentences, write_conll


def script_cli(script: str, *args, env_extra=None, timeout=300) -> tuple[int, str]:
    """`python SCRIPT ARGS...` from the repo root in a fresh process: (exit status, stdout + stderr)."""
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        **(env_extra or {}),
    }
    done = subprocess.run(
        [sys.executable, str(REPO / script), *map(str, args)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return done.returncode, done.stdout


def assert_one_line_error(status: int, output: str) -> str:
    assert status == 2 and "Traceback" not in output, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: "), output
    return last


# ----------------------------------------------------------------------------------------------------------
# item 7: a CoNLL line that lost its tag column


@pytest.mark.slow
def test_a_conll_word_line_without_its_tag_is_named_not_learnt_as_a_tag(kiln_checkpoints, tmp_path):
    encoder, _ = kiln_checkpoints
    train = write_conll(tmp_path / "train.txt", synthetic_ner_sentences(16, 0))
    lines = train.read_text().splitlines()
    broken = next(i for i, line in enumerate(lines) if line.endswith(" O") and i > 4)
    lines[broken] = lines[broken].split()[0]  # "w2 O" -> "w2"
    train.write_text("\n".join(lines) + "\n")
    out = tmp_path / "tag"
    status, output = script_cli(
        "finetune/tag.py",
        "--model.checkpoint",
        encoder,
        "--training.output_dir",
        out,
        "--data.train_file",
        train,
        "--data.validation_file",
        train,
        "--data.test_file",
        train,
        "--training.max_steps",
        1,
    )
    message = assert_one_line_error(status, output)
    assert message == (
        f"error: {train}:{broken + 1} has no tag column (just {lines[broken]!r}); give every word "
        "line its tag, or pick --data.tag_column / --data.token_column"
    ), output
    assert not out.exists()


# ----------------------------------------------------------------------------------------------------------
# item 13: MLM alone on more than one process


def multi_process_launch(script: str, *args, env_extra=None, timeout=300) -> tuple[int, str]:
    """`accelerate launch --multi_gpu --num_processes 2 SCRIPT ARGS...` on CPU (torchrun's agent, gloo)."""
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--main_process_port",
        "0",  # 0: accelerate picks a free port
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
    ]
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ACCELERATE_", "FSDP_"))}
    env = {
        **env,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_USE_CPU": "1",
        **(env_extra or {}),
    }
    done = subprocess.run(
        [*launch, str(REPO / script), *map(str, args)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return done.returncode, done.stdout


@pytest.mark.slow
def test_mlm_alone_trains_on_two_processes_and_exports_a_fill_mask_model(tmp_path):
    import json

    import torch
    from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoTokenizer

    import pretrain.modeling  # noqa: F401  (registers Kiln with the Auto classes, as the fine-tuning scripts do)

    out = tmp_path / "mlm"
    status, output = multi_process_launch(
        "pretrain/run.py",
        "--config",
        DEBUG,
        "--model.objective",
        "mlm",
        "--training.output_dir",
        out,
        "--training.max_steps",
        3,
        "--training.eval_steps",
        3,
        "--training.save_steps",
        0,
    )
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
    _, info = AutoModelForSequenceClassification.from_pretrained(
        final, output_loading_info=True, num_labels=2
    )
    assert all(key.startswith(("classifier.", "model.pooler.")) for key in info["missing_keys"]), info


# ----------------------------------------------------------------------------------------------------------
# item 16: empty text cells in a classification file


@pytest.mark.slow
def test_empty_text_cells_in_a_classification_file_are_named_by_file_column_and_row(
    kiln_checkpoints, tmp_path
):
    import csv

    from test_finetune_scripts import write_sentiment

    encoder, _ = kiln_checkpoints
    files = write_sentiment(tmp_path, sizes=(32, 8, 8))
    with open(files["train"], newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    rows[4][0] = rows[9][0] = ""  # data rows 4 and 9 (line 1 is the header)
    with open(files["train"], "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    out = tmp_path / "cls"
    status, output = script_cli(
        "finetune/classify.py",
        "--model.checkpoint",
        encoder,
        "--training.output_dir",
        out,
        "--data.train_file",
        files["train"],
        "--data.validation_file",
        files["validation"],
        "--data.test_file",
        files["test"],
        "--training.max_steps",
        1,
    )
    message = assert_one_line_error(status, output)
    assert message == (
        f"error: {files['train']}: text column 'sentence' is empty in row 4 and 1 more rows (rows "
        "counted from 1, without a header line); fill in or drop those rows"
    ), output
    assert not out.exists()


# ----------------------------------------------------------------------------------------------------------
# item 17: a tokenizer larger than the model's vocabulary


def test_a_tokenizer_larger_than_the_vocabulary_is_refused_when_they_load(kiln_checkpoints, tmp_path, capsys):
    """finetune/classify.py's command line in this process (run_finetune_cli: its one-line errors); the script's
    one line in a fresh process is the empty-text-cells test's."""
    import shutil

    import pytest
    from kiln_testing import reset_accelerate
    from test_finetune_scripts import write_sentiment
    from transformers import AutoTokenizer

    from finetune.classify import main as classify_main
    from finetune.common import run_finetune_cli

    encoder, _ = kiln_checkpoints
    folder = tmp_path / "encoder"
    shutil.copytree(encoder, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens([f"newword{i}" for i in range(100)])  # ids past the model's embeddings
    tokenizer.save_pretrained(folder)
    vocab_size = __import__("json").loads((folder / "config.json").read_text())["vocab_size"]
    assert len(tokenizer) > vocab_size
    files = write_sentiment(tmp_path, sizes=(32, 8, 8))
    for split in ("train", "validation", "test"):  # without the check: an index error at the first batch
        with open(files[split], "a", encoding="utf-8") as f:
            f.write("the newword7 was good,positive\n")
    out = tmp_path / "cls"
    capsys.readouterr()
    reset_accelerate()
    try:
        with pytest.raises(SystemExit) as exit_info:
            run_finetune_cli(
                classify_main,
                [
                    "--model.checkpoint",
                    str(folder),
                    "--training.output_dir",
                    str(out),
                    "--data.train_file",
                    str(files["train"]),
                    "--data.validation_file",
                    str(files["validation"]),
                    "--data.test_file",
                    str(files["test"]),
                    "--training.max_steps",
                    "1",
                ],
            )
    finally:
        reset_accelerate()
    output = capsys.readouterr().err
    message = assert_one_line_error(exit_info.value.code, output)
    assert message.startswith(
        f"error: {folder}: its tokenizer has {len(tokenizer)} tokens but the model only "
        f"{vocab_size} embeddings; put the tokenizer the model was trained with"
    ), output
    assert not out.exists()


# ----------------------------------------------------------------------------------------------------------
# item 20: a UTF-16 or UTF-32 corpus file


def test_a_utf16_corpus_names_the_iconv_command_that_re_encodes_it_and_the_command_works(tmp_path, capsys):
    """The training command line in this process (an encoding error's one line through pretrain/run.py in a fresh
    process: test_start_checks' lone surrogate), the prepare command in a fresh process."""
    import codecs
    import shutil

    from kiln_testing import cli_in_process

    text = (REPO / "data/pretrain").glob("*.txt").__next__().read_text(encoding="utf-8")[:20000]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    utf16 = corpus / "notes.txt"
    utf16.write_bytes(
        codecs.BOM_UTF16_LE + text.encode("utf-16-le")
    )  # what Windows' Notepad writes as "Unicode"
    out = tmp_path / "run"
    status, lines = cli_in_process(
        capsys, "--data.data_files", corpus / "*.txt", "--training.output_dir", out, "--training.max_steps", 1
    )
    output = "\n".join(lines)
    message = assert_one_line_error(status, output)
    command = f"iconv -f UTF-16 -t UTF-8 {utf16} > {utf16}.utf8 && mv {utf16}.utf8 {utf16}"
    assert message == (
        f"error: {utf16} is UTF-16 text (it starts with a UTF-16 byte-order mark); Kiln reads "
        f"UTF-8: re-encode it with `{command}`"
    ), output
    if shutil.which("iconv"):  # the command it names gives the text back as UTF-8 (latin1 gave NULs)
        subprocess.run(command, shell=True, check=True)
        assert utf16.read_bytes() == text.encode("utf-8")

    # the prepare command (python -m pretrain.data prepare) reads files in chunks of its own: the same line
    utf32 = corpus / "notes.txt"
    utf32.write_bytes(codecs.BOM_UTF32_BE + text.encode("utf-32-be"))
    env = {"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pretrain.data",
            "prepare",
            "--config",
            DEBUG,
            "--data.data_files",
            str(corpus / "*.txt"),
            "--output",
            str(tmp_path / "prepared"),
        ],
        cwd=REPO,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    message = assert_one_line_error(done.returncode, done.stdout)
    assert message.startswith(
        f"error: {utf32} is UTF-32 text (it starts with a UTF-32 byte-order mark); Kiln "
        f"reads UTF-8: re-encode it with `iconv -f UTF-32 -t UTF-8 {utf32} >"
    ), done.stdout

    from pretrain.data.corpus import check_utf8

    with_bom = tmp_path / "utf-8-sig.txt"  # a UTF-8 byte-order mark is UTF-8: read (split_documents drops it)
    with_bom.write_bytes(codecs.BOM_UTF8 + text.encode("utf-8"))
    check_utf8([str(with_bom)])


# ----------------------------------------------------------------------------------------------------------
# item 21: a read-only Hugging Face cache


def read_only_command(folder) -> list[str]:
    """A command prefix under which `folder` cannot be written: a read-only bind mount in a private mount namespace
    for root (whom permissions do not stop), the folder's own permissions for anyone else."""
    import shutil

    import pytest

    if os.geteuid() != 0:
        os.chmod(folder, 0o555)
        return []
    if (
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode
    ):
        pytest.skip("a read-only folder for root needs unshare -m (a private mount namespace)")
    mount = 'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" && exec "$@"'
    return ["unshare", "-m", "sh", "-c", mount, str(folder)]


@pytest.mark.slow
def test_a_read_only_hf_home_names_the_datasets_cache_and_how_to_move_it(tmp_path):
    home = tmp_path / "hf-home"
    home.mkdir()
    prefix = read_only_command(home)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "HF_HOME": str(home),
    }
    env.pop("HF_DATASETS_CACHE", None)
    out = tmp_path / "run"
    done = subprocess.run(
        [
            *prefix,
            sys.executable,
            str(REPO / "pretrain/run.py"),
            "--config",
            DEBUG,
            "--training.output_dir",
            str(out),
            "--training.max_steps",
            "1",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    message = assert_one_line_error(done.returncode, done.stdout)
    cache = home / "datasets"
    assert message.startswith(f"error: the datasets cache {cache} is not writable ("), done.stdout
    assert message.endswith(
        "); point HF_DATASETS_CACHE (this cache only) or HF_HOME (every Hugging Face cache) at "
        "a writable folder, e.g. `export HF_HOME=/scratch/$USER/huggingface`"
    ), done.stdout
    assert "well-formed" not in message


# ----------------------------------------------------------------------------------------------------------
# item 11: the NaN guard under DeepSpeed


class FakeDeepSpeedEngine:
    """What accelerate's DeepSpeedEngineWrapper does with a DeepSpeed engine, on one CPU process: `backward` at the
    window's end clips and takes the optimizer step itself (DeepSpeed's engine.step()), with no overflow check
    of its own (DeepSpeed in fp32, or bf16 with check_grad_overflow off). DeepSpeed itself cannot run here."""

    def __init__(self, model, optimizer, max_norm: float):
        self.model, self.optimizer, self.max_norm = model, optimizer, max_norm
        self.steps, self.norm = 0, None

    def backward(self, loss, sync_gradients=True, **kwargs):
        import torch

        loss.backward(**kwargs)
        if sync_gradients:
            self.norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.steps += 1

    def get_global_grad_norm(self):
        return self.norm


class _StepsInsideTheEngine:
    """accelerate's DeepSpeedOptimizerWrapper: step and zero_grad are the engine's, in backward."""

    def __init__(self, wrapped):
        self.wrapped = wrapped

    def step(self):
        pass

    def zero_grad(self, set_to_none=None):
        pass

    def __getattr__(self, name):
        return getattr(self.wrapped, name)


def test_under_deepspeed_a_nan_loss_is_caught_before_the_engine_steps(tmp_path, monkeypatch, caplog):
    """Tested at the plugin level (see tests/test_engines.py): the Trainer's step runs with accelerate's
    DeepSpeed code paths (backward through the engine wrapper, the engine's gradient norm) around a fake engine
    that steps inside backward as DeepSpeed does; one forward's loss is NaN."""
    import torch
    from accelerate import DistributedType
    from accelerate.utils import DeepSpeedPlugin
    from kiln_testing import DEEPSPEED_YAML, launch_env, losses, nan_loss_at_forward, run
    from safetensors.torch import load_file

    from kiln.config import TrainingConfig
    from kiln.run_setup import configure_deepspeed
    from kiln.trainer import Trainer

    nan_loss_at_forward(monkeypatch, 3)
    # the shipped DeepSpeed config's plugin (ZeRO-2, bf16), as `accelerate launch --config_file` gives it
    with monkeypatch.context() as launched:
        env = launch_env(DEEPSPEED_YAML)
        for key, value in env.items():
            launched.setenv(key, value)
        plugin = DeepSpeedPlugin()
        configure_deepspeed(plugin, TrainingConfig(per_device_train_batch_size=8))
        plugin.set_mixed_precision(env["ACCELERATE_MIXED_PRECISION"])
        plugin._set_selected(
            True
        )  # what AcceleratorState does when it enables the plugin (minus transformers hooks)

    original_step, engines = Trainer._optimizer_step, []

    def step_under_deepspeed(self, micro_batches):
        acc = self.accelerator
        if not engines:
            engines.append(FakeDeepSpeedEngine(acc.unwrap_model(self.model), self.optimizer.optimizer, 1.0))
        saved = acc.state.distributed_type, acc.state.deepspeed_plugins, self.optimizer
        acc.state.distributed_type, acc.state.deepspeed_plugins = (
            DistributedType.DEEPSPEED,
            {"default": plugin},
        )
        acc.deepspeed_engine_wrapped, self.optimizer = engines[0], _StepsInsideTheEngine(self.optimizer)
        try:
            return original_step(self, micro_batches)
        finally:
            (acc.state.distributed_type, acc.state.deepspeed_plugins, self.optimizer) = saved
            acc.deepspeed_engine_wrapped = None

    monkeypatch.setattr(Trainer, "_optimizer_step", step_under_deepspeed)
    out = tmp_path / "deepspeed-nan"
    with caplog.at_level("WARNING", logger="kiln"):
        state = run(out, "--training.max_steps", 6, "--training.save_steps", 0, "--training.eval_steps", 0)
    assert (
        "step 3: the loss or gradient norm is not finite" in caplog.text
        and "(1 in a row, limit 3)" in caplog.text
    )
    assert engines[0].steps == 5  # the engine never stepped on the NaN loss
    assert (
        plugin.deepspeed_config["bf16"]["enabled"]
        and plugin.deepspeed_config["zero_optimization"]["stage"] == 2
    )
    assert state.global_step == 6 and state.stop_reason == "max_steps"
    curve = losses(out)
    assert curve[3] != curve[3] and all(curve[s] == curve[s] for s in (1, 2, 4, 5, 6))
    weights = load_file(out / "final" / "model.safetensors")
    assert all(bool(torch.isfinite(w).all()) for w in weights.values())


# ----------------------------------------------------------------------------------------------------------
# item 12: the best model under FSDP2

_BEST_UNDER_FSDP2 = """\
import sys, types, json
import torch, torch.distributed as dist
from accelerate import DistributedType
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_prepare_model
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
sys.path.insert(0, "tests")
from kiln_testing import tiny_encoder_config
from kiln.callbacks import BestModel
from kiln.trainer import TrainState
from pretrain.modeling import KilnEncoderForPreTraining

dist.init_process_group("gloo")
rank = dist.get_rank()
full = lambda m: get_model_state_dict(m, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
torch.manual_seed(0)
model = KilnEncoderForPreTraining(tiny_encoder_config())
accelerator = types.SimpleNamespace(  # what BestModel reads of accelerate's Accelerator under FSDP2
    state=types.SimpleNamespace(fsdp_plugin=FullyShardedDataParallelPlugin()), mixed_precision="no",
    is_main_process=rank == 0, is_local_main_process=rank == 0, device=torch.device("cpu"),
    torch_device_mesh=None, parallelism_config=None, distributed_type=DistributedType.FSDP, get_state_dict=full,
    unwrap_model=lambda m: m, wait_for_everyone=dist.barrier, print=lambda *a: print(*a) if rank == 0 else None,
)
sharded = fsdp2_prepare_model(accelerator, model)
state = TrainState(global_step=2, best_step=2, best_metric=0.5, history=[{"step": 2, "eval/loss": 0.5}])
trainer = types.SimpleNamespace(accelerator=accelerator, model=sharded, state=state,
                                training=types.SimpleNamespace(metric_for_best_model="loss"))
best = BestModel(sys.argv[1], tokenizer=None)
best.on_best(trainer, state)
best_weights = {k: v.clone() for k, v in full(sharded).items()}
with torch.no_grad():  # later steps move every weight away from the best
    for p in sharded.parameters():
        p.add_(1.0)
state.global_step = 4
state.history.append({"step": 4, "eval/loss": 0.9})
moved = full(sharded)
card_state = best._load_best(trainer, state)
loaded = full(sharded)
if rank == 0:
    print("RESULT", json.dumps(dict(
        moved=max(float((moved[k] - best_weights[k]).abs().max()) for k in best_weights),
        worst=max(float((loaded[k] - best_weights[k]).abs().max()) for k in best_weights),
        keys=sorted(loaded) == sorted(best_weights), card_step=card_state.history[-1]["step"],
        tied=sharded.mlm_head.decoder.weight is sharded.model.embeddings.word_embeddings.weight)))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_the_best_model_under_fsdp2_is_saved_and_loaded_back_into_the_shards(tmp_path):
    """BestModel with accelerate's own FSDP2 preparation of the shipped config, 2 gloo processes on CPU (as
    tests/test_engines.py; accelerate runs FSDP on CPU only at this level): the best weights saved from the
    shards come back into them at the end, after later steps moved them."""
    import json

    from kiln_testing import run_under_fsdp

    script = tmp_path / "best_fsdp2.py"
    script.write_text(_BEST_UNDER_FSDP2)
    done = run_under_fsdp(script, tmp_path / "best")
    (result,) = [
        json.loads(line.split("RESULT ", 1)[1]) for line in done.stdout.splitlines() if "RESULT " in line
    ]
    assert result["moved"] >= 1.0 - 1e-6 and result["keys"] and result["tied"]
    assert result["worst"] == 0.0, result
    assert result["card_step"] == 2  # the card describes the best evaluation
    assert (tmp_path / "best" / "model.safetensors").is_file()
