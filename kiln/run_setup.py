"""Setting a run up: the accelerator (devices, engine plugins, mixed precision, seeding), the batch layout
(per-device batch and accumulation for a global batch on any number of processes), and the output folder with
its lock, prepared before the loop (`kiln.trainer`) starts."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from .config import LoggingConfig, TrainingConfig, save_config
from .errors import ConfigError, first_line
from .nodes import resolve_disk_layout, writes_run_files
from .run_folder import LOCK_FILE
from .safe_write import open_file

logger = logging.getLogger("kiln")


def optimizer_steps_per_epoch(examples: int, global_batch: int) -> int:
    """An epoch of n examples holds n // global batch optimizer steps, each over a whole global batch; the last
    n % global batch examples of the epoch's order are left out (another draw each epoch). So the steps, the
    examples of each step and the schedule's length depend on the global batch only, not on how it is split
    into processes and accumulation steps (an elastic resume continues the same steps)."""
    return examples // global_batch


def build_accelerator(training: TrainingConfig, logging_cfg: LoggingConfig) -> Accelerator:
    from accelerate import DataLoaderConfiguration
    from accelerate.utils import ProjectConfiguration

    log_with = {"none": None, "all": ["wandb", "tensorboard"]}.get(
        logging_cfg.report_to, [logging_cfg.report_to]
    )
    if log_with and "wandb" in log_with and not os.environ.get("WANDB_API_KEY"):
        # no key: keep everything on disk instead of failing or prompting; `wandb sync` uploads later
        os.environ.setdefault("WANDB_MODE", "offline")
    return Accelerator(
        gradient_accumulation_steps=training.gradient_accumulation_steps,
        mixed_precision=training.mixed_precision,
        log_with=log_with,
        project_config=ProjectConfiguration(
            project_dir=training.output_dir, logging_dir=os.path.join(training.output_dir, "logs")
        ),
        # we shard map-style data ourselves through accelerate's batch sampler and stream pre-split iterables
        dataloader_config=DataLoaderConfiguration(dispatch_batches=False),
        dynamo_backend="inductor" if training.torch_compile else None,
        # the scheduler is stepped by us once per optimizer step, whatever the number of processes
        step_scheduler_with_optimizer=False,
    )


def check_services(config: Any, accelerator: Accelerator) -> None:
    """At the start of a run, before its build and its output folder: the services it will use take it. W&B
    (`wandb_problem`) and, with --hub.push_to_hub, the Hub: the repo id and a token at once (no network), then
    whether the token may create and write the repo (`kiln.hub.check_push_rights`). A refusal is one line on
    every process; a Hub that cannot be asked (offline, not answering) is one warning, and training goes on with
    its pushes retried as ever. The main process asks; the others wait for its answer."""
    hub_cfg = getattr(config, "hub", None)
    pushing = hub_cfg is not None and hub_cfg.push_to_hub
    if pushing:
        from .hub import check_push_settings

        check_push_settings(hub_cfg.model_id)
    message = None
    if accelerator.is_main_process:
        message = wandb_problem(config.logging)
        if message is None and pushing:
            from .hub import START_CHECK_S, check_push_rights, set_request_timeout
            from .redaction import redact

            timeout_s = min(hub_cfg.timeout_s, START_CHECK_S)
            set_request_timeout(timeout_s)
            try:
                rights = check_push_rights(hub_cfg.model_id, private=hub_cfg.private, timeout_s=timeout_s)
            finally:
                set_request_timeout(hub_cfg.timeout_s)
            message = redact(rights.refusal) if rights.refusal else None
            if rights.unchecked:
                logger.warning(
                    "could not ask the Hub whether this run may push to %s (%s); training goes on, and the pushes "
                    "are tried and retried as it saves",
                    hub_cfg.model_id,
                    redact(rights.unchecked),
                )
    _agree(accelerator, message)


WANDB_CHECK_S = 5.0
"""How long the start of a run waits for the W&B server to answer (wandb.init itself waits 90 s and more)."""


def wandb_problem(logging_cfg: LoggingConfig) -> str | None:
    """Why `--logging.report_to wandb` (or `all`) cannot log online, found at the start in a few seconds rather
    than by wandb.init after the build (a UsageError traceback without an API key; about two minutes and a
    traceback without a network): None when wandb logs offline or is disabled (WANDB_MODE), or when an API key
    is set and the server (WANDB_BASE_URL) answers and accepts it."""
    if logging_cfg.report_to not in ("wandb", "all"):
        return None
    if "WANDB_MODE" not in os.environ and not os.environ.get("WANDB_API_KEY"):
        return None  # build_accelerator logs offline (documented): nothing to reach
    mode = os.environ.get("WANDB_MODE", "online").strip().lower()
    if mode in ("offline", "dryrun", "disabled") or os.environ.get("WANDB_DISABLED", "").lower() in (
        "1",
        "true",
        "yes",
    ):
        return None
    offline = "or set WANDB_MODE=offline to log to disk (`wandb sync` uploads later)"
    base_url = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").rstrip("/")
    key = os.environ.get("WANDB_API_KEY") or _netrc_password(base_url)
    if not key and not os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return (
            f"--logging.report_to {logging_cfg.report_to} with WANDB_MODE={mode}, but no W&B API key is set "
            f"(WANDB_API_KEY, or `wandb login`); run `wandb login`, {offline}"
        )
    answer = _ask_wandb(
        base_url, key or ""
    )  # an identity token (no key): wandb exchanges it; the server answers
    if answer == 401 and key:
        return f"the W&B server {base_url} does not accept the API key (HTTP 401); run `wandb login --relogin`, {offline}"
    if isinstance(answer, str):
        return f"the W&B server {base_url} does not answer ({answer}); check the network, {offline}"
    return None


def _netrc_password(url: str) -> str | None:
    """The password `wandb login` saved for the host of `url` in ~/.netrc (or $NETRC)."""
    import netrc
    from urllib.parse import urlsplit

    try:
        found = netrc.netrc(os.environ.get("NETRC") or None).authenticators(urlsplit(url).hostname or "")
    except (OSError, netrc.NetrcParseError):
        return None
    return found[2] if found else None


def _ask_wandb(base_url: str, key: str) -> int | str:
    """The HTTP status of one GraphQL query for the key's user (what `wandb login` checks), or why none came
    within WANDB_CHECK_S (in a thread: name resolution is not bounded by the socket's timeout)."""
    import base64
    import json
    import threading
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"{base_url}/graphql",
        data=json.dumps({"query": "query Viewer { viewer { id } }"}).encode(),
        headers={
            "Content-Type": "application/json",
            "Authorization": "Basic " + base64.b64encode(f"api:{key}".encode()).decode(),
        },
    )
    answer: list[int | str] = []

    def ask() -> None:
        try:
            with urllib.request.urlopen(request, timeout=WANDB_CHECK_S) as response:
                answer.append(response.status)
        except urllib.error.HTTPError as err:
            answer.append(err.code)
        except Exception as err:  # refused, unresolvable, timed out
            reason = getattr(err, "reason", None) or err
            answer.append(
                f"{type(reason).__name__}: {first_line(reason) if isinstance(reason, BaseException) else reason}"
            )

    thread = threading.Thread(target=ask, name="wandb-check", daemon=True)
    thread.start()
    thread.join(WANDB_CHECK_S + 1)
    return answer[0] if answer else f"no answer within {WANDB_CHECK_S:g} s"


