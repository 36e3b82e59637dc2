"""Nothing in a checkpoint is unpickled (kiln/checkpoint_state.py), and a damaged one is refused in one line.

A checkpoint is safetensors and JSON. Files that load by unpickling (`.pkl`, `.bin`, `.pt`, ...) planted in a real
checkpoint with valid checksums, each carrying a payload that writes a marker when unpickled, are refused in one
line, locally and on the test Hub, and the payload never runs; with the opt-in for one's own files the run resumes
from the plain-data files and still never unpickles them. A checkpoint in the pickled format (accelerate's
`custom_checkpoint_N.pkl`, `random_states_R.pkl`, `optimizer.bin`) resumes only with the opt-in. The cases run as
a user runs them, `accelerate launch` (or plain `python`) in a fresh process: every run that trains, and at least
one refusal of each kind per script; the other refusals go through the same command line in this process
(tests/test_trust.py's `run_in_process`: the same one line and exit status, without two interpreter starts).
"""

import json
import pickle
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from kiln_testing import DEBUG, losses
from test_trust import error_line, finish, launch, run_in_process

from kiln.checkpoint_files import find_checkpoints, write_checksums

RUN = [
    "--config",
    DEBUG,
    "--training.max_steps",
    4,
    "--training.eval_steps",
    0,
    "--training.save_steps",
    2,
    "--training.save_total_limit",
    0,
    "--logging.logging_steps",
    1,
]
TRUST = "--training.trust_checkpoint_pickles"


class Payload:
    """Unpickling it writes `marker` (what a published checkpoint's pickle could do: run any code)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('the checkpoint ran code')",))


# every name under which torch, accelerate, FSDP's distributed checkpoint or DeepSpeed keep pickles
PICKLE_NAMES = [
    "optimizer.bin",
    "scheduler.bin",
    "custom_checkpoint_0.pkl",
    "custom_checkpoint_1.pkl",
    "random_states_0.pkl",
    "pytorch_model.bin",
    "scaler.pt",
    "sampler.bin",
    "dl_state_dict.bin",
    "pytorch_model_fsdp_0/.metadata",
    "pytorch_model_fsdp_0/__0_0.distcp",
    "optimizer_0/.metadata",
    "pytorch_model/mp_rank_00_model_states.pt",
]


def plant(folder: Path, marker: Path, names=PICKLE_NAMES) -> None:
    """A payload in each of `names` (torch's zip format, or a bare pickle where torch's DCP uses one), then
    checksums.json regenerated, as anyone publishing a checkpoint can."""
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".metadata"):
            path.write_bytes(pickle.dumps(Payload(marker)))
        else:
            torch.save({"state": Payload(marker)}, path)
    write_checksums(folder)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A 4-step run that saved checkpoints at steps 2 and 4, launched as a user launches it: (run folder, its
    losses by step)."""
    out = tmp_path_factory.mktemp("reference") / "run"
    ((code, output),) = finish(launch("pretrain/run.py", *RUN, "--training.output_dir", out))
    assert code == 0, output[-3000:]
    return out, losses(out)


def step2_copy(reference, folder: Path) -> Path:
    shutil.copytree(find_checkpoints(reference[0])[0], folder)
    return folder


def resume_in_process(capsys, out: Path, spec, *extra) -> tuple[int, str]:
    """`resume` through the same command line in this process (a refusal whose fresh-process way another case
    proves)."""
    return run_in_process(
        capsys,
        "pretrain/run.py",
        *RUN,
        "--training.output_dir",
        out,
        "--training.resume_from_checkpoint",
        spec,
        *extra,
    )


def resume(out: Path, spec, *extra, env_extra=None) -> tuple[int, str]:
    ((code, output),) = finish(
        launch(
            "pretrain/run.py",
            *RUN,
            "--training.output_dir",
            out,
            "--training.resume_from_checkpoint",
            spec,
            *extra,
            env_extra=env_extra,
        )
    )
    return code, output


@pytest.mark.slow
def test_a_checkpoint_is_safetensors_and_json_only(reference):
    checkpoint = find_checkpoints(reference[0])[0]
    names = sorted(p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file())
    assert names == [
        "checksums.json",
        "data_fingerprint.json",
        "kiln_config.yaml",
        "loop_state.json",
        "model.safetensors",
        "optimizer.safetensors",
        "rng_state_0.safetensors",
        "trainer_state.json",
    ]
    for name in names:
        head = (checkpoint / name).read_bytes()[:4]
        assert not head.startswith((b"\x80", b"PK")), f"{name} is a pickle or a torch zip archive"


