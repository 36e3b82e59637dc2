"""Real pretraining runs through accelerate's FSDP / DeepSpeed engines: loss goes down, resume works, final/ loads.

    python bench/engines.py --engine fsdp --engine deepspeed-zero2 --out runs/engines --json engines.json
    python bench/engines.py --engine none --steps 6 --small      # a CPU smoke test of this script itself

For each engine (an accelerate config in configs/accelerate/, or `none` for a plain single process) and each
model family, three steps in fresh processes, the (engine, family) pipelines side by side:
1. `accelerate launch --config_file configs/accelerate/ENGINE.yaml --num_processes N pretrain/run.py` for
   `--steps` optimizer steps, a checkpoint every third of them;
2. the same command resumed from the checkpoint at two thirds (`--training.resume_from_checkpoint PATH`): it
   trains the last third again, so its logged losses can be set against the first run's at the same steps;
3. `final/` loaded in a fresh process with transformers' Auto classes and `trust_remote_code=True` (no Kiln
   import), scored on held-out text, and run through `fill-mask` / `generate`.
The summary gives the first and last logged training loss, the eval losses, the largest difference between the
two runs' losses over the re-trained steps, and what the loaded model did.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

ENCODER = ["--config", "configs/pretrain/encoder-mini.yaml", "--training.per_device_train_batch_size", "64"]
DECODER = [
    "--config",
    "configs/pretrain/decoder-tiny.yaml",
    "--model.hidden_size",
    "256",
    "--model.num_hidden_layers",
    "4",
    "--model.num_attention_heads",
    "4",
    "--model.intermediate_size",
    "1024",
    "--training.per_device_train_batch_size",
    "32",
]
SMALL = [  # --small: the shapes of configs/pretrain/debug.yaml, for a quick check on CPU
    "--model.hidden_size",
    "32",
    "--model.num_hidden_layers",
    "2",
    "--model.num_attention_heads",
    "2",
    "--model.intermediate_size",
    "64",
    "--tokenizer.vocab_size",
    "512",
    "--data.max_seq_length",
    "64",
    "--data.max_train_documents",
    "400",
    "--training.per_device_train_batch_size",
    "8",
]

CHECK_FINAL = textwrap.dedent(
    """
    import json, sys, torch
    from pathlib import Path
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForPreTraining, AutoTokenizer
    from transformers import pipeline
    final, kind, text_file = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    tokenizer = AutoTokenizer.from_pretrained(final, trust_remote_code=True)
    text = Path(text_file).read_text()[-20000:]  # the end of a file: mostly past the runs' train/eval samples
    device = "cuda" if torch.cuda.is_available() else "cpu"
    result = {"auto_map": json.loads((final / "config.json").read_text()).get("auto_map")}
    if kind == "decoder":
        model = AutoModelForCausalLM.from_pretrained(final, trust_remote_code=True).to(device).eval()
        ids = tokenizer(text, return_tensors="pt").input_ids[:, :128].to(device)
        with torch.no_grad():
            result["heldout_loss"] = model(input_ids=ids, labels=ids).loss.item()
        prompt = tokenizer("Once upon a time", return_tensors="pt").to(device)
        out = model.generate(**prompt, max_new_tokens=24, do_sample=False)
        result["generate"] = tokenizer.decode(out[0], skip_special_tokens=True)
    else:
        model = AutoModelForPreTraining.from_pretrained(final, trust_remote_code=True).to(device).eval()
        enc = tokenizer(text[:2000], return_tensors="pt", truncation=True, max_length=128).to(device)
        labels = enc.input_ids.clone()
        masked = torch.zeros_like(labels, dtype=torch.bool)
        masked[:, 1:-1:7] = True  # every 7th token
        inputs = enc.input_ids.masked_fill(masked, tokenizer.mask_token_id)
        with torch.no_grad():
            out = model(input_ids=inputs, attention_mask=enc.attention_mask, labels=labels.masked_fill(~masked, -100))
        result["heldout_mlm_loss"] = out.loss.item() if out.loss is not None else None
        fill = pipeline("fill-mask", model=AutoModelForMaskedLM.from_pretrained(final, trust_remote_code=True),
                        tokenizer=tokenizer, device=device)
        result["fill_mask"] = [p["token_str"] for p in fill(f"She opened the {tokenizer.mask_token} and went out.")]
    result["dtype"] = str(next(model.parameters()).dtype)
    result["parameters"] = sum(p.numel() for p in model.parameters())
    print("\\nRESULT " + json.dumps(result))
    """
)


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def portable_text(text: str) -> str:
    """Text for the result JSON with this machine's folders named by what they are (`$HF_HOME`, `$TMPDIR`, the
    repository as `.`), so a committed record names no machine's paths."""
    hf_home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    for folder, name in (
        (hf_home, "$HF_HOME"),
        (str(REPO), "."),
        (tempfile.gettempdir(), "$TMPDIR"),
        (os.path.expanduser("~"), "~"),
    ):
        text = text.replace(folder.rstrip(os.sep) + os.sep, name + "/")
    return text


def _rows(output_dir: Path) -> list[dict]:
    path = output_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def _launch(engine: str, processes: int, args: list[str], log: Path) -> tuple[int, float]:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(processes)]
    command += ["--main_process_port", str(_port())]
    if engine != "none":
        command += ["--config_file", str(REPO / f"configs/accelerate/{engine}.yaml")]
    command += ["pretrain/run.py", *args]
    start = time.perf_counter()
    with open(log, "a") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        done = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    return done.returncode, time.perf_counter() - start