def configure_deepspeed(plugin: Any, training: TrainingConfig) -> None:
    """Give DeepSpeed Kiln's accumulation, clipping and per-device batch in place of its `auto` values.

    Left `auto`, accelerate fills DeepSpeed's clipping with 1.0 whatever `--training.max_grad_norm` says, and a
    model and optimizer prepared without a dataloader (as the trainer does) have no micro-batch size at all. An
    explicit value that disagrees with Kiln's is refused: DeepSpeed would silently win while Kiln counted steps,
    scheduled the learning rate and logged with its own.
    """
    ds = plugin.deepspeed_config
    wanted = {
        "gradient_accumulation_steps": ("gradient_accumulation_steps", training.gradient_accumulation_steps),
        "gradient_clipping": ("max_grad_norm", float(max(training.max_grad_norm, 0.0))),  # DeepSpeed: 0 = off
        "train_micro_batch_size_per_gpu": (
            "per_device_train_batch_size",
            training.per_device_train_batch_size,
        ),
    }
    mismatches = []
    for key, (kiln_name, value) in wanted.items():
        current = ds.get(key, "auto")
        if current == "auto":
            ds[key] = value
        elif float(current) != float(value):
            mismatches.append(f"DeepSpeed {key}={current} but --training.{kiln_name} {value}")
    if mismatches:
        raise ConfigError(
            "the DeepSpeed config disagrees with Kiln's: "
            + "; ".join(mismatches)
            + ". Remove these keys from the "
            'accelerate config (or set them to "auto" in a deepspeed_config_file): Kiln fills them from --training.*'
        )
    plugin.gradient_accumulation_steps = ds["gradient_accumulation_steps"]
    plugin.gradient_clipping = ds["gradient_clipping"]


