"""How the prepared data path scales with the corpus: CPU-seconds, wall clock, peak memory, disk, time to first
step, and the training process's own memory.

    nice python bench/data_scale.py --sizes 50 1000 --layouts files --num_proc 1 --repeat-largest 2 \
        --json bench/results/data-scale.json

For each corpus size (MB) and layout it generates a corpus (default `wide`: bench/wide_corpus.py, a Zipf
vocabulary with one-off codes, numbers, URLs and user names, deterministic from its seed; `--corpus books`:
seeded shuffles of the shipped books' documents) as `files` (about 2 MB each) or `big` (one file), in the work
folder (a temporary folder unless --workdir), deleted after its measurements. Then it runs, as a user would,
`python -m pretrain.data prepare` with the default run config at each --num_proc and measures:
- cpu_s: user + system CPU-seconds of the prepare process and all its workers (resource.getrusage of children),
  tokenizer sample training included; mb_per_cpu_s = corpus MB / cpu_s;
- wall_s, and the load average (1 min) before and after, since the machine may be shared;
- peak_rss_mb: the largest sum of the resident memory of the prepare process tree, polled every 0.1 s with
  psutil (peak_pss_mb: the same with proportional set sizes, which count pages shared by the forked workers
  once; ru_maxrss of the children, the largest single process, is recorded too);
- disk_mb: the size of the prepared folder;
- phases_s: prepare's own wall clock per phase (start: to its worker pool, sample: reading the tokenizer sample,
  tokenizer: training it, hashes: waiting for the files' sha256, shards: tokenizing and writing, manifest), and
  startup_s: the rest of wall_s (interpreter, imports, exit). The shards phase is what num_proc divides;
- first_step_s (once per layout and size, on the num_proc 1 folder): from starting `accelerate launch
  pretrain/run.py --data.prepared DIR` (one process) to its first logged training step; first_step_cpu_s: the
  CPU-seconds of the launcher and the run by then (first_step_run_cpu_s: the run process alone);
- train_peak_anon_mb: a 1-step run on the same folder to its end (evaluation on 20 batches and the final save
  included), the peak RssAnon of its training process polled from /proc: the memory the process allocated itself;
  the shards and the cache's offset arrays and plans are mapped files, in the page cache once per node, and not in
  it (train_peak_rss_mb: its VmHWM, mapped pages included); train_load: load averages before and after. The same
  for each checkout given with --training-repo (other_code: before and after a change). With --repeat-largest K,
  also for a folder holding the largest size's shards K times over (hard links), a corpus K times as large;
- every training run starts from an empty cache folder (--data.cache_dir in the work folder), as a first run does.
Results are appended per measurement, so a long run can be read while it goes; --keep-corpus keeps the files.
The machine may be shared: run it with `nice`, and read CPU-seconds and memory rather than wall clock.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import psutil  # noqa: E402

from bench.machine import load_average  # noqa: E402
from bench.wide_corpus import write_wide_corpus  # noqa: E402
from pretrain.data.corpus import split_documents  # noqa: E402

MB = 1_000_000


def book_documents() -> list[str]:
    documents = []
    for path in sorted(glob.glob(str(REPO_ROOT / "data" / "pretrain" / "*.txt"))):
        documents += split_documents(Path(path).read_text(encoding="utf-8"), "blank_line")
    return documents


def write_corpus(folder: Path, megabytes: float, layout: str, seed: int = 0, corpus: str = "wide") -> int:
    """`megabytes` of text in one file (`big`) or in files of about 2 MB (`files`): the wide-vocabulary corpus
    (bench/wide_corpus.py), or shuffled copies of the books' documents (`books`, one file per copy)."""
    if corpus == "wide":
        return write_wide_corpus(folder, megabytes, layout, seed)
    folder.mkdir(parents=True, exist_ok=True)
    documents = book_documents()
    rng = random.Random(seed)
    written, copy = 0, 0
    big = open(folder / "corpus.txt", "wb") if layout == "big" else None
    try:
        while written < megabytes * MB:
            order = documents[:]
            rng.shuffle(order)
            data = ("\n\n".join(order) + "\n\n").encode("utf-8")
            # the last copy is cut to the size (at a character boundary)
            data = data[: int(megabytes * MB) - written].decode("utf-8", "ignore").encode("utf-8")
            if big is not None:
                big.write(data)
            else:
                (folder / f"copy-{copy:05d}.txt").write_bytes(data)
            written += len(data)
            copy += 1
            if not data:
                break
    finally:
        if big is not None:
            big.close()
    return written


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


