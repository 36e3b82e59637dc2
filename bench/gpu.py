"""Every GPU row of the docs in one command: Kiln against transformers on one GPU, within about 8 minutes.

    python bench/gpu.py                                   # one GPU: bench/results/gpu.json + docs/results/gpu.md
    python bench/gpu.py --smoke --json g.json --md g.md --sst2 DIR    # CPU, tiny shapes, ~2 minutes
    python bench/gpu.py --tables bench/results/gpu.json --md docs/results/gpu.md  # the tables again from a record

It runs the other benchmarks, each in a fresh process with its own time limit, and keeps what each wrote:
1. `pretrain-encoder`: bench/throughput.py at BERT-base shape (L12/H768, 32 x 128), bf16 autocast: tokens/s,
   speed-up and MFU of Kiln's MLM + NSP step against transformers' `BertForPreTraining` from the same weights;
2. `pretrain-decoder`: the same at GPT-2 small shape (8 x 1024) against `GPT2LMHeadModel`;
3. `engines`: bench/engines.py with accelerate's FSDP2 and DeepSpeed ZeRO-2 configs: a few hundred steps of
   real pretraining each, resumed from a checkpoint (largest loss difference over the re-trained steps), and
   `final/` loaded in a fresh process with transformers' Auto classes and `trust_remote_code=True`;
4. `finetune`: bench/finetune.py, SST-2 classification with `finetune/classify.py` against transformers'
   `Trainer` from the same start: examples/s and dev accuracy;
5. `inference`: bench/inference.py, fill-mask, text classification and greedy generation against transformers'
   models with equal outputs: seconds per input at batch 1 and 32.
A stage that fails or runs out of time is recorded with its exit code and the end of its log, and the others
still run. The JSON holds every stage's own record plus the machine; the Markdown tables are made from the JSON
alone (`--tables` remakes them), so the docs never hold a number that is not in the record.

SST-2 (`--sst2`, a folder with train.tsv and dev.tsv) is read by stages 4 and 5; the default is the one
bench/finetune.py uses (`$KILN_SST2`). Stages whose data is missing are recorded as skipped, with the reason.
Kiln's own dependencies must be installed where it runs (`pip install -e .`, plus `deepspeed` for its row); on a
GPU machine without internet, `pip download` them as wheels elsewhere and install those first.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SST2 = Path(os.environ.get("KILN_SST2", REPO.parent / "shared" / "data" / "sst2"))


def stage_commands(args, work: Path) -> dict[str, dict]:
    """Each stage: the command (run from the repository root) and its time limit. On a GPU the limits add up to
    480 s, so that the whole script ends within 8 minutes even when every stage runs out of time."""
    python = [sys.executable]
    sst2 = ["--sst2", str(args.sst2)]
    if args.smoke:  # tiny shapes on whatever device is there: the script's own test
        return {
            "pretrain-encoder": dict(
                argv=python
                + [
                    "bench/throughput.py",
                    "--preset",
                    "encoder-l4",
                    "--batch-size",
                    "2",
                    "--seq-len",
                    "16",
                    "--rounds",
                    "2",
                    "--warmup",
                    "1",
                    "--no-memory",
                ],
                limit_s=300,
            ),
            "pretrain-decoder": dict(
                argv=python
                + [
                    "bench/throughput.py",
                    "--preset",
                    "decoder-l4",
                    "--batch-size",
                    "2",
                    "--seq-len",
                    "16",
                    "--rounds",
                    "2",
                    "--warmup",
                    "1",
                    "--no-memory",
                ],
                limit_s=300,
            ),
            "engines": dict(
                argv=python
                + [
                    "bench/engines.py",
                    "--engine",
                    "none",
                    "--kind",
                    "encoder",
                    "--steps",
                    "3",
                    "--small",
                    "--eval-batches",
                    "1",
                    "--out",
                    str(work / "engines"),
                ],
                limit_s=600,
            ),
            "finetune": dict(
                argv=python
                + [
                    "bench/finetune.py",
                    "--shape",
                    "test",
                    "--train-samples",
                    "12",
                    "--batch-size",
                    "4",
                    "--eval-batch-size",
                    "8",
                    "--vocab-size",
                    "300",
                    *sst2,
                    "--",
                    "--training.max_steps",
                    "2",
                ],
                limit_s=300,
                needs_sst2=True,
            ),
            "inference": dict(
                argv=python
                + [
                    "bench/inference.py",
                    "--shape",
                    "tiny",
                    "--rounds",
                    "2",
                    "--latency-inputs",
                    "2",
                    "--batch",
                    "1",
                    "--batch",
                    "3",
                    "--new-tokens",
                    "4",
                    "--vocab-size",
                    "300",
                    "--tokenizer-sentences",
                    "200",
                    *sst2,
                ],
                limit_s=300,
                needs_sst2=True,
            ),
        }
    return {
        "pretrain-encoder": dict(
            argv=python
            + ["bench/throughput.py", "--preset", "encoder-l12", "--bf16", "--rounds", "20", "--warmup", "5"],
            limit_s=90,
        ),
        "pretrain-decoder": dict(
            argv=python
            + [
                "bench/throughput.py",
                "--preset",
                "decoder-gpt2",
                "--bf16",
                "--rounds",
                "20",
                "--warmup",
                "5",
            ],
            limit_s=90,
        ),
        "engines": dict(
            argv=python
            + [
                "bench/engines.py",
                "--engine",
                "fsdp",
                "--engine",
                "deepspeed-zero2",
                "--steps",
                "300",
                "--out",
                str(work / "engines"),
            ],
            limit_s=180,
        ),
        "finetune": dict(
            argv=python
            + ["bench/finetune.py", "--shape", "mini", "--train-samples", "8000", "--rounds", "1", *sst2],
            limit_s=75,
            needs_sst2=True,
        ),
        "inference": dict(
            argv=python + ["bench/inference.py", "--shape", "mini", "--rounds", "3", *sst2],
            limit_s=45,
            needs_sst2=True,
        ),
    }


def machine() -> dict:
    import torch
    import transformers

    info = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "device": "cpu",
    }
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["gpu_memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        info["cuda"] = torch.version.cuda
    for package in ("accelerate", "deepspeed"):
        try:
            info[package] = __import__(package).__version__
        except Exception as err:  # noqa: BLE001 - a missing engine is recorded, not fatal
            info[package] = f"not importable ({type(err).__name__})"
    return info


def run_stage(name: str, spec: dict, work: Path, args) -> dict:
    if spec.get("needs_sst2") and not (Path(args.sst2) / "train.tsv").is_file():
        return {
            "status": "skipped",
            "reason": f"no SST-2 at {args.sst2} (pass --sst2 DIR with train.tsv, dev.tsv)",
        }
    record = work / f"{name}.json"
    argv = [*spec["argv"], "--json", str(record)]
    if (
        "--" in spec["argv"]
    ):  # options after `--` go to the Kiln script the bench runs: --json goes before them
        cut = spec["argv"].index("--")
        argv = [*spec["argv"][:cut], "--json", str(record), *spec["argv"][cut:]]
    log = work / f"{name}.log"
    print(f"[gpu] {name}: {' '.join(argv[1:])} (at most {spec['limit_s']} s)", flush=True)
    start = time.monotonic()
    with open(log, "w") as handle:
        # a session of its own, so that a stage out of time is ended with every process it started (launchers)
        process = subprocess.Popen(
            argv, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = process.wait(timeout=spec["limit_s"])
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = "timeout"
    seconds = round(time.monotonic() - start, 1)
    tail = log.read_text(errors="replace")[-2000:]
    result: dict = {
        "status": "ok" if code == 0 and record.is_file() else "failed",
        "exit": code,
        "seconds": seconds,
    }
    result["command"] = (
        " ".join(["python", *argv[1:]]).replace(str(work), "$WORK").replace(str(args.sst2), "SST2")
    )
    if record.is_file():  # the record names no folder of this machine: temporary ones as $WORK, the data SST2
        text = record.read_text().replace(str(work), "$WORK")
        for folder in {str(args.sst2), str(Path(args.sst2).resolve())}:
            text = text.replace(folder, "SST2")
        result["record"] = json.loads(text)
    if result["status"] != "ok":
        result["log_tail"] = tail.replace(str(work), "$WORK")
    print(f"[gpu] {name}: {result['status']} in {seconds} s", flush=True)
    return result


# ------------------------------------------------------------------------------------------------- the tables
def _percent(value) -> str:
    return f"{100 * value:.1f}%" if isinstance(value, (int, float)) and value == value else "-"


def _num(value, digits: int = 0) -> str:
    return f"{value:,.{digits}f}" if isinstance(value, (int, float)) and value == value else "-"


def _not_ok(stage: dict) -> str:
    return f"not measured ({stage.get('status')}: {stage.get('reason') or 'exit ' + str(stage.get('exit'))})"


def pretraining_table(report: dict) -> list[str]:
    lines = [
        "| shape | model | tokens/s | speed-up (min-max over rounds) | MFU | peak memory (MB) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name in ("pretrain-encoder", "pretrain-decoder"):
        stage = report["stages"].get(name, {})
        if stage.get("status") != "ok":
            lines.append(f"| {name} | {_not_ok(stage)} | | | | |")
            continue
        record = stage["record"]
        shape = record["shape"]
        label = (
            f"{shape['kind']} L{shape['layers']}/H{shape['hidden']}, {shape['batch_size']} x "
            f"{shape['seq_len']}{', bf16' if record['settings']['bf16_autocast'] else ''}"
        )
        for model_name, model in record["models"].items():
            if model_name == "reference":
                who, speedup = (
                    (
                        "transformers "
                        + ("BertForPreTraining" if shape["kind"] == "encoder" else "GPT2LMHeadModel")
                    ),
                    "1.00",
                )
            else:
                who = "Kiln" if model_name == "kiln" else model_name
                speedup = f"{model['speedup']:.2f} ({model['speedup_min']:.2f}-{model['speedup_max']:.2f})"
            lines.append(
                f"| {label} | {who} | {_num(model['tokens_per_s'])} | {speedup} | {_percent(model['mfu'])} | "
                f"{_num(model['peak_mb'])} |"
            )
    return lines


def engines_table(report: dict) -> list[str]:
    stage = report["stages"].get("engines", {})
    lines = [
        "| engine | model | steps | first → last loss | resume: largest loss difference | tokens/s | MFU | "
        "`final/` with `trust_remote_code` |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    if stage.get("status") != "ok":
        return lines + [f"| {_not_ok(stage)} | | | | | | | |"]
    for row in stage["record"]:
        final = row.get("final") or {}
        loaded = "loads" if final and "error" not in final else ("error" if final else "not reached")
        losses = f"{_num(row.get('first_loss'), 3)} → {_num(row.get('last_loss'), 3)}"
        lines.append(
            f"| {row['engine']} (exit {row.get('run1_exit')}/{row.get('run2_exit', '-')}) | {row['kind']} | "
            f"{row['steps']} | {losses} | {_num(row.get('resume_max_abs_diff'), 4)} | {_num(row.get('tokens_per_s'))} "
            f"| {_percent(row.get('mfu'))} | {loaded} |"
        )
    return lines


def gpu_finetune_table(report: dict) -> list[str]:
    stage = report["stages"].get("finetune", {})
    lines = ["| task | side | examples/s (median) | dev accuracy | speed-up |", "|---|---|---:|---:|---:|"]
    if stage.get("status") != "ok":
        return lines + [f"| SST-2 | {_not_ok(stage)} | | | |"]
    record = stage["record"]
    for side, label in (("kiln", "Kiln `finetune/classify.py`"), ("reference", "transformers `Trainer`")):
        runs = record[side]
        rate = statistics.median(r["examples_per_s"] for r in runs)
        accuracy = statistics.median(r.get("dev_accuracy", float("nan")) for r in runs)
        speedup = _num(record["speedup"], 2) if side == "kiln" else "1.00"
        lines.append(
            f"| SST-2 ({record['data']['train_examples']:,} sentences) | {label} | {rate:,.1f} | "
            f"{100 * accuracy:.2f}% | {speedup} |"
        )
    return lines


def gpu_inference_table(report: dict) -> list[str]:
    stage = report["stages"].get("inference", {})
    lines = [
        "| task | batch | Kiln ms per input | transformers ms per input | speed-up (min-max) |",
        "|---|---:|---:|---:|---:|",
    ]
    if stage.get("status") != "ok":
        return lines + [f"| {_not_ok(stage)} | | | | |"]
    for row in stage["record"]["results"]:
        lines.append(
            f"| {row['task']} | {row['batch']} | {1e3 * row['kiln_s_per_input']:.2f} | "
            f"{1e3 * row['reference_s_per_input']:.2f} | {row['speedup']:.2f} "
            f"({row['speedup_min']:.2f}-{row['speedup_max']:.2f}) |"
        )
    return lines


def tables(report: dict) -> str:
    m = report["machine"]
    about = (
        f"{m['device']}, torch {m['torch']}, transformers {m['transformers']}, accelerate {m['accelerate']}, "
        f"DeepSpeed {m['deepspeed']}; measured {report['date']} by `{report['command']}`"
        f"{' (smoke run: tiny shapes, not a measurement)' if report['smoke'] else ''}."
    )
    parts = [
        "# GPU measurements",
        "",
        "Kiln against transformers on one GPU, every table made by `python bench/gpu.py` from its record",
        "(`bench/results/gpu.json`); each stage's command is in the record.",
        "",
        about,
        "",
        "## Pretraining step",
        "",
        *pretraining_table(report),
        "",
        "## FSDP2 and DeepSpeed ZeRO-2",
        "",
        *engines_table(report),
        "",
        "## Fine-tuning",
        "",
        *gpu_finetune_table(report),
        "",
        "## Inference",
        "",
        *gpu_inference_table(report),
        "",
    ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", default="bench/results/gpu.json", help="the record (default: %(default)s)")
    parser.add_argument("--md", default="docs/results/gpu.md", help="the tables (default: %(default)s)")
    parser.add_argument("--sst2", type=Path, default=DEFAULT_SST2, help="SST-2 folder for stages 4-5")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes: a test of this script, not a measurement"
    )
    parser.add_argument("--stage", action="append", help="run only these stages (repeatable; default: all)")
    parser.add_argument("--tables", metavar="JSON", help="only remake the Markdown tables from this record")
    args = parser.parse_args(argv)

    if args.tables:
        report = json.loads(Path(args.tables).read_text())
        Path(args.md).write_text(tables(report))
        print(f"wrote {args.md}")
        return report
    import torch

    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit(
            "bench/gpu.py: torch sees no GPU; run it on a GPU machine, or add --smoke to test the "
            "script on this one with tiny shapes"
        )
    work = Path(tempfile.mkdtemp(prefix="kiln-bench-gpu-"))
    try:
        stages = stage_commands(args, work)
        unknown = sorted(set(args.stage or []) - set(stages))
        if unknown:
            raise SystemExit(
                f"bench/gpu.py: unknown --stage {', '.join(unknown)}; choose from {', '.join(stages)}"
            )
        start = time.monotonic()
        report = {
            "date": time.strftime("%Y-%m-%d"),
            "command": "python bench/gpu.py" + (" --smoke" if args.smoke else ""),
            "smoke": args.smoke,
            "machine": machine(),
            "stages": {},
        }
        for name, spec in stages.items():
            if args.stage and name not in args.stage:
                continue
            report["stages"][name] = run_stage(name, spec, work, args)
        report["seconds"] = round(time.monotonic() - start, 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for path, text in ((args.json, json.dumps(report, indent=1)), (args.md, tables(report))):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    print(tables(report))
    print(f"[gpu] {report['seconds']} s; wrote {args.json} and {args.md}")
    return report


if __name__ == "__main__":
    main()