def pipeline_run(engine: str, kind: str, options) -> dict:
    out = Path(options.out) / f"{engine}-{kind}"
    log = Path(options.out) / f"{engine}-{kind}.log"
    log.unlink(missing_ok=True)
    steps = options.steps
    save = max(1, steps // 3)
    args = list(ENCODER if kind == "encoder" else DECODER) + (SMALL if options.small else [])
    args += ["--training.output_dir", str(out)]
    args += [
        "--training.max_steps",
        str(steps),
        "--training.save_steps",
        str(save),
        "--training.save_total_limit",
        "3",
    ]
    args += ["--training.eval_steps", str(save), "--training.max_eval_batches", str(options.eval_batches)]
    args += ["--logging.logging_steps", str(max(1, steps // 15))] + options.extra
    summary: dict = {"engine": engine, "kind": kind, "steps": steps, "processes": options.processes}
    code, seconds = _launch(
        engine, options.processes, args + ["--training.overwrite_output_dir", "true"], log
    )
    summary.update(run1_exit=code, run1_s=round(seconds, 1))
    first_rows = _rows(out)
    if code != 0:
        return summary
    resume_step = 2 * save
    resume = out / "checkpoints" / f"step-{resume_step:08d}"
    code, seconds = _launch(
        engine,
        options.processes,
        args + ["--training.resume_from_checkpoint", str(resume)],
        log,
    )
    summary.update(run2_exit=code, run2_s=round(seconds, 1), resumed_from=resume_step)
    # a resumed run replaces the metrics.jsonl rows of the steps it trains again instead of appending them
    second_rows = [row for row in _rows(out) if row["step"] > resume_step]
    train1 = {r["step"]: r["train/loss"] for r in first_rows if "train/loss" in r}
    train2 = {r["step"]: r["train/loss"] for r in second_rows if "train/loss" in r}
    overlap = sorted(set(train1) & set(train2))
    summary.update(
        first_loss=train1[min(train1)] if train1 else None,
        last_loss=train1[max(train1)] if train1 else None,
        loss_curve={step: round(loss, 4) for step, loss in sorted(train1.items())},
        eval_loss={r["step"]: round(r["eval/loss"], 4) for r in first_rows if "eval/loss" in r},
        resumed_losses={step: round(train2[step], 4) for step in overlap},
        resume_max_abs_diff=max((abs(train1[s] - train2[s]) for s in overlap), default=None),
        tokens_per_s=statistics.median(
            [r["train/tokens_per_s"] for r in first_rows if "train/tokens_per_s" in r]
        )
        if first_rows
        else None,
        mfu=statistics.median([r["train/mfu"] for r in first_rows if "train/mfu" in r] or [float("nan")]),
        mixed_precision=(out / "config.yaml").read_text().split("mixed_precision:")[1].split()[0]
        if (out / "config.yaml").is_file()
        else None,
    )
    if code != 0:
        return summary
    text = "data/tinystories/" if kind == "decoder" else "data/pretrain/"
    text_file = sorted((REPO / text).glob("*.txt"))[-1]
    env = {**os.environ, "PYTHONPATH": ""}  # the folder must load without Kiln on the path
    done = subprocess.run(
        [sys.executable, "-c", CHECK_FINAL, str(out / "final"), kind, str(text_file)],
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
    )
    with open(log, "a") as handle:
        handle.write(done.stdout + done.stderr)
    found = [line.split("RESULT ", 1)[1] for line in done.stdout.splitlines() if "RESULT " in line]
    summary["final"] = json.loads(found[-1]) if found else {"error": portable_text(done.stderr[-1500:])}
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", action="append", help="accelerate config name, or none (repeatable)")
    parser.add_argument("--kind", action="append", choices=["encoder", "decoder"], help="default: both")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--eval-batches", type=int, default=20)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--small", action="store_true", help="debug.yaml's tiny shapes")
    parser.add_argument("--out", default="runs/engines")
    parser.add_argument("--json", help="write the summaries here")
    parser.add_argument("extra", nargs="*", help="further pretrain/run.py options, after --")
    options = parser.parse_args(argv)
    Path(options.out).mkdir(parents=True, exist_ok=True)
    jobs = [
        (e, k)
        for e in options.engine or ["fsdp", "deepspeed-zero2"]
        for k in options.kind or ["encoder", "decoder"]
    ]
    with ThreadPoolExecutor(len(jobs)) as pool:
        summaries = list(pool.map(lambda job: pipeline_run(*job, options), jobs))
    for s in summaries:
        final = {k: v for k, v in s.get("final", {}).items() if k != "auto_map"}
        print(
            f"{s['engine']:<16} {s['kind']:<8} exit {s.get('run1_exit')}/{s.get('run2_exit')} "
            f"loss {s.get('first_loss') or float('nan'):.3f} -> {s.get('last_loss') or float('nan'):.3f} "
            f"eval {s.get('eval_loss')} resume max|diff| {s.get('resume_max_abs_diff')} "
            f"precision {s.get('mixed_precision')} final {json.dumps(final)[:300]}"
        )
    if options.json:
        Path(options.json).write_text(json.dumps(summaries, indent=1))


if __name__ == "__main__":
    main()
