"""The shipped FSDP and DeepSpeed accelerate configs, read the way `accelerate launch` reads them.

accelerate falls back to CPU DDP under ACCELERATE_USE_CPU=1, so a CPU run proves nothing about these engines.
These tests take the environment accelerate's own launcher code builds from each shipped YAML, build the
FSDP / DeepSpeed plugin objects from it, and check what each engine would do with Kiln's models and settings:
FSDP2's wrap units resolve on both model families (and accelerate's FSDP2 preparation runs on a one-process
gloo world), DeepSpeed's accumulation, clipping, micro-batch and precision are Kiln's. DeepSpeed itself is not
installed for the tests (its PyPI release is a source distribution that builds against the installed torch):
the plugin and its `auto` filling are accelerate's own code and need no DeepSpeed; the real runs on a GPU are
in the README.
"""

import json
import os

import pytest
from kiln_testing import (
    DEEPSPEED_YAML,
    FSDP_YAML,
    launch_env,
    reset_accelerate,
    run_under_fsdp,
    tiny_decoder_config,
    tiny_encoder_config,
)


@pytest.fixture
def launched(monkeypatch):
    """Put the launch environment of an accelerate config into os.environ (undone after the test)."""
    for key in list(os.environ):
        if key.startswith(("ACCELERATE_", "FSDP_")):
            monkeypatch.delenv(key)

    def apply(config_file):
        env = launch_env(config_file)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        return env

    return apply


def _models():
    from pretrain.modeling import KilnDecoderForCausalLM, KilnEncoderForPreTraining

    return {
        "encoder": (KilnEncoderForPreTraining, tiny_encoder_config, "KilnEncoderLayer"),
        "decoder": (KilnDecoderForCausalLM, tiny_decoder_config, "KilnDecoderLayer"),
    }


# ----------------------------------------------------------------------------------------------------------
# FSDP


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_fsdp_config_wraps_one_block_per_unit_on_both_families(launched, kind):
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy

    env = launched(FSDP_YAML)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2"
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2
    cls, config, block = _models()[kind]
    model = cls(config())
    # what accelerate's FSDP2 preparation calls: raises for a listed class the model does not have
    plugin.set_auto_wrap_policy(model)
    policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
    wrapped = [name for name, module in model.named_modules() if policy(module)]
    assert {type(model.get_submodule(name)).__name__ for name in wrapped} == {block}
    assert len(wrapped) == model.config.num_hidden_layers


