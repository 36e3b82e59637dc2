"""Hugging Face Hub I/O: background pushes, model cards, loss plots, and resuming a run from the Hub.

Pushing never stalls or crashes training: `HubPusher.push` snapshots the folder and returns; a worker thread
uploads one snapshot at a time, keeps only the newest pending snapshot per destination, logs failures and
retries them at the next push (and, a few times with backoff, in the final `wait`).

Tokens come from the `token` argument, `HF_TOKEN`, or `hf auth login`; `kiln.redaction.redact` masks them in anything
the runner logs or saves.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import re
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx2
import huggingface_hub
from huggingface_hub import EvalResult, HfApi, ModelCard, ModelCardData, snapshot_download
from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.utils import filter_repo_objects

from .config import flatten
from .public import card_text, describe_data_files, public_name, public_text
from .redaction import redact, register_token

logger = logging.getLogger(__name__)

CHECKPOINT_FOLDER = "last-checkpoint"
"""Folder of a Hub repo holding the resumable accelerate state (pushed with `--hub.strategy checkpoint`)."""


# --------------------------------------------------------------------------------------------- pushing
def check_push_settings(model_id: str | None, token: str | None = None) -> None:
    """Before a run starts: a repo id of the form user/name and a token to push with (no network)."""
    from .errors import ConfigError

    if not isinstance(model_id, str) or not _REPO_ID.match(model_id):
        raise ConfigError(
            f"--hub.model_id must look like 'user/name' (letters, digits, '-', '_', '.'), got {model_id!r}"
        )
    if token is None and huggingface_hub.get_token() is None:
        raise ConfigError("no Hugging Face token to push with: set HF_TOKEN or run `hf auth login` first")


_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")


START_CHECK_S = 10.0
"""The longest the start of a pushing run waits for the Hub to answer its rights check (or hub.timeout_s if
shorter): a Hub that does not answer then costs this, once, and training goes on."""


@dataclass
class PushRights:
    """What the Hub said at the start of a pushing run: `refusal` (it will not take this run's pushes: one line
    naming why and the fix) or `unchecked` (it could not be asked: offline, not answering, failing; training goes
    on and the pushes are retried as ever); neither: the token can write to the repo, created if it was missing."""

    refusal: str | None = None
    unchecked: str | None = None


def check_push_rights(
    model_id: str, *, private: bool = False, timeout_s: float = START_CHECK_S
) -> PushRights:
    """Before step 1 of a run with --hub.push_to_hub: the token is valid (`whoami`), the repo exists or the
    token may create it (`create_repo(exist_ok=True)`, as transformers' Trainer does at its start) and the token
    may write to it (`auth_check(write=True)`). An HTTP 400/401/403/404 is a refusal, except a 404 of the write
    check once `create_repo` has answered (the repo is there; the server lacks the route); no answer within
    `timeout_s` (the whole check), a connection error, offline mode or a server error is `unchecked`."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    from .errors import first_line

    done: dict[str, PushRights] = {}
    login = "run `hf auth login` (or set HF_TOKEN) with a token that has write access"

    def ask() -> None:
        api, user, step = HfApi(), {}, "whoami"
        try:
            user = api.whoami()
            step = "create the repo"
            api.create_repo(model_id, private=private, exist_ok=True)
            step = "write to it"
            api.auth_check(model_id, write=True)
            done["rights"] = PushRights()
        except OfflineModeIsEnabled:
            done["rights"] = PushRights(unchecked="HF_HUB_OFFLINE is set")
        except HfHubHTTPError as err:
            status = err.response.status_code if err.response is not None else None
            said = first_line(ValueError(err.server_message)) if getattr(err, "server_message", None) else ""
            said = f"HTTP {status}: {said}" if said else f"HTTP {status}"
            if status == 401 or (status == 403 and step == "whoami"):
                done["rights"] = PushRights(
                    refusal=f"the Hub does not accept the Hugging Face token ({said}); {login}"
                )
            elif step == "create the repo" and status == 400:
                done["rights"] = PushRights(
                    refusal=f"the Hub refuses the repo id {model_id} ({said}); name another with --hub.model_id"
                )
            elif step == "write to it" and status == 404:
                # create_repo just answered, so the repo is there: the server lacks the write-check route (older
                # Hub-compatible servers); the first push tells whether the token may write
                done["rights"] = PushRights(
                    unchecked=f"the server has no write check ({said}) for {model_id}"
                )
            elif step != "whoami" and status in (403, 404):
                who = f"the token of {user['name']}" if user.get("name") else "the token"
                done["rights"] = PushRights(
                    refusal=f"cannot push to the Hub repo {model_id}: {who} may not {step} ({said}); pick a repo id "
                    f"in a namespace you can write to with --hub.model_id, or {login} there"
                )
            else:
                done["rights"] = PushRights(unchecked=said)
        except Exception as err:  # no network, no DNS, a timeout: the Hub could not be asked
            done["rights"] = PushRights(unchecked=redact(f"{type(err).__name__}: {first_line(err)}"))

    asking = threading.Thread(target=ask, name="hub-rights-check", daemon=True)
    asking.start()
    asking.join(timeout_s + 2)  # DNS is not bounded by the client's timeout: the thread is
    if "rights" not in done:
        return PushRights(unchecked=f"no answer within {timeout_s:g} s")
    return done["rights"]


def set_request_timeout(timeout_s: float) -> None:
    """Bound how long any Hub request of this process waits for the server (huggingface_hub's own client has
    no timeout, so a server that accepts the connection and never answers would hang a push forever). A stalled
    request fails with a timeout error after `timeout_s` seconds without data, and is retried like any failure.
    The client also tells `HubProgress` when the Hub answers or reads an upload's bytes."""
    from huggingface_hub.utils import _http

    def factory():
        client = _http.default_client_factory()  # the library's own client (headers, hooks, redirects) ...
        client.timeout = httpx2.Timeout(timeout_s)  # ... with a timeout
        client.event_hooks["request"].append(HubProgress.watch_request)
        client.event_hooks["response"].append(HubProgress.on_response)
        return client

    huggingface_hub.set_client_factory(factory)
    HubProgress.watch_xet_uploads()


class HubProgress:
    """When this process's Hub traffic last moved: an answer from the Hub, or an upload's bytes read by it.

    A server that accepts connections and never answers shows none, while a large upload that is being read
    shows it continually, so a wait can give up after a while without progress (`HubPusher.wait`) and still
    let a long upload finish. Bytes handed to the network count only past the first `BUFFERED_BYTES` of a
    request: that much fits in the kernel's socket buffers (both ends) even when nobody reads it. Xet uploads
    (which bypass the HTTP client) count by the bytes their progress reports say were transferred."""

    BUFFERED_BYTES = 64 * 2**20
    last = time.monotonic()

    @classmethod
    def note(cls) -> None:
        cls.last = time.monotonic()

    @classmethod
    def idle_s(cls, since: float) -> float:
        """Seconds without progress, counted from `since` at the latest (a monotonic time)."""
        return time.monotonic() - max(cls.last, since)

    @classmethod
    def on_response(cls, response) -> None:
        cls.note()

    @classmethod
    def watch_request(cls, request) -> None:
        stream = request.stream
        if isinstance(stream, httpx2.SyncByteStream) and not isinstance(stream, _CountingStream):
            request.stream = _CountingStream(stream)

    @classmethod
    def watch_xet_uploads(cls) -> None:
        """Note the transferred bytes that huggingface_hub's Xet progress reporter receives (it is used unless
        progress bars are disabled); a no-op where that reporter is not found."""
        try:
            from huggingface_hub.utils import _xet_progress_reporting as reporting
        except ImportError:
            return
        reporter = getattr(reporting, "XetUploadProgressReporter", None)
        update = getattr(reporter, "update_progress", None)
        if update is None or getattr(update, "_kiln_progress", False):
            return

        def update_progress(self, group_report, *args, **kwargs):
            sent = getattr(group_report, "total_transfer_bytes_completed", 0) or 0
            if sent > getattr(self, "_kiln_sent", 0):
                self._kiln_sent = sent
                cls.note()
            return update(self, group_report, *args, **kwargs)

        update_progress._kiln_progress = True
        reporter.update_progress = update_progress


class _CountingStream(httpx2.SyncByteStream):
    """A request body that tells `HubProgress` when its bytes leave the process past the socket buffers."""

    def __init__(self, inner: httpx2.SyncByteStream):
        self.inner, self.sent = inner, 0

    def __iter__(self):
        for chunk in self.inner:
            yield chunk
            self.sent += len(chunk)  # the client asks for the next chunk once this one is written
            if self.sent > HubProgress.BUFFERED_BYTES:
                HubProgress.note()

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


@dataclass
class _PushRequest:
    snapshot: Path
    path_in_repo: str | None
    commit_message: str
    ignore_patterns: list[str] | None
    delete_patterns: list[str] | None
    source: Path | None = None
    """The folder the snapshot was taken from (named when the push is handed to the user)."""


class HubPusher:
    """Uploads folders to a Hub repo in the background, newest snapshot wins; never raises into training.

    Args:
        model_id: the Hub repo, `user/name`; created (once) on the first upload.
        private: create the repo as private.
        revision: branch to push to (created from main when missing); None: main.
        token: Hub token; None: `HF_TOKEN` or the `hf auth login` token. Never logged.
        enabled: False on non-main processes: every method is then a no-op.
        staging_dir: where push snapshots are copied, or hard-linked for `immutable` pushes when on the same
            filesystem (default: the system temp dir); for large checkpoints,
            pick a folder on the same disk as the checkpoints.
    """

    wait_retries = 3
    """How often `wait` retries a failed upload: at once, then after `retry_backoff_s`, twice that, ..."""
    retry_backoff_s = 5.0

    def __init__(
        self,
        model_id: str,
        *,
        private: bool = False,
        revision: str | None = None,
        token: str | None = None,
        enabled: bool = True,
        staging_dir: str | None = None,
        timeout_s: float | None = None,
    ):
        self.model_id, self.private, self.revision, self.enabled = model_id, private, revision, enabled
        self.last_error: str | None = None
        """The last upload failure (token redacted), or None once an upload succeeded again."""
        if not enabled:
            return
        if not isinstance(model_id, str) or model_id.count("/") != 1 or not all(model_id.split("/")):
            raise ValueError(f"--hub.model_id must look like 'user/name', got {model_id!r}")
        if token is None and huggingface_hub.get_token() is None:
            raise ValueError("No Hugging Face token to push with: set HF_TOKEN or run `hf auth login`")
        if token:
            register_token(token)
        if timeout_s is not None:
            set_request_timeout(timeout_s)
        self._api = HfApi(token=token)
        self._staging_dir = staging_dir
        self._staging_root: Path | None = None
        self._cond = threading.Condition()
        self._pending: OrderedDict[str, _PushRequest] = OrderedDict()
        self._uploading = False
        self._in_flight: _PushRequest | None = None
        self._stalled = False  # the last upload failed: the next push() or wait() retries
        self._repo_ready = False
        self._worker: threading.Thread | None = None
        self._closed = False
        # The worker is a daemon, so a request stalled on a dead Hub never keeps the process alive after a stop
        # signal handed the push to the user (`close`); pushes queued at exit are never dropped silently: the
        # exit waits for them (at most exit_wait_s), then names what did not land

    exit_wait_s = 600.0
    """At interpreter exit, how long queued pushes nobody waited for (an error ended the program) may take."""
    exit_stall_s: float | None = None
    """At interpreter exit, how long that wait goes on without progress (see `wait`); None: no such limit."""
    gave_up_idle = False
    """Whether the last `wait` ended because nothing progressed for its `stall_s`."""

    def push(
        self,
        folder: str | os.PathLike,
        *,
        path_in_repo: str | None = None,
        commit_message: str,
        ignore_patterns: list[str] | str | None = None,
        delete_patterns: list[str] | str | None = None,
        immutable: bool = False,
        source: str | os.PathLike | None = None,
    ) -> None:
        """Queue an upload of `folder` (to `path_in_repo`, default the repo root) and return.

        The folder is copied first, so it may be changed or deleted right after (checkpoint rotation). A
        pending upload to the same `path_in_repo` that has not started yet is replaced by this one.
        `delete_patterns` removes matching remote files under `path_in_repo` that this upload does not
        overwrite. `immutable`: no file of the folder is ever rewritten in place, only deleted (a Kiln
        checkpoint): its files are hard-linked instead of copied where the staging folder is on the same
        filesystem, so a checkpoint push writes nothing more to disk. `source`: the folder to name when the
        push is handed to the user (`unpushed`), default `folder`.
        """
        if not self.enabled:
            return
        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"Cannot push {folder}: it is not a folder")
        ignore = [ignore_patterns] if isinstance(ignore_patterns, str) else ignore_patterns
        delete = [delete_patterns] if isinstance(delete_patterns, str) else delete_patterns
        try:
            snapshot = self._snapshot(folder, ignore, link=immutable)
        except OSError as err:  # e.g. a full disk: skip this push rather than stop training
            logger.warning("Skipping the push of %s: could not copy it aside (%s)", folder, err)
            return
        request = _PushRequest(snapshot, path_in_repo, commit_message, ignore, delete, Path(source or folder))
        key = (path_in_repo or "").strip("/")
        with self._cond:
            superseded = self._pending.pop(key, None)
            if superseded is not None:
                shutil.rmtree(superseded.snapshot, ignore_errors=True)
            self._pending[key] = request
            self._stalled = False
            self._cond.notify_all()
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="kiln-hub-push", daemon=True)
                self._worker.start()
                # registered after the staging folder's removal, so it runs before it (atexit is last in, first out)
                atexit.register(self._wait_at_exit)

    def wait(
        self,
        timeout: float | None = None,
        stop: Callable[[], bool] | None = None,
        stall_s: float | None = None,
    ) -> bool:
        """Block until every queued upload has landed, retrying failed ones a few times; True if all did.
        `stop`: polled a few times a second; when it returns True the wait ends at once (False). `stall_s`: the
        wait ends (False, `gave_up_idle` set) after this many seconds without progress (`HubProgress`: no answer
        from the Hub, no upload bytes read), while an upload that progresses goes on up to `timeout`."""
        if not self.enabled:
            return True
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        self.gave_up_idle = False
        retries = 0
        poll = 0.2 if stop is not None or stall_s is not None else None

        def given_up() -> bool:
            if stop is not None and stop():
                return True
            if stall_s is not None and HubProgress.idle_s(start) > stall_s:
                self.gave_up_idle = True
                return True
            return False

        with self._cond:
            while self._pending or self._uploading:
                if given_up():
                    return False
                if self._stalled:
                    if retries >= self.wait_retries:
                        return False
                    delay = self.retry_backoff_s * 2 ** (retries - 1) if retries else 0.0
                    retry_at = time.monotonic() + delay
                    if deadline is not None and retry_at > deadline:
                        return False
                    retries += 1
                    while self._stalled and (remaining := retry_at - time.monotonic()) > 0:
                        if given_up():
                            return False
                        self._cond.wait(remaining if poll is None else min(remaining, poll))
                    self._stalled = False
                    self._cond.notify_all()
                    continue
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(
                    poll if remaining is None else (remaining if poll is None else min(remaining, poll))
                )
            return True

    def unpushed(self) -> list[tuple[Path, str | None]]:
        """(source folder, path in the repo) of every queued or in-flight push that has not landed."""
        if not self.enabled:
            return []
        with self._cond:
            requests = list(self._pending.values())
            if self._uploading and self._in_flight is not None:
                requests.insert(0, self._in_flight)
        return [(request.source, request.path_in_repo) for request in requests]

    def close(self) -> None:
        """Stop caring about queued pushes (waited for, or handed to the user): the exit does not wait for them."""
        self._closed = True

    def _wait_at_exit(self) -> None:
        if not self.enabled or self._closed or self._worker is None:
            return
        with self._cond:
            if not (self._pending or self._uploading):
                return
        logger.warning("waiting (at most %g s) for the queued pushes to %s", self.exit_wait_s, self.model_id)
        if not self.wait(timeout=self.exit_wait_s, stall_s=self.exit_stall_s):
            for source, path_in_repo in self.unpushed():
                logger.error(
                    "the push of %s to %s did not complete; push it with `hf upload %s %s%s`",
                    source,
                    self.model_id,
                    self.model_id,
                    source,
                    f" {path_in_repo}" if path_in_repo else "",
                )

    # ------------------------------------------------------------------------------------------- worker
    def _snapshot(self, folder: Path, ignore_patterns: list[str] | None, link: bool = False) -> Path:
        if self._staging_root is None:
            self._staging_root = Path(tempfile.mkdtemp(prefix="kiln-hub-push-", dir=self._staging_dir))
            atexit.register(shutil.rmtree, self._staging_root, ignore_errors=True)
        snapshot = Path(tempfile.mkdtemp(dir=self._staging_root))
        try:
            files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
            for relative in filter_repo_objects(files, ignore_patterns=ignore_patterns):
                target = snapshot / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                if link and _hard_link(folder / relative, target):
                    continue
                shutil.copyfile(folder / relative, target)
        except OSError:
            shutil.rmtree(snapshot, ignore_errors=True)
            raise
        return snapshot

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._pending or self._stalled:
                    self._cond.wait()
                key, request = self._pending.popitem(last=False)
                self._uploading, self._in_flight = True, request
            error = self._upload(request)
            with self._cond:
                self._uploading, self._in_flight = False, None
                self.last_error = error
                if error is None or key in self._pending:  # done, or superseded by a newer snapshot
                    shutil.rmtree(request.snapshot, ignore_errors=True)
                else:
                    self._pending[key] = request
                    self._pending.move_to_end(key, last=False)
                self._stalled = error is not None
                self._cond.notify_all()

    def _upload(self, request: _PushRequest) -> str | None:
        try:
            if not self._repo_ready:
                self._api.create_repo(self.model_id, private=self.private, exist_ok=True)
                if self.revision:
                    self._api.create_branch(self.model_id, branch=self.revision, exist_ok=True)
                self._repo_ready = True
            self._api.upload_folder(
                repo_id=self.model_id,
                folder_path=request.snapshot,
                path_in_repo=request.path_in_repo,
                commit_message=request.commit_message,
                revision=self.revision,
                # upload_folder appends its defaults to this list: hand it a copy
                ignore_patterns=list(request.ignore_patterns) if request.ignore_patterns else None,
                delete_patterns=request.delete_patterns,
            )
        except Exception as err:  # anything: a failed push must never take the training run down
            message = redact(f"{type(err).__name__}: {err}")
            logger.warning("Push to the Hub repo %s failed, will retry: %s", self.model_id, message)
            return message
        where = f"{self.model_id}/{request.path_in_repo}" if request.path_in_repo else self.model_id
        logger.info("Pushed to the Hub: %s (%s)", where, request.commit_message)
        return None