def align_engine(accelerator: Accelerator, training: TrainingConfig) -> None:
    """After the Accelerator is built: record the precision it runs with (the accelerate config's when Kiln's is
    None), refuse an accumulation count that `accelerate launch` overrode, and align DeepSpeed with Kiln."""
    if training.mixed_precision is None:
        training.mixed_precision = str(accelerator.mixed_precision)
    if str(accelerator.mixed_precision) == "fp16" and accelerator.device.type == "cpu":
        # accelerate turns fp16 autocast off on a CPU: the run would be fp32 while its config and card say fp16
        raise ConfigError(
            "--training.mixed_precision fp16 is not applied on a CPU (accelerate runs it in fp32); use bf16, which "
            "is, or no (from --training.mixed_precision or the accelerate config / launch --mixed_precision)"
        )
    if accelerator.gradient_accumulation_steps != training.gradient_accumulation_steps:
        # accelerate reads ACCELERATE_GRADIENT_ACCUMULATION_STEPS (set by `accelerate launch` from a DeepSpeed
        # section's gradient_accumulation_steps or --gradient_accumulation_steps) over the value Kiln passes
        raise ConfigError(
            f"accelerate was launched with gradient_accumulation_steps {accelerator.gradient_accumulation_steps} but "
            f"--training.gradient_accumulation_steps is {training.gradient_accumulation_steps}; remove it from the "
            "accelerate config / launch command and set it with --training.gradient_accumulation_steps"
        )
    plugin = accelerator.state.deepspeed_plugin
    if plugin is not None:
        configure_deepspeed(plugin, training)


def resolve_batch_size(training: TrainingConfig, num_processes: int) -> None:
    """Derive the per-device batch size from total_train_batch_size, refusing a split that is not even."""
    total = training.total_train_batch_size
    if total is None:
        return
    parts = num_processes * training.gradient_accumulation_steps
    if total <= 0 or total % parts:
        raise ConfigError(
            f"--training.total_train_batch_size {total} does not divide evenly over {num_processes} process(es) x "
            f"{training.gradient_accumulation_steps} accumulation step(s); use a multiple of {parts}"
        )
    training.per_device_train_batch_size = total // parts