class TreeMemory:
    """Peaks of the summed RSS and PSS of a process and its descendants, polled in a thread. The RSS sum counts
    pages the forked workers share with their parent (the imported libraries) once per process; PSS splits them."""

    def __init__(self, pid: int, interval: float = 0.1):
        self.pid, self.interval, self.peak, self.peak_pss = pid, interval, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self):
        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                total = pss = 0
                for process in [root, *root.children(recursive=True)]:
                    try:
                        info = process.memory_full_info()
                        total, pss = total + info.rss, pss + getattr(info, "pss", info.rss)
                    except psutil.Error:
                        pass
                self.peak, self.peak_pss = max(self.peak, total), max(self.peak_pss, pss)
            except psutil.Error:
                pass
            self._stop.wait(self.interval)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def run_prepare(corpus: Path, output: Path, num_proc: int, extra: list[str]) -> dict:
    shutil.rmtree(output, ignore_errors=True)
    command = [
        sys.executable,
        "-m",
        "pretrain.data",
        "prepare",
        "--output",
        str(output),
        "--num_proc",
        str(num_proc),
        "--data.data_files",
        str(corpus / "*.txt"),
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    load_before = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    memory = TreeMemory(process.pid)
    output_text, _ = process.communicate()
    wall = time.perf_counter() - start
    peak = memory.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0:
        raise SystemExit(f"prepare failed ({process.returncode}):\n{output_text[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = output_text.strip().splitlines()
    return {
        "num_proc": num_proc,
        "cpu_s": round(cpu, 2),
        "wall_s": round(wall, 2),
        "peak_rss_mb": round(peak / MB, 1),
        "peak_pss_mb": round(memory.peak_pss / MB, 1),
        "children_maxrss_mb": round(after.ru_maxrss * 1024 / MB, 1),  # Linux: KiB; the largest single process
        "disk_mb": round(folder_bytes(output) / MB, 1),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        # the prepared folder by its name: a results file names no temporary (or home) folder of this machine
        "log_tail": next((line for line in reversed(lines) if "wrote" in line), lines[-1]).replace(
            str(output.parent) + os.sep, ""
        ),
        **phase_seconds(lines, wall),
    }


def phase_seconds(lines: list[str], wall: float) -> dict:
    """prepare's `seconds per phase` line as {phase: wall seconds}, and startup_s: the rest of the wall clock
    (interpreter and imports before prepare() runs, and the exit): what can only run serially."""
    for line in reversed(lines):
        if "seconds per phase:" in line:
            phases = {}
            for part in line.split("seconds per phase:")[1].split(","):
                name, seconds = part.split()
                phases[name] = float(seconds)
            return {"phases_s": phases, "startup_s": round(wall - sum(phases.values()), 2)}
    return {}


def tree_cpu_seconds(pid: int) -> tuple[float, float]:
    """(CPU-seconds of a process and its live descendants, of its most CPU-hungry descendant: the run)."""
    total, busiest = 0.0, 0.0
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return total, busiest
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        seconds = times.user + times.system
        total += seconds
        if process.pid != pid:
            busiest = max(busiest, seconds)
    return total, busiest


def time_to_first_step(prepared: Path, run_dir: Path, extra: list[str], timeout: float = 600) -> dict:
    """Seconds from `accelerate launch` to the first logged training step (the run is then stopped), and the
    CPU-seconds spent by then: wall clock on a shared machine is inflated by the other work, CPU time is not."""
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [
        "accelerate",
        "launch",
        "--num_processes",
        "1",
        "pretrain/run.py",
        "--data.prepared",
        str(prepared),
        "--training.output_dir",
        str(run_dir),
        "--training.max_steps",
        "3",
        "--logging.logging_steps",
        "1",
        "--training.eval_steps",
        "1000",
        "--training.save_steps",
        "1000",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    start = time.perf_counter()
    process = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    seen = b""
    try:
        while time.perf_counter() - start < timeout:
            chunk = process.stdout.read1(4096)
            if not chunk:
                break
            seen = (seen + chunk)[-20000:]
            if b"loss=" in seen or b"step 1:" in seen:
                wall = time.perf_counter() - start
                total, run = tree_cpu_seconds(process.pid)
                return {
                    "first_step_s": round(wall, 2),
                    "first_step_cpu_s": round(total, 2),
                    "first_step_run_cpu_s": round(run, 2),
                }
        raise SystemExit(f"no training step seen:\n{seen.decode(errors='replace')[-3000:]}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # the launch we started and its own children
        process.wait()
        shutil.rmtree(run_dir, ignore_errors=True)


def _anon_kb(pid: int) -> tuple[int, int]:
    """(RssAnon, VmHWM) of a process in KiB, from /proc (0, 0 when it is gone)."""
    values = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(("RssAnon:", "VmHWM:")):
                    name, number = line.split()[:2]
                    values[name] = int(number)
    except OSError:
        pass
    return values.get("RssAnon:", 0), values.get("VmHWM:", 0)


def training_memory(
    prepared: Path, run_dir: Path, extra: list[str], repo: Path = REPO_ROOT, timeout: float = 900
) -> dict:
    """A 1-step run from the prepared folder (`accelerate launch`, one process, to its end: evaluation and the
    final save included), its training process's memory polled every 0.05 s from /proc: the peak of RssAnon,
    its anonymous memory (what the process itself allocated; the shards' and the cache's mapped pages, shared
    by every process of a node through the page cache, are not in it), and VmHWM, its peak RSS (mapped pages
    included)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [
        "accelerate",
        "launch",
        "--num_processes",
        "1",
        "pretrain/run.py",
        "--data.prepared",
        str(prepared),
        "--training.output_dir",
        str(run_dir),
        "--training.max_steps",
        "1",
        "--logging.logging_steps",
        "1",
        "--training.eval_steps",
        "1000",
        "--training.save_steps",
        "1000",
        "--training.max_eval_batches",
        "20",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    before = load_average()
    start = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    peaks: dict[int, list[int]] = {}
    done = threading.Event()

    def poll():
        while not done.is_set():
            try:
                children = psutil.Process(process.pid).children(recursive=True)
            except psutil.Error:
                children = []
            for child in children:
                anon, hwm = _anon_kb(child.pid)
                peak = peaks.setdefault(child.pid, [0, 0])
                peak[0], peak[1] = max(peak[0], anon), max(peak[1], hwm)
            done.wait(0.05)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        done.set()
        thread.join()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait()
        shutil.rmtree(run_dir, ignore_errors=True)
    if process.returncode != 0:
        raise SystemExit(
            f"the 1-step run failed ({process.returncode}):\n{output.decode(errors='replace')[-3000:]}"
        )
    anon, hwm = max(
        peaks.values(), default=[0, 0]
    )  # the training process: the largest of the launch's children
    return {
        "train_peak_anon_mb": round(anon * 1024 / MB, 1),
        "train_peak_rss_mb": round(hwm * 1024 / MB, 1),
        "train_wall_s": round(time.perf_counter() - start, 2),
        "train_load": [before, load_average()],
    }


def repeated_folder(prepared: Path, target: Path, times: int) -> Path:
    """A prepared folder holding the shards of `prepared` `times` over (hard links, renumbered; the manifest
    merged from their .json files as prepare writes it): a corpus `times` as large for the training runs without
    preparing it again (its documents repeat, which the planner and the offsets do not care about)."""
    from pretrain.data.prepare import PLAN, shard_name, write_manifest

    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    shutil.copytree(prepared / "tokenizer", target / "tokenizer")
    plan = json.loads((prepared / PLAN).read_text())
    shards = {}
    for split, names in plan["shards"].items():
        shards[split] = []
        for _ in range(times):
            for name in names:
                new = shard_name(split, len(shards[split]))
                os.link(prepared / f"{name}.arrow", target / f"{new}.arrow")
                record = json.loads((prepared / f"{name}.json").read_text())
                record["file"] = f"{new}.arrow"
                (target / f"{new}.json").write_text(json.dumps(record))
                shards[split].append(new)
    (target / PLAN).write_text(json.dumps({**plan, "shards": shards}))
    write_manifest(target, say=lambda *_: None)
    return target


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=float, nargs="+", default=[50, 200, 1000], help="corpus sizes in MB")
    parser.add_argument("--layouts", nargs="+", default=["files", "big"], choices=["files", "big"])
    parser.add_argument("--num_proc", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--json", default=str(REPO_ROOT / "bench" / "results" / "data-scale.json"))
    parser.add_argument(
        "--workdir", default=None, help="where corpora and prepared folders go (default: a temp dir)"
    )
    parser.add_argument("--no-first-step", action="store_true", help="skip the time-to-first-step runs")
    parser.add_argument("--keep-corpus", action="store_true")
    parser.add_argument(
        "--corpus",
        choices=["wide", "books"],
        default="wide",
        help="wide: a Zipf vocabulary with one-off tokens (bench/wide_corpus.py); books: copies",
    )
    parser.add_argument("--no-training-memory", action="store_true", help="skip the 1-step runs' memory")
    parser.add_argument(
        "--repeat-largest",
        type=int,
        default=0,
        help="also measure the 1-step run on the largest size's shards this many times over",
    )
    parser.add_argument(
        "--training-repo",
        nargs="*",
        default=[],
        help="other checkouts whose 1-step run is measured on the same folder too (before/after)",
    )
    parser.add_argument("extra", nargs="*", help="dotted config overrides for prepare and the run (after --)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="kiln-data-scale-"))
    results = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "config": "pretrain/run.py defaults" + (f" + {' '.join(args.extra)}" if args.extra else ""),
        "corpus": args.corpus,
        "rows": [],
    }
    for size in args.sizes:
        for layout in args.layouts:
            corpus = workdir / f"corpus-{layout}-{size:g}"
            shutil.rmtree(corpus, ignore_errors=True)
            corpus_bytes = write_corpus(corpus, size, layout, corpus=args.corpus)
            for num_proc in args.num_proc:
                output = workdir / f"prepared-{layout}-{size:g}-{num_proc}"
                row = {
                    "layout": layout,
                    "corpus_mb": round(corpus_bytes / MB, 1),
                    "files": len(list(corpus.glob("*.txt"))),
                }
                row.update(run_prepare(corpus, output, num_proc, args.extra))
                row["mb_per_cpu_s"] = round(corpus_bytes / MB / row["cpu_s"], 2)
                # the training runs keep the corpus's offset arrays and pair plans in a cache folder of their
                # own, emptied before each run: every run starts from a cold cache, as a first run does
                cache = ["--data.cache_dir", str(workdir / "cache")]
                if not args.no_first_step and num_proc == args.num_proc[0]:
                    shutil.rmtree(workdir / "cache", ignore_errors=True)
                    row.update(time_to_first_step(output, workdir / "run", args.extra + cache))
                    row["load_after_first_step"] = round(os.getloadavg()[0], 2)
                if not args.no_training_memory and num_proc == args.num_proc[0]:
                    shutil.rmtree(workdir / "cache", ignore_errors=True)
                    row.update(training_memory(output, workdir / "run", args.extra + cache))
                    for other in args.training_repo:
                        shutil.rmtree(workdir / "cache", ignore_errors=True)
                        measured = training_memory(output, workdir / "run", args.extra + cache, Path(other))
                        row.setdefault("other_code", []).append({"repo": Path(other).name, **measured})
                if num_proc != args.num_proc[0]:
                    shutil.rmtree(output, ignore_errors=True)
                results["rows"].append(row)
                print(json.dumps(row), flush=True)
                if args.json:
                    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                    Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
            largest = workdir / f"prepared-{layout}-{size:g}-{args.num_proc[0]}"
            if args.repeat_largest > 1 and size == max(args.sizes) and largest.is_dir():
                times = args.repeat_largest
                repeated = repeated_folder(largest, workdir / f"repeated-{layout}", times)
                row = {
                    "layout": layout,
                    "corpus_mb": round(times * corpus_bytes / MB, 1),
                    "repeated": f"the {corpus_bytes / MB:g} MB corpus's shards {times} times over",
                    "repeat_of_mb": round(corpus_bytes / MB, 1),
                    "times": times,
                    "num_proc": args.num_proc[0],
                    "disk_mb": round(folder_bytes(repeated) / MB, 1),
                }
                shutil.rmtree(workdir / "cache", ignore_errors=True)
                row.update(training_memory(repeated, workdir / "run", args.extra + cache))
                for other in args.training_repo:
                    shutil.rmtree(workdir / "cache", ignore_errors=True)
                    measured = training_memory(repeated, workdir / "run", args.extra + cache, Path(other))
                    row.setdefault("other_code", []).append({"repo": Path(other).name, **measured})
                results["rows"].append(row)
                print(json.dumps(row), flush=True)
                if args.json:
                    Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
                shutil.rmtree(repeated, ignore_errors=True)
            for output in workdir.glob(f"prepared-{layout}-{size:g}-*"):
                shutil.rmtree(output, ignore_errors=True)
            shutil.rmtree(workdir / "cache", ignore_errors=True)
            if not args.keep_corpus:
                shutil.rmtree(corpus, ignore_errors=True)
    return results


if __name__ == "__main__":
    main()