def _hard_link(source: Path, target: Path) -> bool:
    try:
        os.link(source, target)
        return True
    except OSError:  # another filesystem, or no hard links there: copy instead
        return False


# ------------------------------------------------------------------------------------------ model card
# pipeline tag -> the Auto class a card's usage code loads; a card claims only these tasks, each one a Kiln head
# (tests/test_dropin.py checks every entry against the registered Kiln classes)
_AUTO_CLASS = {
    "fill-mask": "AutoModelForMaskedLM",
    "text-generation": "AutoModelForCausalLM",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "multiple-choice": "AutoModelForMultipleChoice",
    "feature-extraction": "AutoModel",
    "text2text-generation": "AutoModelForSeq2SeqLM",
}
_USAGE_TAIL = {
    "fill-mask": 'inputs = tokenizer(f"Paris is the {tokenizer.mask_token} of France.", '
    'return_tensors="pt")\n'
    "logits = model(**inputs).logits",
    "text-generation": 'inputs = tokenizer("Once upon a time", return_tensors="pt")\n'
    "print(tokenizer.decode(model.generate(**inputs, max_new_tokens=40)[0]))",
    "text-classification": 'inputs = tokenizer("A delightful film.", return_tensors="pt")\n'
    "print(model.config.id2label[model(**inputs).logits.argmax(-1).item()])",
    "token-classification": 'inputs = tokenizer("Ada Lovelace lived in London.", return_tensors="pt")\n'
    "print([model.config.id2label[i] for i in model(**inputs).logits.argmax(-1)[0].tolist()])",
}
_SECRET_KEY = re.compile(r"(^|[._])(token|api_key|password|secret)$")
_LOCAL_DATA_SUFFIXES = (".txt", ".json", ".jsonl", ".csv", ".tsv", ".parquet", ".arrow", ".gz", ".zst")
_HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")


