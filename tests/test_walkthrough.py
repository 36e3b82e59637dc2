"""The commands of docs/walkthrough.md and docs/continue-pretraining.md, read from the pages and run in a fresh
process each, in a scratch folder that holds the repository's scripts and configs (links) beside the user's own
`corpus/`, `prepared/` and `runs/`.

What a CPU and two cores cannot run as written is changed, each change named here with its reason: the 8-GPU
accelerate config becomes the 2-process CPU one, BERT-base and its 250,000 steps shrink to a tiny model and 3
steps (tests/test_bert_base_plan.py's overrides), the Hub is the test Hub (user `you` is its `kiln-test`), and
`hf download` of a public checkpoint becomes a small random BERT or GPT-2 made here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TEST_USER
from kiln_testing import REPO, free_port
from test_bert_base_plan import MUST_SHRINK
from test_public_datasets import serve_glue_sst2

from bench.pages import page_commands

BOOK = REPO / "data/pretrain/the_time_machine.txt"
HF = str(Path(sys.executable).with_name("hf"))
ACCELERATE = [sys.executable, "-m", "accelerate.commands.accelerate_cli"]  # = `accelerate`
KILN_LAUNCH = [sys.executable, "-m", "kiln.launcher"]  # = `kiln-launch`


def workspace(tmp_path: Path) -> Path:
    """A folder that looks like a checkout with the user's corpus in it: the repository's code and configs linked."""
    work = tmp_path / "work"
    work.mkdir()
    for name in ("configs", "pretrain", "finetune", "kiln", "data"):
        (work / name).symlink_to(REPO / name)
    (work / "corpus").mkdir()
    shutil.copy(BOOK, work / "corpus" / BOOK.name)
    return work


def run(argv: list[str], work: Path, env_extra: dict | None = None, timeout: int = 600) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        **(env_extra or {}),
    }
    done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{shlex.join(argv)}\nexit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout + done.stderr


def as_run_here(command: str) -> tuple[list[str], dict]:
    """The page's command as this machine runs it: the changes named in the module docstring, nothing else."""
    argv, env = shlex.split(command.replace("you/", f"{TEST_USER}/")), {}
    if argv[0] == "kiln-launch":
        assert argv[1:3] == ["--config_file", "configs/accelerate/bert-base-1x8.yaml"], argv
        argv = [
            *KILN_LAUNCH,
            "--config_file",
            "configs/accelerate/cpu-2proc.yaml",
            "--main_process_port",
            str(free_port()),
            *argv[3:],
            *map(str, MUST_SHRINK),
        ]
        env["ACCELERATE_USE_CPU"] = "1"
    elif argv[:2] == ["accelerate", "launch"]:
        argv = [*ACCELERATE, "launch", "--num_processes", "1", *argv[2:]]
        if "pretrain/run.py" in argv:  # continuing pretraining: a few steps of small batches, no tracker
            argv += [
                "--training.max_steps",
                "3",
                "--training.per_device_train_batch_size",
                "4",
                "--training.eval_steps",
                "3",
                "--training.max_eval_batches",
                "1",
                "--training.mixed_precision",
                "null",
                "--logging.report_to",
                "none",
                "--logging.logging_steps",
                "1",
            ]
        else:  # fine-tuning on the test Hub's small SST-2
            argv += [
                "--training.max_steps",
                "2",
                "--training.per_device_train_batch_size",
                "4",
                "--logging.logging_steps",
                "1",
            ]
    elif argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
        if argv[1:4] == ["-m", "pretrain.data", "prepare"]:
            argv = [a if a != "16" or argv[i - 1] != "--num_proc" else "1" for i, a in enumerate(argv)]
    elif argv[0] == "hf":
        argv = [HF, *argv[1:]]
    else:
        argv = ["bash", "-c", shlex.join(argv)]
    return argv, env


@pytest.mark.slow
def test_the_walkthrough_runs_end_to_end(tmp_path, hub):
    page = REPO / "docs/walkthrough.md"
    commands = page_commands(page)
    assert [shlex.split(c)[0] for c in commands] == [
        "ls",
        "python",
        "kiln-launch",
        "tail",
        "kiln-launch",
        "hf",
        "accelerate",
    ], commands
    accelerate_config = (REPO / "configs/accelerate/bert-base-1x8.yaml").read_text()
    for line in ("num_processes: 8", "distributed_type: MULTI_GPU", "mixed_precision: bf16"):
        assert (
            line in accelerate_config and line in page.read_text()
        )  # the config the page shows is the shipped one
    work = workspace(tmp_path)
    serve_glue_sst2(hub)
    outputs = []
    for command in commands:
        argv, env = as_run_here(command)
        outputs.append(run(argv, work, env))
    listing, prepared, launched, tail, resumed, uploaded, finetuned = outputs
    assert BOOK.name in listing
    assert (work / "prepared/my-corpus/manifest.json").is_file()
    assert "processes = 2" in launched and "global batch = 8 sequences" in launched  # 1,024 in the plan
    rows = [json.loads(line) for line in tail.splitlines() if line.startswith("{")]
    assert len(rows) == 2 and any("train/tokens_per_s" in row or "eval/mlm_loss" in row for row in rows), tail
    assert re.search(r"resumed from \S+step-0000000[23] at step [23]", resumed), resumed[-2000:]
    run_dir = work / "runs/my-bert"
    assert (run_dir / "final/model.safetensors").is_file()
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(hub.files(f"{TEST_USER}/my-bert"))
    assert (work / "runs/my-bert-sst2/final/model.safetensors").is_file(), finetuned[-2000:]