@pytest.mark.slow
def test_planted_pickles_are_refused_in_one_line_and_never_run(tmp_path, reference, hub, capsys):
    """Pickles planted under every name torch, accelerate, FSDP or DeepSpeed use, checksums regenerated: refused
    in one line naming them and the opt-in, and never unpickled, locally (through the command line in this
    process) and from the Hub (in a fresh process with a fresh Hugging Face cache, the refusal's fresh-process
    case); with the opt-in (launched) the run resumes from Kiln's own files and continues exactly."""
    from huggingface_hub import HfApi

    marker = tmp_path / "MARKER"
    planted = step2_copy(reference, tmp_path / "planted")
    plant(planted, marker)
    code, output = resume_in_process(capsys, tmp_path / "local", planted)
    assert not marker.exists(), "a checkpoint's pickle ran"
    assert code != 0, output[-3000:]
    line = error_line(output)
    assert line.startswith(
        f"error: checkpoint {planted} holds files loaded by unpickling (custom_checkpoint_0.pkl"
    )
    assert line.endswith(f"pass {TRUST}")

    # only the files earlier versions unpickled without restriction (weights_only=False), the others pure data
    only_pkl = step2_copy(reference, tmp_path / "only-pkl")
    plant(only_pkl, marker, ["custom_checkpoint_0.pkl", "custom_checkpoint_1.pkl"])
    code, output = resume_in_process(capsys, tmp_path / "local-pkl", only_pkl)
    assert not marker.exists(), "a checkpoint's pickle ran"
    assert code != 0, output[-3000:]
    assert error_line(output).startswith(f"error: checkpoint {only_pkl} holds files loaded by unpickling")

    # the same files on the Hub, resumed on a fresh machine
    hub.create_repo("stranger/state")
    HfApi().upload_folder(
        repo_id="stranger/state", folder_path=planted, path_in_repo="last-checkpoint", commit_message="state"
    )
    code, output = resume(
        tmp_path / "from-hub", "hub:stranger/state", env_extra={"HF_HOME": str(tmp_path / "hf")}
    )
    assert not marker.exists(), "a checkpoint's pickle ran"
    assert code != 0, output[-3000:]
    assert error_line(output).startswith(
        "error: checkpoint hub:stranger/state holds files loaded by unpickling"
    )

    # with the opt-in, Kiln's own files are read and the planted ones still never are: the run continues exactly
    code, output = resume(tmp_path / "trusted", planted, TRUST)
    assert not marker.exists(), "a checkpoint's pickle ran"
    assert code == 0, output[-3000:]
    again = losses(tmp_path / "trusted")
    assert sorted(again) == [3, 4] and all(again[s] == reference[1][s] for s in again)


def to_pickled_format(folder: Path) -> None:
    """Rewrite a checkpoint into the pickled format accelerate's `save_state` writes (what earlier Kiln versions
    saved): model.safetensors, optimizer.bin, custom_checkpoint_0.pkl (the schedule), custom_checkpoint_1.pkl
    (the counters), random_states_0.pkl."""
    import numpy as np
    from safetensors import safe_open

    loop = json.loads((folder / "loop_state.json").read_text())
    torch.save(loop["scheduler"], folder / "custom_checkpoint_0.pkl")
    torch.save(loop["counters"], folder / "custom_checkpoint_1.pkl")
    with safe_open(str(folder / "optimizer.safetensors"), "pt") as f:
        header = json.loads(f.metadata()["kiln_optimizer"])
        state = {int(k): dict(v) for k, v in header["state"].items()}
        for key in f.keys():
            param, name = key.split("/")
            state[int(param)][name] = f.get_tensor(key)
    groups = [{**g, "betas": tuple(g["betas"])} for g in header["param_groups"]]
    torch.save({"state": state, "param_groups": groups}, folder / "optimizer.bin")
    with safe_open(str(folder / "rng_state_0.safetensors"), "pt") as f:
        plain = json.loads(f.metadata()["kiln_random"])
        cpu = f.get_tensor("torch")
    version, internal, gauss = plain["python"]
    name, keys, pos, has_gauss, cached = plain["numpy"]
    torch.save(
        {
            "step": loop["accelerator_step"],
            "random_state": (version, tuple(internal), gauss),
            "numpy_random_seed": (name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached),
            "torch_manual_seed": cpu,
        },
        folder / "random_states_0.pkl",
    )
    for name in ("loop_state.json", "optimizer.safetensors", "rng_state_0.safetensors"):
        (folder / name).unlink()
    write_checksums(folder)