def _format_value(value) -> str:
    """A number as the card shows it; anything else as text (`card_text`: no markup, no local path)."""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"{value:,}"
    return card_text(value)


def _format_duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


_HIGHLIGHTS = [  # summary facts that open the training section, under any of these names
    ("Optimizer steps", ("steps", "optimizer steps", "global_step"), _format_value),
    ("Tokens seen", ("tokens", "tokens seen"), _format_value),
    ("Training time", ("time_s", "training time (s)", "train_time_s"), _format_duration),
    ("Hardware", ("hardware", "device"), card_text),
]


def _is_hub_dataset(name: str) -> bool:
    return bool(_HUB_ID.match(name)) and not name.endswith(_LOCAL_DATA_SUFFIXES) and not os.path.exists(name)


def write_model_card(
    save_dir: str | os.PathLike,
    *,
    model_id: str | None,
    model_kind: str,
    summary: dict,
    metrics: dict[str, float],
    datasets: list[str],
    license: str | None,
    tags: list[str],
    loss_plot: str | None,
    base_model: str | list[str] | None = None,
    task: str = "fill-mask",
    final_dir: str | os.PathLike | None = None,
) -> str:
    """Write `save_dir/README.md` and return its path: Hub metadata (license, datasets, tags, pipeline tag,
    model-index results) and a card with the training summary, hyperparameters, metrics, the loss plot, and
    usage code.

    `summary`: run facts shown as a table (nested dicts flattened); `steps`, `tokens`, `time_s` (seconds) and
    `hardware` also open the training section (so do `optimizer steps`, `tokens seen`, `training time (s)`
    and `device`). Keys naming secrets (`token`, `password`, ...) are left out.
    `metrics`: final evaluation numbers, e.g. {"eval/loss": 2.1, "eval/perplexity": 8.2}.
    `datasets`: Hub dataset ids go into the metadata; local files are named in the text by file name, size and
    content hash, never by their path (kiln.public). Facts that are local paths are reduced to their last part.
    `loss_plot`: an image path; copied into `save_dir` when it lies elsewhere, and embedded by relative path.
    `task`: the pipeline tag (fill-mask, text-generation, text-classification, token-classification, ...).
    `final_dir`: where the folder will live when it is written elsewhere first (the card names that path).
    """
    if task not in _AUTO_CLASS:
        raise ValueError(
            f"No Kiln head serves the task {task!r}; a model card can claim one of {sorted(_AUTO_CLASS)}."
        )
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    model_name = (model_id or _local_name(Path(final_dir or save_dir))).split("/")[-1]
    card_data = _card_metadata(model_name, task, metrics, datasets, license, tags, base_model)
    facts = {k: public_name(v) for k, v in flatten(summary).items() if not _SECRET_KEY.search(k.lower())}
    local_data = [d for d in datasets if not _is_hub_dataset(d)]
    lines = [
        f"# {card_text(model_name)}",
        "",
        _card_origin(
            model_kind, base_model, [corpus_name(d) for d in datasets], fine_tuned="fine-tuning" in tags
        ),
        *_data_section(local_data),
        *_training_section(facts),
        *_results_section(metrics),
        *_loss_curve_section(_place_plot(loss_plot, save_dir)),
        *_usage_section(task, model_id or local_usage_name(final_dir or save_dir)),
        *_license_section(license),
    ]
    content = public_text(f"---\n{card_data.to_yaml()}\n---\n\n" + "\n".join(lines))
    try:
        ModelCard(content)  # parses the metadata back, model-index included
    except ValueError as err:
        raise ValueError(f"The generated model card metadata does not parse: {err}") from None
    path = save_dir / "README.md"
    path.write_text(content, encoding="utf-8")
    return str(path)