_FSDP2_SCRIPT = """\
import os, sys, types, json
import torch, torch.distributed as dist
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_prepare_model
from torch.distributed.fsdp import FSDPModule
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from transformers import AutoModelForCausalLM, AutoModelForPreTraining
sys.path.insert(0, "tests")
from kiln_testing import tiny_decoder_config, tiny_encoder_config
from kiln.export import save_model_files
from pretrain.modeling import KilnDecoderForCausalLM, KilnEncoderForPreTraining

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
out_root = sys.argv[1]
for cls, config, auto in [(KilnEncoderForPreTraining, tiny_encoder_config, AutoModelForPreTraining),
                          (KilnDecoderForCausalLM, tiny_decoder_config, AutoModelForCausalLM)]:
    torch.manual_seed(0)
    model = cls(config())
    ids = torch.randint(5, 250, (4, 16), generator=torch.Generator().manual_seed(1))
    if cls is KilnDecoderForCausalLM:
        batch = dict(input_ids=ids, labels=ids)
    else:  # the same number of MLM labels in every row, so the mean of the ranks' means is the batch mean
        labels = torch.full_like(ids, -100)
        labels[:, 2::5] = ids[:, 2::5]
        batch = dict(input_ids=ids, labels=labels, next_sentence_label=torch.tensor([0, 1, 1, 0]))
    ref_loss = model(**batch).loss
    ref_loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    plugin = FullyShardedDataParallelPlugin()  # from the shipped config's launch environment
    accelerator = types.SimpleNamespace(
        state=types.SimpleNamespace(fsdp_plugin=plugin), mixed_precision="no", is_main_process=rank == 0,
        device=torch.device("cpu"), torch_device_mesh=None, parallelism_config=None,
        get_state_dict=lambda m: get_model_state_dict(m, options=StateDictOptions(full_state_dict=True, cpu_offload=True)),
        unwrap_model=lambda m: m, wait_for_everyone=dist.barrier,
    )
    sharded = fsdp2_prepare_model(accelerator, model)
    units = sorted(type(m).__name__ for m in sharded.modules() if isinstance(m, FSDPModule))
    rows = slice(rank * 4 // world, (rank + 1) * 4 // world)
    loss = sharded(**{k: v[rows] for k, v in batch.items()}).loss
    loss.backward()
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    grads = {n: p.grad.full_tensor() for n, p in sharded.named_parameters()}
    assert set(grads) == set(ref_grads), set(grads) ^ set(ref_grads)
    worst = max(float((grads[n] - ref_grads[n]).abs().max()) for n in grads)
    folder = os.path.join(out_root, cls.__name__)
    save_model_files(accelerator, sharded, None, __import__("pathlib").Path(folder))
    if rank == 0:
        loaded = auto.from_pretrained(folder, trust_remote_code=True)
        loaded_loss = float(loaded(**batch).loss)
        print("RESULT", json.dumps(dict(name=cls.__name__, world=world, ref=float(ref_loss), sharded=float(mean_loss) / world,
              worst=worst, units=units, loaded=loaded_loss, loaded_class=type(loaded).__name__,
              files=sorted(os.listdir(folder)), auto_map=loaded.config.auto_map, arch=loaded.config.architectures)))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_fsdp2_on_two_processes_matches_one_and_saves_a_loadable_folder(tmp_path):
    """accelerate's own FSDP2 preparation with the shipped config, 2 gloo processes on CPU, half the batch each:
    the wrap units resolve on both families, the tied embeddings survive sharding, loss and gradients equal the
    unsharded model's on the whole batch, and Kiln's export writes a folder that loads with trust_remote_code
    (FSDP2 swaps the model's class for one made in torch's FSDP module)."""
    script = tmp_path / "fsdp2_cpu.py"
    script.write_text(_FSDP2_SCRIPT)
    done = run_under_fsdp(script, tmp_path / "saved")
    results = [
        json.loads(line.split("RESULT ", 1)[1]) for line in done.stdout.splitlines() if "RESULT " in line
    ]
    assert [r["name"] for r in results] == ["KilnEncoderForPreTraining", "KilnDecoderForCausalLM"]
    for r in results:
        assert r["world"] == 2
        assert r["sharded"] == pytest.approx(r["ref"], abs=1e-5), r["name"]
        assert r["worst"] < 1e-5, r["name"]
        block = "KilnEncoderLayer" if "Encoder" in r["name"] else "KilnDecoderLayer"
        assert r["units"].count("FSDP" + block) == 2, r["units"]  # one unit per block (2 layers)
        # the saved folder: Kiln's own code, not torch's FSDP files, and the same function
        modeling = "modeling_kiln_encoder" if "Encoder" in r["name"] else "modeling_kiln_decoder"
        assert f"{modeling}.py" in r["files"] and not any(f.startswith("_fsdp") for f in r["files"]), r[
            "files"
        ]
        assert all(v.startswith((modeling, "configuration_kiln")) for v in r["auto_map"].values()), r[
            "auto_map"
        ]
        assert r["loaded_class"] == r["name"] and r["arch"] == [r["name"]]
        assert r["loaded"] == pytest.approx(r["ref"], abs=1e-6)


# ----------------------------------------------------------------------------------------------------------
# DeepSpeed


def _accelerate_prepare_fill(plugin, accelerator_accumulation: int, num_processes: int = 1):
    """What Accelerator._prepare_deepspeed does to the config when Kiln prepares model + optimizer (no dataloader):
    fill `gradient_accumulation_steps` with the Accelerator's, every other `auto` with accelerate's defaults."""
    plugin.fill_match(
        "gradient_accumulation_steps", must_match=False, gradient_accumulation_steps=accelerator_accumulation
    )
    if plugin.is_auto("train_micro_batch_size_per_gpu"):
        raise ValueError("accelerate refuses a DeepSpeed prepare without a dataloader or a micro-batch size")
    micro = plugin.get_value("train_micro_batch_size_per_gpu")
    plugin.deepspeed_config_process(
        must_match=False,
        gradient_clipping=1.0,
        train_micro_batch_size_per_gpu=micro,
        train_batch_size=micro * plugin.get_value("gradient_accumulation_steps") * num_processes,
    )
    return plugin.deepspeed_config


def test_deepspeed_config_takes_kiln_accumulation_clipping_batch_and_precision(launched):
    from accelerate.utils import DeepSpeedPlugin

    from kiln.config import TrainingConfig
    from kiln.run_setup import configure_deepspeed

    env = launched(DEEPSPEED_YAML)
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true" and env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "2"
    # nothing that the Accelerator would read over Kiln's own arguments
    assert "ACCELERATE_GRADIENT_ACCUMULATION_STEPS" not in env and "ACCELERATE_GRADIENT_CLIPPING" not in env
    plugin = DeepSpeedPlugin()
    training = TrainingConfig(gradient_accumulation_steps=4, max_grad_norm=0.5, per_device_train_batch_size=8)
    configure_deepspeed(plugin, training)
    plugin.set_mixed_precision(env["ACCELERATE_MIXED_PRECISION"])  # as AcceleratorState does
    ds = _accelerate_prepare_fill(plugin, training.gradient_accumulation_steps, num_processes=2)
    assert ds["gradient_accumulation_steps"] == 4
    assert ds["gradient_clipping"] == 0.5  # accelerate alone would fill 1.0
    assert ds["train_micro_batch_size_per_gpu"] == 8
    assert ds["train_batch_size"] == 8 * 4 * 2
    assert ds["bf16"]["enabled"] is True and ds["fp16"]["enabled"] is False
    assert ds["zero_optimization"]["stage"] == 2


def test_deepspeed_clipping_off_in_kiln_is_off_in_deepspeed(launched):
    from accelerate.utils import DeepSpeedPlugin

    from kiln.config import TrainingConfig
    from kiln.run_setup import configure_deepspeed

    launched(DEEPSPEED_YAML)
    plugin = DeepSpeedPlugin()
    configure_deepspeed(plugin, TrainingConfig(max_grad_norm=0.0, per_device_train_batch_size=4))
    assert _accelerate_prepare_fill(plugin, 1)["gradient_clipping"] == 0.0


def test_deepspeed_values_that_would_override_kiln_are_refused(launched, tmp_path):
    """The config as it shipped before: accumulation 1 and clipping 1.0 written into the accelerate config."""
    from accelerate.utils import DeepSpeedPlugin

    from kiln.config import TrainingConfig
    from kiln.errors import ConfigError
    from kiln.run_setup import configure_deepspeed

    old = tmp_path / "deepspeed-old.yaml"
    old.write_text(
        DEEPSPEED_YAML.read_text().replace(
            "  zero_stage: 2\n",
            "  zero_stage: 2\n  gradient_accumulation_steps: 1\n  gradient_clipping: 1.0\n",
        )
    )
    env = launched(old)
    assert env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] == "1"
    with pytest.raises(
        ConfigError, match="gradient_accumulation_steps=1 but --training.gradient_accumulation_steps 4"
    ):
        configure_deepspeed(DeepSpeedPlugin(), TrainingConfig(gradient_accumulation_steps=4))
    with pytest.raises(ConfigError, match="gradient_clipping=1.0 but --training.max_grad_norm 0.25"):
        configure_deepspeed(DeepSpeedPlugin(), TrainingConfig(max_grad_norm=0.25))
    # values that agree with Kiln's are accepted as they are
    plugin = DeepSpeedPlugin()
    configure_deepspeed(plugin, TrainingConfig(gradient_accumulation_steps=1, max_grad_norm=1.0))
    assert plugin.deepspeed_config["gradient_accumulation_steps"] == 1


def test_accumulation_overridden_by_accelerate_launch_is_refused(monkeypatch, tmp_path):
    """`accelerate launch --gradient_accumulation_steps N` (or the key in a DeepSpeed section) sets an environment
    variable the Accelerator reads over Kiln's argument; Kiln would count optimizer steps wrongly."""
    from kiln.config import LoggingConfig, TrainingConfig
    from kiln.errors import ConfigError
    from kiln.run_setup import start_run

    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "1")
    reset_accelerate()
    try:
        training = TrainingConfig(gradient_accumulation_steps=4, output_dir=str(tmp_path))
        with pytest.raises(ConfigError, match="launched with gradient_accumulation_steps 1"):
            start_run(training, LoggingConfig())
    finally:
        reset_accelerate()


# ----------------------------------------------------------------------------------------------------------
# precision


@pytest.mark.parametrize(
    ("launched_with", "kiln", "expected"),
    [("bf16", None, "bf16"), (None, None, "no"), ("bf16", "no", "no"), ("no", "bf16", "bf16")],
)
def test_mixed_precision_defers_to_accelerate_launch(monkeypatch, tmp_path, launched_with, kiln, expected):
    from kiln.config import LoggingConfig, TrainingConfig
    from kiln.run_setup import start_run

    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    if launched_with is not None:  # what `accelerate launch` sets from the config's mixed_precision
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", launched_with)
    reset_accelerate()
    try:
        training = TrainingConfig(mixed_precision=kiln, output_dir=str(tmp_path))
        accelerator = start_run(training, LoggingConfig())
        assert accelerator.mixed_precision == expected
        assert training.mixed_precision == expected  # recorded in config.yaml and the model card
    finally:
        reset_accelerate()


def test_default_mixed_precision_is_the_accelerate_configs():
    from kiln.config import TrainingConfig

    assert TrainingConfig().mixed_precision is None