def start_run(
    training: TrainingConfig,
    logging_cfg: LoggingConfig,
    model_width: int | None = None,
    resumed_config: Mapping[str, Any] | None = None,
    elastic: str | None = None,
) -> Accelerator:
    """What every Kiln entry point does first: the precision (`kiln.precision`: bf16 by default on a CPU with bf16
    units for a model of `model_width` wide enough; a resumed run's, from its saved `resumed_config`), the
    Accelerator, the per-device batch size derived from total_train_batch_size, the engine aligned with Kiln's
    settings, the log format (main process at INFO), and the seed. `elastic`: the resume plan's note that the
    batch layout in `training` keeps a checkpoint's global batch on another number of processes (kiln.resume),
    logged, or refused under DeepSpeed."""
    from accelerate.utils import set_seed

    from .elastic import launched_processes
    from .precision import choose_precision, cpu_bf16_units, trains_on_cpu

    precision, precision_line, slow = choose_precision(
        training.mixed_precision, model_width, resumed_config, trains_on_cpu(), cpu_bf16_units()
    )
    if precision is not None:
        training.mixed_precision = precision
    accelerator = build_accelerator(training, logging_cfg)
    check_launch(accelerator, launched_processes())
    resolve_batch_size(training, accelerator.num_processes)
    align_engine(accelerator, training)
    refuse_elastic_deepspeed(accelerator, elastic)
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        level=logging.INFO if accelerator.is_main_process else logging.WARNING,
    )
    if elastic and accelerator.is_main_process:
        logger.warning(elastic)
    if precision_line and accelerator.is_main_process:
        (logger.warning if slow else logger.info)(precision_line)
    logging.getLogger("accelerate").setLevel(logging.WARNING)  # per-file checkpoint chatter
    # one INFO line per Hub request (a push made dozens); failures still show
    for chatty in ("httpx", "httpx2", "httpcore"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    quiet_tied_weight_warning()
    set_seed(training.seed)
    return accelerator


def refuse_elastic_deepspeed(accelerator: Accelerator, elastic: str | None) -> None:
    if elastic and accelerator.state.deepspeed_plugin is not None:
        raise ConfigError(
            f"{elastic}, but DeepSpeed's ZeRO checkpoints hold one optimizer partition per process and load only "
            "on the number of processes that wrote them; resume on that many processes, or train with DDP or FSDP"
        )


def use_downloaded_layout(accelerator: Accelerator, training: TrainingConfig, elastic: str | None) -> None:
    """A `hub:` checkpoint's plan, made once the run has started: its layout (already in `training`, the run's
    copy of the config) given to the Accelerator already built, refused under DeepSpeed, and logged."""
    if elastic is None:
        return
    refuse_elastic_deepspeed(accelerator, elastic)
    accelerator.gradient_accumulation_steps = training.gradient_accumulation_steps
    if accelerator.is_main_process:
        logger.warning(elastic)


def check_launch(accelerator: Accelerator, launched: int) -> None:
    """Refuse a launch of several processes that accelerate runs one by one, each alone (and each taking the
    output folder for its own): `--multi_gpu` on a machine where torch sees no GPU, without `--cpu`."""
    if launched <= 1 or accelerator.num_processes == launched:
        return
    if accelerator.device.type == "cpu":
        why = (
            "torch sees no GPU and ACCELERATE_USE_CPU is not set; on a machine without GPUs launch with --cpu "
            "(or set ACCELERATE_USE_CPU=1), on a GPU machine check that torch.cuda.is_available() is True"
        )
    else:
        why = "its distributed state was not initialised; check the launch command and the accelerate config"
    raise ConfigError(
        f"this process was launched as one of {launched} processes, but accelerate runs it as a run of "
        f"{accelerator.num_processes} on {accelerator.device}: {why}"
    )


class _TiedWeightsFilter(logging.Filter):
    """Drops accelerate's "Removed shared tensor {...} while saving" when every name is a tied output projection
    (`mlm_head.decoder.weight`, `lm_head.weight`) or an ELECTRA generator's embeddings (the discriminator's):
    safetensors stores shared weights once and loading re-ties them, so the warning came with every checkpoint
    and meant nothing. Any other shared tensor still warns."""

    TIED = ("mlm_head.decoder.weight", "lm_head.weight")
    SHARED = ("generator.model.embeddings.",)  # ELECTRA: the generator's embeddings are the discriminator's

    def filter(self, record: logging.LogRecord) -> bool:
        match = re.search(r"Removed shared tensor \{(.*?)\} while saving", record.getMessage())
        if match is None:
            return True
        names = [name.strip(" '\"") for name in match.group(1).split(",")]
        return not all(name.endswith(self.TIED) or name.startswith(self.SHARED) for name in names)


def quiet_tied_weight_warning() -> None:
    target = logging.getLogger("accelerate.utils.other")
    if not any(isinstance(f, _TiedWeightsFilter) for f in target.filters):
        target.addFilter(_TiedWeightsFilter())


def check_scheduler(training: TrainingConfig) -> None:
    from transformers.trainer_utils import SchedulerType

    names = [t.value for t in SchedulerType]
    if training.lr_scheduler_type not in names:
        raise ConfigError(
            f"--training.lr_scheduler_type {training.lr_scheduler_type!r} is unknown; use one of {', '.join(names)}"
        )


def prepare_output(config: Any, accelerator: Accelerator) -> Path:
    """The run folder `config.training.output_dir` with the resolved config.yaml in it.

    Everything that can be checked is checked before the folder is touched. Kiln writes a run only into a new or
    empty folder or one holding its record of the files it wrote (`kiln.run_folder`): any other folder is
    refused, naming what is in it. A run folder that holds a run (a checkpoint or a final model) is refused
    unless resuming or asked to overwrite (then the files on its record that still match it are removed, and
    nothing else; a run's own input inside it is a refusal). When resuming, the checkpoint's config is
    compared with this one before (`kiln.resume.check_plan`) and config.yaml is only rewritten once the resume
    has succeeded (Trainer.resume)."""
    from . import run_folder

    training = config.training
    check_scheduler(training)
    hub_cfg = getattr(config, "hub", None)
    if hub_cfg is not None and hub_cfg.push_to_hub:
        from .hub import check_push_settings

        check_push_settings(hub_cfg.model_id)
    out = Path(training.output_dir)
    resume = bool(training.resume_from_checkpoint)

    def refusal() -> str | None:
        return run_folder.refusal(out, resume=resume, overwrite=training.overwrite_output_dir)

    check_output_folder(training, accelerator, config)  # before anything is written there
    resolve_disk_layout(accelerator, training)  # several nodes: one shared folder, or one per node
    writer = writes_run_files(accelerator, training)
    # the lock, then the same look again under it (another run may have started there meanwhile)
    _agree(accelerator, (_take_lock(out) or refusal()) if writer else None)
    if writer:
        run_folder.claim(out, resume=resume, overwrite=training.overwrite_output_dir)
        if not resume or not (out / "config.yaml").is_file():
            save_config(config, out / "config.yaml")
            run_folder.record_files(out, "config.yaml")
    accelerator.wait_for_everyone()
    return out


def check_output_folder(training: TrainingConfig, accelerator: Accelerator, config: Any = None) -> None:
    """Refuse, on every process alike, an output folder a run may not start in (`kiln.run_folder`: files Kiln
    did not write, a run there and neither resume nor overwrite asked, an overwrite that would remove files Kiln
    did not write or one of the run's inputs, from `config`); reads only. Every node's local main process looks
    at its own folder (one shared folder, or one per node)."""
    from . import run_folder

    message = None
    if accelerator.is_local_main_process:
        out = Path(training.output_dir)
        resume, overwrite = bool(training.resume_from_checkpoint), training.overwrite_output_dir
        message = _busy(out) or run_folder.refusal(out, resume=resume, overwrite=overwrite)
        if message is None and overwrite and not resume and config is not None and out.is_dir():
            message = run_folder.inputs_refusal(config, out)
    _agree(accelerator, message)


_output_locks: dict[str, Any] = {}


PEER_REFUSAL_WAIT_S = 60.0
"""How long a process waits for the process that found a refusal to say it, before saying it itself."""


def _agree(accelerator: Accelerator, message: str | None) -> None:
    """Stop every process alike on a refusal one process found (`message`): that process raises it as a
    ConfigError, so the one-line error comes from the node it concerns, with its rank (`kiln.cli.run_cli`); the
    others end quietly once it has said so (`kiln.launcher.end_after_peer`; a process on another node says
    which one failed), or raise it themselves where no process can be told (no launcher's store)."""
    if accelerator.num_processes > 1:  # any node's refusal stops every process
        from accelerate.utils import gather_object

        from . import launcher

        found = next((m for m in gather_object([message]) if m is not None), None)
        if message is None and found is not None:
            who = launcher.wait_for_failure(PEER_REFUSAL_WAIT_S)
            if who is not None:
                launcher.end_after_peer(who)  # says, on another node, which process failed
            message = found
    if message is not None:
        raise ConfigError(message)


def _busy(out: Path) -> str | None:
    """`_take_lock`'s refusal when another process holds the lock on `out` now; creates nothing."""
    if str(out.resolve()) in _output_locks:
        return None
    try:
        import fcntl

        handle = os.fdopen(os.open(out / LOCK_FILE, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)))
    except (ImportError, OSError):  # not POSIX, or no lock file: nobody holds it
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _in_use(out, handle.read().strip() or "unknown")
        except OSError:
            return None
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def _in_use(out: Path, holder: str) -> str:
    return (
        f"output_dir {out} is in use by another run (PID {holder}); wait for it to end, stop it, or pick "
        "another --training.output_dir"
    )