def corpus_name(dataset: str) -> str:
    """How the card names one source of training data: a Hub id as it is; a local file or folder by its name; a
    glob by its folder's name and its pattern (`tinystories/*.txt`, not a bare `*.txt`); never the path above."""
    name = public_name(dataset)
    if not _is_hub_dataset(dataset) and any(c in name for c in "*?[") and Path(dataset).parent.name:
        return f"{Path(dataset).parent.name}/{name}"
    return name


def _license_section(license: str | None) -> list[str]:
    """Without hub.license the card claims none: a license is the author's choice, not a default of the tool."""
    if license:
        return []
    return ["## License", "", "No license was chosen for this model; ask its author before reusing it.", ""]


def local_usage_name(save_dir: str | os.PathLike) -> str:
    """What a card's usage code loads when the model has no Hub id: a placeholder path ending in the folder's
    name, not the place it lies on this machine."""
    return f"path/to/{Path(save_dir).name}"


def _data_section(local_data: list[str]) -> list[str]:
    """The local training data by file name, size and content hash (their paths stay on this machine)."""
    if not local_data:
        return []
    return ["", "## Training data", "", *(f"- {line}" for line in describe_data_files(local_data))]


def _local_name(save_dir: Path) -> str:
    """runs/<run>/final and runs/<run>/best are named after their run, not "final"."""
    local = save_dir.resolve()
    return local.parent.name if local.name in ("final", "best") and local.parent.name else local.name