def make_checkpoint(kind: str, folder: Path) -> None:
    """A small random BERT (or GPT-2, or Llama) with a tokenizer trained on one shipped book, saved as the Hub holds
    one."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import (
        BertConfig,
        BertForPreTraining,
        BertTokenizerFast,
        GPT2Config,
        GPT2LMHeadModel,
        GPT2TokenizerFast,
        LlamaConfig,
        LlamaForCausalLM,
    )

    lines = BOOK.read_text().splitlines()
    if kind == "bert":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.train_from_iterator(
            lines,
            trainers.WordPieceTrainer(
                vocab_size=800, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
            ),
        )
        tokenizer = BertTokenizerFast(tokenizer_object=tok, do_lower_case=True)
        model = BertForPreTraining(
            BertConfig(
                vocab_size=len(tokenizer),
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
            )
        )
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(
            lines,
            trainers.BpeTrainer(
                vocab_size=600,
                special_tokens=["<|endoftext|>"],
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            ),
        )
        end = "<|endoftext|>"
        tokenizer = GPT2TokenizerFast(tokenizer_object=tok, bos_token=end, eos_token=end, unk_token=end)
        ids = dict(bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
        if kind == "gpt2":
            model = GPT2LMHeadModel(
                GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=256, **ids)
            )
        else:  # a Llama-family model: grouped-query heads, a rope base of its own, untied embeddings
            model = LlamaForCausalLM(
                LlamaConfig(
                    vocab_size=len(tokenizer),
                    hidden_size=32,
                    intermediate_size=64,
                    num_hidden_layers=2,
                    num_attention_heads=4,
                    num_key_value_heads=2,
                    max_position_embeddings=256,
                    tie_word_embeddings=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                    **ids,
                )
            )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


KINDS = ["bert", "gpt2", "llama"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_continued_pretraining_from_bert_gpt2_and_llama(tmp_path, kind):
    page = REPO / "docs/continue-pretraining.md"
    commands = page_commands(page)
    download = [c for c in commands if c.startswith("hf download")]
    assert len(download) == 3 and "bert" in download[0] and "gpt2" in download[1], commands
    assert "SmolLM2" in download[2], commands
    # the page's steps for this model: download, continue from the downloaded folder (converted on the way in),
    # convert back
    first = commands.index(download[KINDS.index(kind)])
    folder = shlex.split(commands[first])[-1]
    steps = [commands[first + 1]]
    assert f"--model.init_from {folder} " in steps[0], steps
    back = [
        c
        for c in commands
        if c.startswith("python -m pretrain.convert runs/") and shlex.split(steps[0])[-1] in c
    ]
    assert len(back) == 1, (steps, commands)
    work = workspace(tmp_path)
    make_checkpoint(kind, work / folder)  # what `hf download` would leave, small and random
    outputs = []
    for command in [*steps, *back]:
        argv, env = as_run_here(command)
        outputs.append(run(argv, work, env))
    family = {"bert": "BERT", "gpt2": "GPT-2", "llama": "Llama"}[kind]
    assert f"--model.init_from {folder} is a transformers {family} checkpoint" in outputs[0], outputs[0][
        -3000:
    ]
    continued, plain = shlex.split(steps[0])[-1], shlex.split(back[0])[-1]
    saved = json.loads((work / continued / "final/config.json").read_text())
    assert saved["model_type"] == ("kiln_encoder" if kind == "bert" else "kiln_decoder")
    if kind == "llama":  # the checkpoint's own pieces, not the run config's
        assert (
            saved["preset"] == "llama"
            and saved["num_key_value_heads"] == 2
            and saved["rope_theta"] == 100000.0
        )
        assert not saved["tie_word_embeddings"]
    assert saved["hidden_size"] == 32  # the shape of the checkpoint it started from, not the config's
    rows = [json.loads(line) for line in (work / continued / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r][-1] == 3
    # converted back: a plain transformers model that loads without Kiln's code
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(work / plain).model_type == kind
