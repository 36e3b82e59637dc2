"""Kiln's HubPusher against transformers' way of pushing (huggingface_hub `upload_folder(run_as_future=True)`,
skipped while the previous push is still running), on the offline test Hub (tests/hub_server.py).

A simulated run saves a checkpoint every `--save-every-s` seconds (one file of `--mb` MB, written to a temporary
folder and renamed into place, the previous one removed: `save_total_limit 1`) and pushes it to `last-checkpoint`,
as `--hub.strategy checkpoint` does; every commit takes the Hub `--commit-s` seconds. Then the same with the Hub
failing for the first seconds of the final push. For each strategy it reports the time the loop spent in push
calls, the bytes copied aside, how many checkpoints reached the Hub, whether the Hub ends with the newest one, and
the errors.

    python experiments/hub_push_strategies.py
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

PORT = 18765
os.environ["HF_ENDPOINT"] = f"http://127.0.0.1:{PORT}"
os.environ["HF_TOKEN"] = TOKEN = "hf_kilnTESTtoken0123456789"
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="kiln-push-bench-")
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

from hub_server import HubServer  # noqa: E402


class SlowHub(HubServer):
    """Every commit takes `commit_s` seconds (a large upload, a busy Hub)."""

    commit_s = 1.0

    def _wait_at_gates(self, kind: str) -> None:
        if kind == "commit":
            time.sleep(self.commit_s)
        super()._wait_at_gates(kind)


class KilnPush:
    name = "kiln HubPusher (hard-linked snapshot, newest wins, retries)"

    def __init__(self, repo_id: str, staging: str):
        from kiln.hub import HubPusher

        self.pusher = HubPusher(repo_id, staging_dir=staging)
        self.copied = 0
        snapshot = self.pusher._snapshot

        def counting_snapshot(folder, ignore, link=False):
            path = snapshot(folder, ignore, link=link)
            self.copied += sum(
                p.stat().st_size for p in path.rglob("*") if p.is_file() and p.stat().st_nlink == 1
            )
            return path

        self.pusher._snapshot = counting_snapshot
        self.errors: list[str] = []

    def push(self, folder: Path, message: str) -> None:
        self.pusher.push(
            folder,
            path_in_repo="last-checkpoint",
            commit_message=message,
            delete_patterns=["*"],
            immutable=True,
        )

    def finish(self, folder: Path) -> bool:
        self.push(folder, "final")
        ok = self.pusher.wait(timeout=60)
        if not ok:
            self.errors.append(self.pusher.last_error or "timeout")
        return ok


class FuturePush:
    name = "upload_folder(run_as_future=True), skip while busy"

    def __init__(self, repo_id: str, staging: str):
        from huggingface_hub import HfApi

        self.api, self.repo_id = HfApi(), repo_id
        self.api.create_repo(repo_id, exist_ok=True)
        self.future = None
        self.copied = 0
        self.skipped = 0
        self.errors: list[str] = []

    def _collect(self) -> None:
        if self.future is not None and self.future.done() and self.future.exception() is not None:
            err = self.future.exception()
            self.errors.append(f"{type(err).__name__}: {' '.join(str(err).split())[:120]}")

    def push(self, folder: Path, message: str) -> None:
        if self.future is not None and not self.future.done():
            self.skipped += 1
            return
        self._collect()
        self.future = self.api.upload_folder(
            repo_id=self.repo_id,
            folder_path=folder,
            path_in_repo="last-checkpoint",
            commit_message=message,
            delete_patterns=["*"],
            run_as_future=True,
        )

    def finish(self, folder: Path) -> bool:
        # transformers' Trainer waits for the running push, then pushes the final model once
        if self.future is not None:
            self.future.exception()
            self._collect()
        try:
            self.api.upload_folder(
                repo_id=self.repo_id,
                folder_path=folder,
                path_in_repo="last-checkpoint",
                commit_message="final",
                delete_patterns=["*"],
            )
            return True
        except Exception as err:
            self.errors.append(f"final: {type(err).__name__}: {' '.join(str(err).split())[:120]}")
            return False


def save(root: Path, step: int, size: int) -> Path:
    """A checkpoint as Kiln writes one: a .tmp folder renamed into place; the previous one removed."""
    tmp, final = root / f"step-{step:04d}.tmp", root / f"step-{step:04d}"
    tmp.mkdir(parents=True)
    (tmp / "model.safetensors").write_bytes(step.to_bytes(4, "little") * (size // 4))
    (tmp / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    os.replace(tmp, final)
    for old in sorted(root.glob("step-*")):
        if old != final and not old.name.endswith(".tmp"):
            shutil.rmtree(old)
    return final


def run_strategy(strategy_cls, hub: SlowHub, args, fail_final_s: float = 0.0) -> dict:
    repo_id = f"kiln-test/{strategy_cls.__name__.lower()}-{int(fail_final_s)}"
    root = Path(tempfile.mkdtemp(prefix="kiln-push-run-"))
    strategy = strategy_cls(repo_id, staging=str(root.parent))
    in_push = 0.0
    last = None
    for step in range(1, args.saves + 1):
        time.sleep(args.save_every_s)  # training
        last = save(root, step, args.mb * 1024 * 1024)
        t0 = time.perf_counter()
        strategy.push(last, f"Checkpoint at step {step}")
        in_push += time.perf_counter() - t0
    if fail_final_s:
        hub.fail(only="commit", seconds=fail_final_s)
    t0 = time.perf_counter()
    ok = strategy.finish(last)
    final_wait = time.perf_counter() - t0
    hub.recover()
    landed = [c.title for c in hub.commits(repo_id)]
    files = hub.files(repo_id)
    state = files.get("last-checkpoint/trainer_state.json", b"").decode()
    shutil.rmtree(root, ignore_errors=True)
    return {
        "strategy": strategy.name,
        "loop time in push calls (s)": round(in_push, 3),
        "final wait (s)": round(final_wait, 2),
        "bytes copied aside (MB)": round(strategy.copied / 2**20, 1),
        "checkpoint commits on the Hub": sum(t.startswith("Checkpoint") for t in landed),
        "pushes skipped": getattr(strategy, "skipped", 0),
        "Hub ends with the newest checkpoint": ok and f'"global_step": {args.saves}' in state,
        "errors": strategy.errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--saves", type=int, default=10)
    parser.add_argument("--save-every-s", type=float, default=0.3)
    parser.add_argument("--commit-s", type=float, default=1.0)
    parser.add_argument("--mb", type=int, default=8)
    parser.add_argument("--fail-final-s", type=float, default=8.0)
    args = parser.parse_args()
    SlowHub.commit_s = args.commit_s
    hub = SlowHub(port=PORT, token=TOKEN).start()
    try:
        for fail in (0.0, args.fail_final_s):
            print(
                f"\n## {args.saves} saves every {args.save_every_s} s, commits take {args.commit_s} s"
                + (f", the Hub fails commits for {fail} s at the final push" if fail else "")
            )
            for cls in (KilnPush, FuturePush):
                for key, value in run_strategy(cls, hub, args, fail).items():
                    print(f"  {key}: {value}")
                print()
    finally:
        hub.stop()


if __name__ == "__main__":
    main()