def _card_metadata(model_name, task, metrics, datasets, license, tags, base_model) -> ModelCardData:
    """The card's YAML header: license, Hub datasets, tags, pipeline tag, base model, model-index results."""
    hub_datasets = [d for d in datasets if _is_hub_dataset(d)]
    finite = {name: float(value) for name, value in metrics.items() if math.isfinite(float(value))}
    eval_dataset = hub_datasets[0] if hub_datasets else "custom"
    eval_results = [
        EvalResult(
            task_type=task,
            dataset_type=eval_dataset,
            dataset_name=eval_dataset,
            metric_type=name.split("/")[-1],
            metric_name=name,
            metric_value=value,
        )
        for name, value in finite.items()
    ]
    return ModelCardData(
        license=license,
        datasets=hub_datasets or None,
        tags=["kiln", *tags],
        library_name="transformers",
        pipeline_tag=task,
        base_model=base_model,
        model_name=model_name,
        eval_results=eval_results or None,
    )


def _place_plot(loss_plot: str | None, save_dir: Path) -> str | None:
    """The loss plot's path relative to `save_dir`, copied into it when it lies elsewhere."""
    if loss_plot is None:
        return None
    plot = Path(loss_plot)
    if not plot.is_file():
        raise FileNotFoundError(f"Loss plot {loss_plot} does not exist: plot it first with plot_loss_curve")
    if save_dir.resolve() not in plot.resolve().parents:
        shutil.copyfile(plot, save_dir / plot.name)
        plot = save_dir / plot.name
    return plot.resolve().relative_to(save_dir.resolve()).as_posix()