@pytest.mark.slow
def test_a_pickled_checkpoint_resumes_only_with_the_opt_in(tmp_path, reference, capsys):
    old = step2_copy(reference, tmp_path / "old")
    to_pickled_format(old)
    code, output = resume_in_process(
        capsys, tmp_path / "refused", old
    )  # planted pickles' refusal: a fresh process
    assert code != 0, output[-3000:]
    assert error_line(output) == (
        f"error: checkpoint {old} holds files loaded by unpickling (custom_checkpoint_0.pkl, "
        "custom_checkpoint_1.pkl, optimizer.bin, random_states_0.pkl), which can run any code; Kiln resumes from "
        "safetensors and JSON only. For a checkpoint you wrote yourself (an earlier Kiln version, DeepSpeed), "
        f"pass {TRUST}"
    )
    code, output = resume(tmp_path / "trusted", old, TRUST)
    assert code == 0, output[-3000:]
    again = losses(tmp_path / "trusted")
    assert sorted(again) == [3, 4] and all(again[s] == reference[1][s] for s in again)


# ----------------------------------------------------------------------------------------------------------
# FSDP2: the same files, gathered from the shards and spread back onto them

_FSDP2_SCRIPT = """\
import json, os, sys, types
import torch, torch.distributed as dist
from accelerate import DistributedType
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_prepare_model
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from transformers import get_scheduler
sys.path.insert(0, "tests")
from kiln_testing import tiny_encoder_config
from kiln.checkpoint_state import load_training_state, save_training_state
from kiln.train_state import TrainState
from pretrain.modeling import KilnEncoderForPreTraining

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
folder = sys.argv[1]
plugin = FullyShardedDataParallelPlugin()  # from the shipped config's launch environment


def build(seed):
    torch.manual_seed(seed)
    model = KilnEncoderForPreTraining(tiny_encoder_config(hidden_dropout_prob=0.1))
    accelerator = types.SimpleNamespace(
        state=types.SimpleNamespace(fsdp_plugin=plugin), mixed_precision="no", is_main_process=rank == 0,
        device=torch.device("cpu"), torch_device_mesh=None, parallelism_config=None,
        get_state_dict=lambda m: get_model_state_dict(m, options=StateDictOptions(full_state_dict=True, cpu_offload=True)),
        unwrap_model=lambda m: m, wait_for_everyone=dist.barrier, distributed_type=DistributedType.FSDP, step=0,
        scaler=None, process_index=rank,
    )
    model = fsdp2_prepare_model(accelerator, model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=1, num_training_steps=10)
    return accelerator, model, optimizer, scheduler


def train(model, optimizer, scheduler, step):
    ids = torch.randint(5, 250, (4, 16), generator=torch.Generator().manual_seed(step))
    labels = torch.full_like(ids, -100)
    labels[:, 2::5] = ids[:, 2::5]
    rows = slice(rank * 2, rank * 2 + 2)
    loss = model(input_ids=ids[rows], labels=labels[rows], next_sentence_label=torch.tensor([0, 1, 1, 0])[rows]).loss
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return float(loss)


accelerator, model, optimizer, scheduler = build(0)
state = TrainState()
for step in (1, 2):
    train(model, optimizer, scheduler, step)
state.global_step, accelerator.step = 2, 2
save_training_state(accelerator, model, optimizer, scheduler, state, folder, writer=rank == 0)
dist.barrier()
reference = [train(model, optimizer, scheduler, step) for step in (3, 4)]
reference_weights = {n: p.full_tensor() for n, p in model.named_parameters()}

accelerator2, model2, optimizer2, scheduler2 = build(1)
state2 = TrainState()
load_training_state(accelerator2, model2, optimizer2, scheduler2, state2, folder, 2, world)
again = [train(model2, optimizer2, scheduler2, step) for step in (3, 4)]
worst = max(float((p.full_tensor() - reference_weights[n]).abs().max()) for n, p in model2.named_parameters())
plain = set(KilnEncoderForPreTraining(tiny_encoder_config()).state_dict())
result = json.dumps(dict(rank=rank, reference=reference, again=again, worst=worst,
      step=state2.global_step, accelerator_step=accelerator2.step, lr=scheduler2.get_last_lr(),
      reference_lr=scheduler.get_last_lr(), same_keys=set(load_file(os.path.join(folder, "model.safetensors"))) == plain,
      files=sorted(os.listdir(folder))))
with open(os.path.join(sys.argv[2], f"result-{rank}.json"), "w") as fh:  # not the shared stdout pipe
    fh.write(result)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_fsdp2_state_round_trips_through_plain_files_on_two_processes(tmp_path):
    """accelerate's FSDP2 preparation with the shipped config, 2 gloo processes on CPU: the sharded weights and
    optimizer are gathered into the same safetensors files as without FSDP (the model's own names), and loaded
    into a differently initialised sharded model the next two steps are bit-identical, dropout included."""
    from kiln_testing import run_under_fsdp

    script = tmp_path / "fsdp2_state.py"
    script.write_text(_FSDP2_SCRIPT)
    done = run_under_fsdp(script, tmp_path / "state", tmp_path)
    results = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("result-*.json"))]
    assert sorted(r["rank"] for r in results) == [0, 1], done.stdout[-2000:] + done.stderr[-2000:]
    for r in results:
        assert r["again"] == r["reference"], r
        assert r["worst"] == 0.0
        assert r["step"] == 2 and r["accelerator_step"] == 2 and r["lr"] == r["reference_lr"]
        assert r["same_keys"]
        assert r["files"] == [
            "loop_state.json",
            "model.safetensors",
            "optimizer.safetensors",
            "rng_state_0.safetensors",
            "rng_state_1.safetensors",
        ]


# ----------------------------------------------------------------------------------------------------------
# damaged state files: one line, never skipped, never taken as step 0


@pytest.mark.slow
def test_damaged_state_files_are_one_line_errors(tmp_path, reference, capsys):
    """Each file damaged in a way its checksum no longer catches (checksums.json regenerated, or lost): the resume
    stops in one line naming the file, rather than going on with other random numbers or from step 0. The
    pickled case (the opt-in's) is launched in a fresh process, the others run through the same command line in
    this process meanwhile."""
    import subprocess

    marker = tmp_path / "MARKER"
    cases = {}

    def case(name, damage, *extra, fresh=False):
        folder = step2_copy(reference, tmp_path / name)
        damage(folder)
        write_checksums(folder)
        args = [
            *RUN,
            "--training.output_dir",
            tmp_path / f"{name}-run",
            "--training.resume_from_checkpoint",
            folder,
            *extra,
        ]
        cases[name] = (folder, launch("pretrain/run.py", *args) if fresh else args)

    def garbage_random_states(folder):
        (path,) = folder.glob("r*_state*_0.*")  # the first process's random states
        path.write_bytes(b"\x00" * 64 + path.read_bytes()[64:])

    def counters_at_step_0(folder):
        loop = json.loads((folder / "loop_state.json").read_text())
        loop["counters"]["global_step"] = 0
        (folder / "loop_state.json").write_text(json.dumps(loop))

    def loop_state_cut(folder):
        text = (folder / "loop_state.json").read_text()
        (folder / "loop_state.json").write_text(text[: len(text) // 2])

    def optimizer_not_safetensors(folder):
        torch.save({"state": {}, "param_groups": []}, folder / "optimizer.safetensors")

    def pickled_optimizer_with_an_object(folder):
        to_pickled_format(folder)
        torch.save({"state": Payload(marker)}, folder / "optimizer.bin")

    case("random", garbage_random_states)
    case("step0", counters_at_step_0)
    case("cut", loop_state_cut)
    case("optimizer", optimizer_not_safetensors)
    case("pickled", pickled_optimizer_with_an_object, TRUST, fresh=True)
    expected = {
        "random": "rng_state_0.safetensors is not a complete safetensors file",
        "step0": "loop_state.json: counters.global_step is 0 but the checkpoint's trainer_state.json says step 2",
        "cut": "loop_state.json is unreadable (JSONDecodeError)",
        "optimizer": "optimizer.safetensors is not a complete safetensors file",
        "pickled": "one of its pickled files (custom_checkpoint_0.pkl, custom_checkpoint_1.pkl, optimizer.bin, "
        "random_states_0.pkl) is not a plain tensor file (UnpicklingError)",
    }
    done = {
        name: run_in_process(capsys, "pretrain/run.py", *args)
        for name, (_, args) in cases.items()
        if isinstance(args, list)
    }
    for name, (folder, proc) in cases.items():
        if name not in done:
            try:
                done[name] = proc.wait(timeout=240), proc.stdout.read()
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
        code, output = done[name]
        assert code != 0, (name, output[-3000:])
        line = error_line(output)
        assert line.startswith(f"error: checkpoint {folder} is damaged: {expected[name]}"), (name, line)
        assert "Traceback (most recent call last)" not in output.split("error: ")[0], (name, output[-3000:])
    assert not marker.exists(), "a checkpoint's pickle ran"


# ----------------------------------------------------------------------------------------------------------
# model folders given to fine-tuning, conversion and ONNX export


@pytest.mark.slow
def test_weight_files_that_are_not_plain_tensors_or_truncated_are_one_line_errors(
    tmp_path, kiln_checkpoints, capsys
):
    """Fine-tuning, conversion and ONNX export, each given a folder whose weights are a pickle (in a fresh
    process, as users run them) and one whose weights are truncated (the same command lines in this process). The
    pickle is refused by the model gate before anything reads it (weights only in torch's pickle format); with
    convert's opt-in, `--trust_pickles`, torch's restricted unpickler refuses the objects it holds."""
    import subprocess
    import sys

    from kiln_testing import REPO
    from test_trust import classify_args

    encoder, _ = kiln_checkpoints
    marker = tmp_path / "MARKER"
    pickled = tmp_path / "pickled"
    shutil.copytree(encoder, pickled)
    (pickled / "model.safetensors").unlink()
    torch.save({"bert.embeddings.word_embeddings.weight": Payload(marker)}, pickled / "pytorch_model.bin")
    truncated = tmp_path / "truncated"
    shutil.copytree(encoder, truncated)
    weights = (truncated / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(weights[: len(weights) // 2])

    env = {**__import__("os").environ, "PYTHONPATH": str(REPO)}
    procs = {
        ("pickled", "classify"): launch(
            "finetune/classify.py", *classify_args(tmp_path, pickled, "f-pickled")
        )
    }
    for module, opt_in in (
        ("pretrain.convert", []),
        ("pretrain.export_onnx", []),
        ("pretrain.convert --trust_pickles", ["--trust_pickles"]),
    ):
        procs[("pickled", module)] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                module.split()[0],
                str(pickled),
                str(tmp_path / f"{module}-pickled"),
                *opt_in,
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    done = {
        ("truncated", "classify"): run_in_process(
            capsys, "finetune/classify.py", *classify_args(tmp_path, truncated, "f-truncated")
        )
    }
    for module in ("pretrain.convert", "pretrain.export_onnx"):
        done[("truncated", module)] = run_in_process(
            capsys, module, truncated, tmp_path / f"{module}-truncated"
        )
    for key, proc in procs.items():
        done[key] = proc.wait(timeout=300), proc.stdout.read()
    for (name, command), (code, output) in done.items():
        assert code != 0, (name, command, output[-3000:])
        line = error_line(output)
        problem = (
            "its model.safetensors is damaged or truncated"
            if name == "truncated"
            else "its pytorch_model.bin is not a plain tensor file"
            if command.endswith("--trust_pickles")
            else "its weights are only in pytorch_model.bin, torch's pickle format, which Kiln does not unpickle"
        )
        option = "--model.checkpoint " if command == "classify" else ""
        assert line.startswith(f"error: {option}{tmp_path / name}: {problem}"), (command, line)
        # (accelerate launch adds its own traceback of the failed child after the line)
        assert "Traceback" not in output.split("error: ")[0], (command, output[-3000:])
    assert not marker.exists(), "a model file's pickle ran"


# ----------------------------------------------------------------------------------------------------------
# the optimizer state against the model, and every field of the loop state, before anything steps


def plain_python(script: str, *args) -> subprocess.Popen:
    """`python SCRIPT ARGS` from the repo root (no launcher), started (not waited for)."""
    import os
    import sys

    from kiln_testing import REPO

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, str(REPO / script), *map(str, args)],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_all(procs: dict) -> dict:
    """{name: (exit status, output)} of processes started side by side."""
    done = {}
    for name, proc in procs.items():
        try:
            done[name] = (proc.wait(timeout=600), proc.stdout.read())
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    return done


def resized_optimizer_state(source: Path, target: Path, size: int) -> Path:
    """`source` (an optimizer.safetensors of the debug config, hidden size 32) with every dimension of 32 made
    `size`: the moments' shapes of the same run at hidden size `size` (no other dimension of the debug model is
    32), its header (the parameter groups) unchanged, as such a run writes it."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(source), "pt") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    for key, tensor in tensors.items():
        for dim, length in enumerate(tensor.shape):
            if length == 32:
                tensor = tensor.index_select(dim, torch.arange(size) % 32)
        tensors[key] = tensor.contiguous()
    save_file(tensors, target, metadata=meta)
    return target


@pytest.fixture(scope="module")
def foreign_optimizers(reference, tmp_path_factory):
    """optimizer.safetensors of the same run at hidden size 16 and 48 (the reference's is 32): {size: file}. Made
    from the reference's (its moments resized), not by two more trainings: the check reads shapes only."""
    root = tmp_path_factory.mktemp("sizes")
    source = find_checkpoints(reference[0])[0] / "optimizer.safetensors"
    return {
        size: resized_optimizer_state(source, root / f"optimizer-{size}.safetensors", size)
        for size in (16, 48)
    }


def with_optimizer(folder: Path, optimizer: Path) -> Path:
    shutil.copy(optimizer, folder / "optimizer.safetensors")
    write_checksums(folder)
    return folder


def optimizer_line(size: int) -> str:
    return (
        f"optimizer.safetensors: the state of model.embeddings.word_embeddings.weight: exp_avg is torch.float32 "
        f"[512, {size}], the parameter is torch.float32 [512, 32]"
    )


@pytest.mark.slow
def test_an_optimizer_state_of_another_model_is_refused_before_any_step(
    tmp_path, reference, foreign_optimizers, hub, capsys
):
    """An optimizer.safetensors from a run with a smaller hidden size (the fused AdamW step would read and write
    past its tensors' ends) or a larger one (it would train on, wrong), with valid checksums: one line naming the
    file and the first parameter that does not match, through plain `python` (fresh), and through the same
    command line in this process, locally and from the Hub; with `latest` (`accelerate launch`), the newest
    checkpoint whose state fits is resumed instead, exactly."""
    from huggingface_hub import HfApi

    smaller = with_optimizer(step2_copy(reference, tmp_path / "smaller"), foreign_optimizers[16])
    larger = with_optimizer(step2_copy(reference, tmp_path / "larger"), foreign_optimizers[48])
    run_copy = tmp_path / "latest-run"
    shutil.copytree(reference[0], run_copy)
    with_optimizer(find_checkpoints(run_copy)[-1], foreign_optimizers[16])
    hub.create_repo("stranger/optimizer")
    HfApi().upload_folder(
        repo_id="stranger/optimizer",
        folder_path=larger,
        path_in_repo="last-checkpoint",
        commit_message="state",
    )
    resume_args = [*RUN, "--training.resume_from_checkpoint"]
    procs = {
        "larger": plain_python(
            "pretrain/run.py", *resume_args, larger, "--training.output_dir", tmp_path / "r2"
        ),
        "latest": launch("pretrain/run.py", *resume_args, "latest", "--training.output_dir", run_copy),
    }
    here = {  # (planted pickles on the Hub are refused in a fresh process with a fresh Hugging Face cache)
        "smaller": run_in_process(
            capsys, "pretrain/run.py", *resume_args, smaller, "--training.output_dir", tmp_path / "r1"
        ),
        "hub": run_in_process(
            capsys,
            "pretrain/run.py",
            *resume_args,
            "hub:stranger/optimizer",
            "--training.output_dir",
            tmp_path / "r3",
        ),
    }
    done = {**here, **wait_all(procs)}
    for name, folder, size in (
        ("smaller", smaller, 16),
        ("larger", larger, 48),
        ("hub", "hub:stranger/optimizer", 48),
    ):
        code, output = done[name]
        assert code != 0 and code > 0, (name, code, output[-3000:])  # an error, not a signal (SIGSEGV)
        assert error_line(output) == (
            f"error: checkpoint {folder} is damaged: {optimizer_line(size)}; resume from an older checkpoint "
            "(--training.resume_from_checkpoint latest picks the newest valid one)"
        ), name
        assert "Traceback (most recent call last)" not in output.split("error: ")[0], (name, output[-3000:])
    code, output = done["latest"]
    assert code == 0, output[-3000:]
    assert (
        f"skipping damaged checkpoint(s) step-00000004: {optimizer_line(16)}; resuming from step-00000002"
        in output
    )
    again = losses(run_copy)
    assert all(again[step] == reference[1][step] for step in (3, 4)), (again, reference[1])


def halve_optimizer_state(folder: Path) -> None:
    """Every moment of optimizer.safetensors cut to half its last dimension, as a run of half the hidden size
    writes them; checksums regenerated."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(folder / "optimizer.safetensors"), "pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    for key, tensor in tensors.items():
        if not key.endswith("/step"):
            tensors[key] = tensor[..., : tensor.shape[-1] // 2].contiguous()
    save_file(tensors, folder / "optimizer.safetensors", metadata=meta)
    write_checksums(folder)


@pytest.mark.slow
def test_fine_tuning_refuses_an_optimizer_state_of_another_model(tmp_path, kiln_checkpoints, capsys):
    """classify.py and adapt.py resumed from their own checkpoint whose optimizer state is that of a smaller
    model: one line naming the file and the parameter, before any step. classify.py trains with `accelerate
    launch` and is refused in this process, adapt.py trains in this process (meanwhile) and is refused in a fresh
    plain `python`: each script's run and refusal once as users run them."""
    import re

    from test_finetune_scripts import write_sentiment

    encoder, _ = kiln_checkpoints
    task = tmp_path / "task.yaml"
    files = write_sentiment(tmp_path, sizes=(16, 8, 8))
    task.write_text(
        f"data:\n  train_file: {files['train']}\n  validation_file: {files['validation']}\n"
        f"  test_file: {files['test']}\n  text_columns: [sentence]\n"
    )
    steps = ["--training.max_steps", 2, "--training.save_steps", 1, "--training.eval_steps", 0]
    commands = {  # (how the first run starts, how the resume starts, the script, its arguments)
        "classify": (
            launch,
            run_in_process,
            "finetune/classify.py",
            [
                "--model.checkpoint",
                encoder,
                "--training.output_dir",
                tmp_path / "classify",
                "--data.train_file",
                files["train"],
                "--data.validation_file",
                files["validation"],
                "--data.test_file",
                files["test"],
                "--training.per_device_train_batch_size",
                8,
                *steps,
            ],
        ),
        "adapt": (
            run_in_process,
            plain_python,
            "finetune/adapt.py",
            [
                "--task",
                "classify",
                "--task_config",
                task,
                "--model.init_from",
                encoder,
                "--training.output_dir",
                tmp_path / "adapt",
                "--data.max_seq_length",
                32,
                "--training.per_device_train_batch_size",
                4,
                *steps,
            ],
        ),
    }

    def start_all(which: int, extra=lambda name: []) -> dict:
        """Each script's run started the way `which` picks, the fresh processes first: {name: (exit status,
        output)} once all ended."""
        starts = {
            name: (entry[which], entry[2], [*entry[3], *extra(name)]) for name, entry in commands.items()
        }
        fresh = {
            name: start(script, *args)
            for name, (start, script, args) in starts.items()
            if start is not run_in_process
        }
        here = {
            name: run_in_process(capsys, script, *args)
            for name, (start, script, args) in starts.items()
            if start is run_in_process
        }
        return here | wait_all(fresh)

    for name, (code, output) in start_all(0).items():
        assert code == 0, (name, output[-3000:])
    checkpoints = {name: find_checkpoints(tmp_path / name)[0] for name in commands}
    for checkpoint in checkpoints.values():
        halve_optimizer_state(checkpoint)
    rows = {name: (tmp_path / name / "metrics.jsonl").read_text() for name in commands}
    done = start_all(1, lambda name: ["--training.resume_from_checkpoint", checkpoints[name]])
    for name, checkpoint in checkpoints.items():
        code, output = done[name]
        assert code > 0, (name, code, output[-3000:])
        line = error_line(output)
        assert re.fullmatch(
            rf"error: checkpoint {re.escape(str(checkpoint))} is damaged: optimizer\.safetensors: the state of \S+: "
            r"exp_avg is torch\.float32 \[\d+, 16\], the parameter is torch\.float32 \[\d+, 32\]; resume from an "
            r"older checkpoint \(.*\)",
            line,
        ), (name, line)
        assert "diverged" not in output and "train/loss" not in output, (name, output[-3000:])
        assert (tmp_path / name / "metrics.jsonl").read_text() == rows[name], name  # no step logged


def edit_state(folder: Path, counters=None, scheduler=None, lr=None) -> Path:
    """loop_state.json's counters and schedule changed (and trainer_state.json's step, and the optimizer's rates
    where `lr`, so that the files agree with each other), checksums regenerated: what anyone can publish."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    loop = json.loads((folder / "loop_state.json").read_text())
    loop["counters"].update(counters or {})
    loop["scheduler"].update(scheduler or {})
    (folder / "loop_state.json").write_text(json.dumps(loop))
    if counters and "global_step" in counters:
        trainer = json.loads((folder / "trainer_state.json").read_text())
        trainer["global_step"] = counters["global_step"]
        (folder / "trainer_state.json").write_text(json.dumps(trainer))
    if lr is not None:
        with safe_open(str(folder / "optimizer.safetensors"), "pt") as f:
            meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
        header = json.loads(meta["kiln_optimizer"])
        for group in header["param_groups"]:
            group["lr"] = lr
        meta["kiln_optimizer"] = json.dumps(header)
        save_file(tensors, folder / "optimizer.safetensors", metadata=meta)
    write_checksums(folder)
    return folder


@pytest.mark.slow
def test_a_loop_state_out_of_range_is_refused_in_one_line(tmp_path, reference, capsys):
    """loop_state.json with step 10**18 (trainer_state.json agreeing), a step past its folder's name, a NaN
    learning rate (the optimizer agreeing) or the string "NaN": one line each, naming the file and the field,
    through `accelerate launch` and plain `python` (fresh processes) and the same command line in this process;
    a refusal of `latest` names the folder it resolved to."""
    marker = tmp_path / "MARKER"
    cases = {
        "huge": (
            edit_state(step2_copy(reference, tmp_path / "huge"), counters={"global_step": 10**18}),
            "loop_state.json: counters.global_step is 1000000000000000000, beyond this run's 4 steps",
        ),
        "ahead": (
            edit_state(
                step2_copy(reference, tmp_path / "ahead" / "step-00000002"), counters={"global_step": 3}
            ),
            "loop_state.json: counters.global_step is 3 but the checkpoint's folder is named for step 2",
        ),
        "nan": (
            edit_state(
                step2_copy(reference, tmp_path / "nan"),
                scheduler={"_last_lr": [float("nan")] * 2},
                lr=float("nan"),
            ),
            "loop_state.json: scheduler._last_lr[0] is nan, not a finite number",
        ),
        "nan-string": (
            edit_state(step2_copy(reference, tmp_path / "nan-string"), scheduler={"_last_lr": ["NaN"] * 2}),
            'loop_state.json: scheduler._last_lr[0] is "NaN", not a finite number',
        ),
    }
    starts = {"huge": launch, "ahead": plain_python, "nan": run_in_process, "nan-string": run_in_process}
    args = {
        name: [
            *RUN,
            "--training.output_dir",
            tmp_path / f"run-{name}",
            "--training.resume_from_checkpoint",
            folder,
        ]
        for name, (folder, _) in cases.items()
    }
    procs = {
        name: start("pretrain/run.py", *args[name])
        for name, start in starts.items()
        if start is not run_in_process
    }
    run_copy = tmp_path / "pickled-latest"
    shutil.copytree(reference[0], run_copy)
    plant(find_checkpoints(run_copy)[-1], marker, ["custom_checkpoint_0.pkl"])
    done = {
        name: run_in_process(capsys, "pretrain/run.py", *args[name])
        for name, start in starts.items()
        if start is run_in_process
    }
    # planted pickles are refused in a fresh process (above); here the refusal names the folder `latest` picked
    done["latest"] = run_in_process(
        capsys,
        "pretrain/run.py",
        *RUN,
        "--training.output_dir",
        run_copy,
        "--training.resume_from_checkpoint",
        "latest",
    )
    done |= wait_all(procs)
    for name, (folder, message) in cases.items():
        code, output = done[name]
        assert code > 0, (name, code, output[-3000:])
        assert error_line(output).startswith(
            f"error: checkpoint {folder} is damaged: {message}; resume from"
        ), name
        assert "Traceback (most recent call last)" not in output.split("error: ")[0], (name, output[-3000:])
        assert "train/loss" not in output and not (tmp_path / f"run-{name}" / "final").exists(), name
        assert not (tmp_path / f"run-{name}" / "metrics.jsonl").exists(), name  # no step logged
    code, output = done["latest"]
    assert code > 0 and not marker.exists(), output[-3000:]
    assert error_line(output).startswith(
        f"error: checkpoint {run_copy / 'checkpoints' / 'step-00000004'} holds files loaded by unpickling"
    )