def _take_lock(out: Path) -> str | None:
    """Refuse to start when another run is writing into `out` (the refusal, or None): the process that writes
    the run folder (rank 0 on a shared folder, each node's local main on node-local disks) holds an exclusive
    flock on out/.kiln.lock for the whole run (released by `release_output_lock`, or by the kernel when the
    process ends, so a lock left by a killed run never blocks)."""
    key = str(out.resolve())
    if key in _output_locks:  # this process already holds it (a run it started before, in-process)
        return None
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        return None
    out.mkdir(parents=True, exist_ok=True)
    try:
        handle = open_file(out / LOCK_FILE, "a+")  # never through a link there (kiln.safe_write)
    except ConfigError as err:
        return str(err)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        return _in_use(out, holder)
    except OSError:  # a file system without flock (some network mounts): run unguarded
        handle.close()
        return None
    import socket

    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    _output_locks[key] = handle
    return None


def release_output_lock(out: str | os.PathLike) -> None:
    """Let another run into `out` (the end of Trainer.train; a process that ends releases it anyway)."""
    handle = _output_locks.pop(str(Path(out).resolve()), None)
    if handle is not None:
        handle.close()  # closing the last descriptor releases the flock


__all__ = [
    "build_accelerator",
    "check_launch",
    "check_output_folder",
    "check_scheduler",
    "configure_deepspeed",
    "optimizer_steps_per_epoch",
    "prepare_output",
    "refuse_elastic_deepspeed",
    "release_output_lock",
    "resolve_batch_size",
    "start_run",
    "use_downloaded_layout",
]