def _card_origin(
    model_kind: str, base_model: str | list[str] | None, datasets: list[str], fine_tuned: bool = False
) -> str:
    """The card's first sentence: what the model is, where it started (a fine-tuned model's start that is no Hub
    id is not named: it lies on the user's disk), what it was trained on."""
    bases = [base_model] if isinstance(base_model, str) else list(base_model or [])
    if bases:
        links = (
            f"[{card_text(b)}](https://huggingface.co/{b})" if _HUB_ID.match(b) else card_text(b)
            for b in bases
        )
        origin = "fine-tuned from " + " and ".join(links)
    else:
        origin = "fine-tuned from a local checkpoint" if fine_tuned else "pretrained"
    trained_on = ", ".join(card_text(d) for d in datasets) or "local text"
    kind = card_text(model_kind)
    return f"{'An' if model_kind[:1].lower() in 'aeiou' else 'A'} {kind} {origin} with Kiln on {trained_on}."


def _training_section(facts: dict) -> list[str]:
    """The highlights (steps, tokens, time, hardware), then every fact as a table."""
    lines = ["", "## Training", ""]
    for label, keys, fmt in _HIGHLIGHTS:
        key = next((key for key in keys if key in facts), None)
        if key is not None:
            lines.append(f"- {label}: {fmt(facts[key])}")
    if facts:
        lines += ["", "| setting | value |", "|---|---|"]
        lines += [f"| {card_text(key)} | {_format_value(value)} |" for key, value in facts.items()]
    return lines


def _results_section(metrics: dict[str, float]) -> list[str]:
    if not metrics:
        return []
    lines = ["", "## Results", "", "| metric | value |", "|---|---|"]
    return lines + [
        f"| {card_text(name)} | {_format_value(float(value))} |" for name, value in metrics.items()
    ]


def _loss_curve_section(plot_ref: str | None) -> list[str]:
    return ["", "## Loss curve", "", f"![Training loss]({quote(plot_ref)})"] if plot_ref else []


def _usage_section(task: str, repo: str) -> list[str]:
    """Loading code with the task's Auto class (the model code ships with the weights)."""
    auto_class = _AUTO_CLASS[task]
    usage = [
        f"from transformers import {auto_class}, AutoTokenizer",
        "",
        f"tokenizer = AutoTokenizer.from_pretrained({json.dumps(repo)}, trust_remote_code=True)",
        f"model = {auto_class}.from_pretrained({json.dumps(repo)}, trust_remote_code=True)",
    ]
    if task in _USAGE_TAIL:
        usage.append(_USAGE_TAIL[task])
    lines = [
        "",
        "## Usage",
        "",
        "The model code ships with the weights, hence `trust_remote_code=True`. The tokenizer is a plain "
        "`tokenizer.json`: `AutoTokenizer` reads the model's config first (through the same code), and "
        "`PreTrainedTokenizerFast.from_pretrained` loads the same tokenizer without running any code.",
        "",
    ]
    return lines + ["```python", *usage, "```", ""]


def replace_card_usage(card: Path, code: str) -> None:
    """Swap the Usage section at the end of a model card written by write_model_card for `code`."""
    text = card.read_text(encoding="utf-8")
    head = text[: text.index("## Usage")] if "## Usage" in text else text.rstrip() + "\n\n"
    card.write_text(f"{head}## Usage\n\n```python\n{code.strip()}\n```\n", encoding="utf-8")


def plot_loss_curve(history: list[dict], path: str | os.PathLike, title: str) -> str:
    """Plot `train/loss` (and `eval/loss` points) against `step` from history entries into a PNG at `path`."""
    # Agg through the object API: pyplot's global backend and figure registry stay untouched
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    train = [
        (entry["step"], entry["train/loss"]) for entry in history if "train/loss" in entry and "step" in entry
    ]
    evals = [
        (entry["step"], entry["eval/loss"]) for entry in history if "eval/loss" in entry and "step" in entry
    ]
    if not train and not evals:
        raise ValueError("Nothing to plot: no history entry has a 'step' with a 'train/loss' or 'eval/loss'")
    figure = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    if train:
        axes.plot(*zip(*train), label="train loss", linewidth=1.2)
    if evals:
        axes.plot(*zip(*evals), "o-", label="eval loss", linewidth=1.2)
    axes.set(xlabel="step", ylabel="loss", title=title)
    axes.grid(alpha=0.3)
    axes.legend()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, bbox_inches="tight")
    return str(path)


# ---------------------------------------------------------------------------------------------- resume
def download_checkpoint(
    spec: str,
    local_dir: str | os.PathLike,
    revision: str | None = None,
    token: str | None = None,
    timeout: float | None = None,
) -> str:
    """Download `last-checkpoint/` of the Hub repo named by `spec` (`hub:user/name`) into `local_dir`.

    Returns the path of the downloaded accelerate state folder (`local_dir/last-checkpoint`). `timeout`: seconds
    the repository lookup may wait for an answer (None: no limit; the file downloads use HF_HUB_DOWNLOAD_TIMEOUT).
    """
    repo_id = spec[len("hub:") :] if spec.startswith("hub:") else ""
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ValueError(f"Expected a Hub checkpoint as 'hub:user/name', got {spec!r}")
    api = HfApi(token=token)
    try:
        commit = api.repo_info(
            repo_id, revision=revision, timeout=timeout
        ).sha  # pin one commit for the listing and the download
        files = api.list_repo_files(repo_id, revision=commit)
    except RepositoryNotFoundError:
        raise FileNotFoundError(f"Hub repo {repo_id} not found, or your token cannot read it") from None
    except RevisionNotFoundError:
        raise FileNotFoundError(f"Hub repo {repo_id} has no revision {revision!r}") from None
    if not any(name.startswith(f"{CHECKPOINT_FOLDER}/") for name in files):
        raise FileNotFoundError(
            f"Hub repo {repo_id} has no {CHECKPOINT_FOLDER}/ to resume from: "
            "push with --hub.strategy checkpoint"
        )
    folder = snapshot_download(
        repo_id, revision=commit, allow_patterns=[f"{CHECKPOINT_FOLDER}/*"], local_dir=local_dir, token=token
    )
    return str(Path(folder) / CHECKPOINT_FOLDER)


__all__ = [
    "CHECKPOINT_FOLDER",
    "HubPusher",
    "check_push_rights",
    "check_push_settings",
    "set_request_timeout",
    "download_checkpoint",
    "plot_loss_curve",
    "replace_card_usage",
    "write_model_card",
]
