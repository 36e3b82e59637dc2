"""Training-step throughput of Kiln against transformers, same weights, same batch, same loss.

    python bench/throughput.py --preset encoder-l4 --json bench/results/encoder-l4.json
    python bench/throughput.py --preset decoder-l4 --ablate          # also time Kiln with each fast path off
    python bench/throughput.py --preset modernbert-tiny --preset modernbert-base --no-memory --json bench/results/modernbert.json
    python bench/throughput.py --preset llama-l4 --preset llama-125m --json bench/results/llama.json
    python bench/throughput.py --plot bench/results/*.json --png bench/results/throughput.png

For each preset the reference (BertForPreTraining, ModernBertForMaskedLM, GPT2LMHeadModel, or LlamaForCausalLM for
the decoder's `llama` preset) is built from one seed and converted to
Kiln with `pretrain.convert.from_transformers`, so both start from the same weights (the `modernbert` presets:
Kiln's encoder with the modernbert preset against transformers' ModernBERT, MLM at 30% masking, as transformers
ships it, dense logits; `--reference-sparse` turns on ModernBERT's own `sparse_prediction`). Their losses and gradient
norms are compared with dropout off, then warmed-up training steps (forward + backward + AdamW step, dropout
on) are timed alternately, Kiln then reference, reversing the order every round. The table gives median
tokens/s, the speed-up (median over rounds of the paired step-time ratio, which cancels slow drifts of machine
load) and peak memory per step:
- CUDA: torch.cuda.max_memory_allocated during the step, minus what other models hold, plus the model's
  parameters and optimizer state (`peak_mb`).
- CPU: `peak_mb` is the peak resident set size (VmHWM, reset before the step) of a fresh subprocess per model
  that runs one warm step, minus the RSS of the process before the model was built. `saved_mb` (both devices)
  is deterministic: parameters + gradients + optimizer state + the bytes autograd saves for backward.
MFU is printed where the device's peak FLOP/s is known (a table of NVIDIA GPUs, or --peak-tflops); the model
FLOPs are `count_flops_per_token` with the LM head counted at the masked share (encoder) or every token
(decoder), the same for both models. On a CPU the peak is measured in the same run: every round also times a
large square fp32 `torch.mm` (best of --matmul-repeats at the benchmark's thread count, `matmul_peak`), and
`mfu` is the median over rounds of the model's achieved FLOP/s divided by that round's matmul rate, so a
machine shared with other jobs slows both sides of the fraction alike (`mfu_best` divides the best step by the
best matmul of the whole run).

Runs unchanged on CUDA (`--bf16` for bf16 autocast). With `--compile`, Kiln's model is compiled with
torch.compile before the warm-up steps, so compile time stays out of the timed steps.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace

import torch
import transformers

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # python bench/throughput.py: import the repository's bench package
    sys.path.insert(0, REPO_ROOT)

from bench.machine import cpu_name  # noqa: E402
from pretrain.convert import from_transformers  # noqa: E402
from pretrain.modeling import count_flops_per_token  # noqa: E402
from pretrain.modeling.configuration_kiln import default_intermediate_size  # noqa: E402
from pretrain.run import PRETRAINING_FAST_PATHS  # noqa: E402

MASK_PROBABILITY = 0.15  # share of positions with an MLM label in the synthetic encoder batches
MODERNBERT_MASK_PROBABILITY = 0.3  # ModernBERT's recipe
NUM_BATCHES = 4  # distinct batches cycled through, so the number of masked positions varies as in training


@dataclass(frozen=True)
class Preset:
    # "encoder" (MLM + NSP vs BertForPreTraining), "modernbert" (MLM vs ModernBertForMaskedLM), "decoder" (CLM vs
    # GPT2LMHeadModel), "llama" (CLM vs LlamaForCausalLM, the decoder's llama preset)
    kind: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    batch_size: int
    seq_len: int
    rounds: int  # timed rounds (one step of each model per round)
    warmup: int = 2
    kv_heads: int | None = None  # llama: key/value heads (grouped-query attention)


PRESETS = {
    "encoder-l4": Preset("encoder", 4, 256, 4, 30522, 32, 128, rounds=9),
    "encoder-l12": Preset("encoder", 12, 768, 12, 30522, 32, 128, rounds=3, warmup=1),
    "decoder-l4": Preset("decoder", 4, 256, 4, 50257, 32, 128, rounds=7),
    # configs/pretrain/encoder-modern-tiny.yaml's shape; ModernBERT-base's (L22/H768/A12, its 50,368 vocabulary)
    "modernbert-tiny": Preset("modernbert", 4, 128, 2, 4096, 32, 128, rounds=5),
    "modernbert-base": Preset("modernbert", 22, 768, 12, 50368, 1, 256, rounds=2, warmup=1),
    "decoder-gpt2": Preset("decoder", 12, 768, 12, 50257, 8, 1024, rounds=2, warmup=1),
    "llama-l4": Preset("llama", 4, 256, 4, 32000, 32, 128, rounds=7, warmup=1, kv_heads=2),
    "llama-125m": Preset("llama", 12, 768, 12, 32000, 1, 512, rounds=3, warmup=1, kv_heads=4),
}

# NVIDIA dense peak FLOP/s as (bf16 tensor core, fp32), most specific name first
GPU_PEAK_FLOPS = [
    ("H100 PCIe", 756e12, 51e12),
    ("H100", 989e12, 67e12),
    ("H200", 989e12, 67e12),
    ("A100", 312e12, 19.5e12),
    ("L40S", 362e12, 91.6e12),
    ("L4", 121e12, 30.3e12),
    ("A10", 125e12, 31.2e12),
]


# ------------------------------------------------------------------------------------------------- variants
# Kiln with one fast path switched off, to measure what each one is worth (--ablate)
def _full_last_layer(model):
    model._sparse_positions = lambda *args: None  # the last block computes every position again


def _dense_mlm(model):
    model.config.sparse_prediction = False  # vocabulary logits at every position, as transformers does
    model.config.chunked_mlm_loss = False


def _plain_mlm_loss(model):
    model.config.chunked_mlm_loss = False  # (M, V) logits + F.cross_entropy


def _plain_lm_loss(model):
    model.config.chunked_lm_loss = False  # (B, T, V) logits + F.cross_entropy


def _python_gelu(model):
    for layer in model.model.layers:  # transformers' eight-op gelu_new instead of torch's fused tanh GELU
        layer.mlp.act = transformers.activations.ACT2FN["gelu_new"]


def _torch_dropout(model):
    for module in model.modules():  # torch's dropout mask (and SDPA) instead of the cheaper CPU mask
        if hasattr(module, "fast_cpu_mask"):
            module.fast_cpu_mask = False


ABLATIONS = {
    "encoder": {
        "kiln-full-last-layer": _full_last_layer,
        "kiln-dense-mlm": _dense_mlm,
        "kiln-plain-mlm-loss": _plain_mlm_loss,
        "kiln-torch-dropout": _torch_dropout,
    },
    "modernbert": {
        "kiln-full-last-layer": _full_last_layer,
        "kiln-dense-mlm": _dense_mlm,
        "kiln-plain-mlm-loss": _plain_mlm_loss,
    },
    "decoder": {
        "kiln-plain-lm-loss": _plain_lm_loss,
        "kiln-python-gelu": _python_gelu,
        "kiln-torch-dropout": _torch_dropout,
    },
    "llama": {"kiln-plain-lm-loss": _plain_lm_loss},
}


# ----------------------------------------------------------------------------------------------- the models
def padded(size: int, multiple: int) -> int:
    return -(-size // multiple) * multiple if multiple > 1 else size


def build_reference(
    preset: Preset, vocab_multiple: int, seed: int, device, sparse_reference: bool = False
) -> torch.nn.Module:
    torch.manual_seed(seed)
    vocab = padded(preset.vocab, vocab_multiple)
    if preset.kind == "modernbert":
        config = transformers.ModernBertConfig(
            vocab_size=vocab,
            hidden_size=preset.hidden,
            num_hidden_layers=preset.layers,
            num_attention_heads=preset.heads,
            intermediate_size=3 * preset.hidden // 2,  # ModernBERT-base's 1152 at 768
            max_position_embeddings=max(1024, preset.seq_len),
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            cls_token_id=1,
            sep_token_id=2,
            sparse_prediction=sparse_reference,
            attn_implementation="sdpa",
        )
        return transformers.ModernBertForMaskedLM(config).to(device).train()
    if preset.kind == "encoder":
        config = transformers.BertConfig(
            vocab_size=vocab,
            hidden_size=preset.hidden,
            num_hidden_layers=preset.layers,
            num_attention_heads=preset.heads,
            intermediate_size=4 * preset.hidden,
            max_position_embeddings=max(512, preset.seq_len),
        )
        model = transformers.BertForPreTraining(config)
    elif preset.kind == "llama":
        config = transformers.LlamaConfig(
            vocab_size=vocab,
            hidden_size=preset.hidden,
            intermediate_size=default_intermediate_size(preset.hidden, "glu"),
            num_hidden_layers=preset.layers,
            num_attention_heads=preset.heads,
            num_key_value_heads=preset.kv_heads or preset.heads,
            max_position_embeddings=max(1024, preset.seq_len),
            tie_word_embeddings=True,  # as GPT-2 and Kiln's default: the ~125M shape counts one matrix
            use_cache=False,  # a training step: LlamaModel would otherwise fill a key/value cache nobody reads
        )
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.GPT2Config(
            vocab_size=vocab,
            n_embd=preset.hidden,
            n_layer=preset.layers,
            n_head=preset.heads,
            n_positions=max(1024, preset.seq_len),
        )
        model = transformers.GPT2LMHeadModel(config)
    return model.to(device).train()


def build_kiln(reference: torch.nn.Module, variant: str, kind: str) -> torch.nn.Module:
    model = from_transformers(reference)  # same weights, device, train mode and attention kernel
    if kind in ("encoder", "modernbert"):
        # what pretraining uses (pretrain.run.PRETRAINING_FAST_PATHS; off by default: see the config)
        for name, value in PRETRAINING_FAST_PATHS.items():
            setattr(model.config, name, value)
    if variant != "kiln":
        ABLATIONS[kind][variant](model)
    return model


def make_batches(preset: Preset, vocab_size: int, seed: int, device) -> list[dict[str, torch.Tensor]]:
    """Full-length synthetic batches (no padding): MLM labels at ~15% of positions + NSP labels, or CLM."""
    generator = torch.Generator().manual_seed(seed)
    B, T = preset.batch_size, preset.seq_len
    batches = []
    for _ in range(NUM_BATCHES):
        input_ids = torch.randint(5, vocab_size, (B, T), generator=generator)
        batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
        if preset.kind == "modernbert":  # MLM only, no segments
            selected = torch.rand(B, T, generator=generator) < MODERNBERT_MASK_PROBABILITY
            selected[:, 0] = False
            batch["labels"] = input_ids.masked_fill(~selected, -100)
        elif preset.kind == "encoder":
            selected = torch.rand(B, T, generator=generator) < MASK_PROBABILITY
            selected[:, 0] = False  # [CLS]
            batch["labels"] = input_ids.masked_fill(~selected, -100)
            batch["token_type_ids"] = (torch.arange(T) >= T // 2).long().expand(B, T).clone()
            batch["next_sentence_label"] = torch.randint(0, 2, (B,), generator=generator)
        else:
            batch["labels"] = input_ids.clone()
        batches.append({key: value.to(device) for key, value in batch.items()})
    return batches


def make_optimizer(model: torch.nn.Module, implementation: str) -> torch.optim.Optimizer:
    flags = {"fused": {"fused": True}, "foreach": {"foreach": True}, "forloop": {"foreach": False}}
    return torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, **flags[implementation])


@contextlib.contextmanager
def dropout_off(*models):
    """Every dropout probability set to 0 (nn.Dropout modules, and Kiln's attention `dropout_p`)."""
    saved = []
    for model in models:
        for module in model.modules():
            attribute = "p" if isinstance(module, torch.nn.Dropout) else "dropout_p"
            if hasattr(module, attribute):
                saved.append((module, attribute, getattr(module, attribute)))
                setattr(module, attribute, 0.0)
    try:
        yield
    finally:
        for module, attribute, value in saved:
            setattr(module, attribute, value)


class StepRunner:
    """One model, its optimizer and the batches; `step()` runs one training step."""

    def __init__(self, name, model, batches, optimizer_impl, bf16, device):
        self.name, self.model, self.batches, self.device = name, model, batches, device
        self.optimizer = make_optimizer(model, optimizer_impl)
        self.call = model
        self.bf16 = bf16
        self.calls = 0
        self.times: list[float] = []
        self.cpu_times: list[float] = []
        self.peak_bytes: list[int] = []

    def autocast(self):
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def loss(self, batch):
        with self.autocast():
            return self.call(**batch).loss

    def step(self) -> None:
        batch = self.batches[self.calls % len(self.batches)]
        self.calls += 1
        self.loss(batch).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def timed_step(self) -> None:
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize()
            held = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        cpu_start, start = time.process_time(), time.perf_counter()
        self.step()
        if cuda:
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - start)
        self.cpu_times.append(time.process_time() - cpu_start)
        if cuda:  # this step's own peak: what the step allocated on top of everything held, + own state
            self.peak_bytes.append(torch.cuda.max_memory_allocated() - held + self.persistent_bytes())

    def persistent_bytes(self) -> int:
        params = sum(p.numel() * p.element_size() for p in self.model.parameters())
        state = sum(
            t.numel() * t.element_size()
            for s in self.optimizer.state.values()
            for t in s.values()
            if isinstance(t, torch.Tensor)
        )
        return params + state

    def saved_bytes_step(self) -> int:
        """Run one step counting params + grads + optimizer state + unique storages saved for backward.

        The step runs the eager model: torch.compile would try to trace the counting hook."""
        param_storages = {p.untyped_storage().data_ptr() for p in self.model.parameters()}
        saved: dict[int, int] = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in param_storages and storage.device.type != "meta":
                saved[storage.data_ptr()] = storage.nbytes()
            return tensor

        compiled, self.call = self.call, self.model
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                self.step()
        finally:
            self.call = compiled
        grads = sum(p.numel() * p.element_size() for p in self.model.parameters() if p.requires_grad)
        return self.persistent_bytes() + grads + sum(saved.values())


def check_same_function(reference: StepRunner, kiln: StepRunner, batch, atol: float) -> dict:
    """Loss and gradient norm of both models on one batch, dropout off (also exercises the training path)."""
    results = {}
    with dropout_off(reference.model, kiln.model):
        for runner in (reference, kiln):
            loss = runner.loss(batch)
            loss.backward()
            grad_norm = torch.nn.utils.get_total_norm(
                [p.grad for p in runner.model.parameters() if p.grad is not None]
            )
            runner.optimizer.zero_grad(set_to_none=True)
            results[runner.name] = (loss.item(), grad_norm.item())
    (ref_loss, ref_norm), (kiln_loss, kiln_norm) = results[reference.name], results[kiln.name]
    if not math.isclose(kiln_loss, ref_loss, rel_tol=atol, abs_tol=atol) or not math.isclose(
        kiln_norm, ref_norm, rel_tol=10 * atol
    ):
        raise SystemExit(
            f"{kiln.name} and the reference disagree: loss {kiln_loss:.6f} vs {ref_loss:.6f}, "
            f"gradient norm {kiln_norm:.6f} vs {ref_norm:.6f}; the models are not the same function."
        )
    return {
        "reference_loss": ref_loss,
        "kiln_loss": kiln_loss,
        "reference_grad_norm": ref_norm,
        "kiln_grad_norm": kiln_norm,
    }


# ------------------------------------------------------------------------------------------------ CPU memory
def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_probe(spec: dict) -> dict:
    """In a fresh process: peak RSS of one warm training step of one model (CPU peak memory)."""
    preset = Preset(**spec["preset"])
    device = torch.device("cpu")
    baseline = _rss_kib("VmRSS")
    reference = build_reference(
        preset, spec["vocab_multiple"], spec["seed"], device, spec["reference_sparse"]
    )
    if spec["model"] == "reference":
        model = reference
    else:
        model = build_kiln(reference, spec["model"], preset.kind)
        del reference
    gc.collect()
    if spec["compile"] and spec["model"] != "reference":
        model = torch.compile(model)
    batches = make_batches(preset, model.config.vocab_size, spec["seed"], device)
    runner = StepRunner(spec["model"], model, batches, spec["optimizer"], spec["bf16"], device)
    for _ in range(2):  # optimizer state allocated, allocator warm
        runner.step()
    gc.collect()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM (peak RSS) to the current RSS
    runner.step()
    return {"peak_rss_mb": (_rss_kib("VmHWM") - baseline) / 1024}


def cpu_peak_memory(name: str, preset: Preset, args) -> float | None:
    spec = {
        "preset": asdict(preset),
        "model": name,
        "vocab_multiple": args.vocab_multiple,
        "seed": args.seed,
        "optimizer": args.optimizer,
        "bf16": args.bf16,
        "compile": args.compile,
        "reference_sparse": args.reference_sparse,
    }
    command = [sys.executable, os.path.abspath(__file__), "--memory-probe", json.dumps(spec)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        print(f"memory probe for {name} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_mb"]


# ---------------------------------------------------------------------------------------------------- timing
class MatmulPeak:
    """The device's dense matmul rate, measured: `sample()` times a square (size x size) fp32 `torch.mm` a few
    times and keeps the best (2 * size^3 FLOPs each), at torch's current thread count."""

    def __init__(self, device, size: int = 2048, repeats: int = 3, dtype=torch.float32):
        generator = torch.Generator().manual_seed(0)
        self.a = torch.randn(size, size, generator=generator, dtype=dtype).to(device)
        self.b = torch.randn(size, size, generator=generator, dtype=dtype).to(device)
        self.out = torch.empty(size, size, dtype=dtype, device=device)
        self.size, self.repeats, self.device = size, repeats, device
        self.samples: list[float] = []  # FLOP/s, best of `repeats`, one per call of sample()
        self.cpu_samples: list[float] = []  # FLOP per CPU-second of this process, best of `repeats`

    def sample(self) -> float:
        best = best_cpu = math.inf
        for _ in range(self.repeats):
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            cpu_start, start = time.process_time(), time.perf_counter()
            torch.mm(self.a, self.b, out=self.out)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
            best_cpu = min(best_cpu, max(time.process_time() - cpu_start, 1e-9))
        self.samples.append(2 * self.size**3 / best)
        self.cpu_samples.append(2 * self.size**3 / best_cpu)
        return self.samples[-1]


def peak_flops(device, bf16: bool, override_tflops: float | None) -> float | None:
    if override_tflops:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, bf16_peak, fp32_peak in GPU_PEAK_FLOPS:
        if key in name:
            return bf16_peak if bf16 else fp32_peak
    return None


def machine_info(device) -> dict:
    info = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "cpu": cpu_name(),
    }
    return info


# --------------------------------------------------------------------------------------------------- profile
# torch.profiler op name -> where the time goes (self CPU time of the op; anything not listed is "other")
OP_CATEGORIES = [
    ("attention (SDPA kernels)", ("scaled_dot_product", "_flash_attention", "_efficient_attention")),
    ("softmax", ("softmax",)),
    ("layer norm", ("layer_norm",)),
    ("GELU", ("gelu",)),
    ("dropout / random masks", ("bernoulli", "dropout", "random_", "uniform_", "bitwise", "rand")),
    (
        "matmul (linear layers, LM head)",
        (
            "aten::mm",
            "aten::addmm",
            "aten::bmm",
            "aten::baddbmm",
            "aten::matmul",
            "aten::linear",
            "aten::_addmm_activation",
        ),
    ),
    ("loss (cross-entropy)", ("nll_loss", "log_softmax", "cross_entropy")),
    ("embedding", ("embedding",)),
    ("optimizer (AdamW)", ("_fused_adam", "_foreach_", "adamw")),
    (
        "copies / layout",
        (
            "aten::copy_",
            "aten::clone",
            "aten::contiguous",
            "aten::cat",
            "aten::index",
            "aten::masked",
            "aten::nonzero",
            "aten::where",
            "aten::fill_",
            "aten::zero_",
        ),
    ),
    (
        "elementwise (add, mul, ...)",
        (
            "aten::add",
            "aten::mul",
            "aten::div",
            "aten::sub",
            "aten::sum",
            "aten::tanh",
            "aten::pow",
            "aten::sqrt",
        ),
    ),
]
PHASES = ("forward", "backward", "optimizer")


def _category(op_name: str) -> str:
    for category, keys in OP_CATEGORIES:
        if any(key in op_name for key in keys):
            return category
    return "other"


def profile_step(runner: StepRunner) -> dict:
    """One training step under torch.profiler: wall time per phase, self CPU time per op category."""
    from torch.profiler import ProfilerActivity, profile, record_function

    batch = runner.batches[runner.calls % len(runner.batches)]
    runner.calls += 1
    phases = {}
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        with record_function("forward"):
            loss = runner.loss(batch)
        phases["forward"] = time.perf_counter() - start
        start = time.perf_counter()
        with record_function("backward"):
            loss.backward()
        phases["backward"] = time.perf_counter() - start
        start = time.perf_counter()
        with record_function("optimizer"):
            runner.optimizer.step()
            runner.optimizer.zero_grad(set_to_none=True)
        phases["optimizer"] = time.perf_counter() - start
    return {"phases_s": phases, **op_profile(prof)}


def op_profile(prof) -> dict:
    """A finished torch.profiler run's self CPU time per op category (`OP_CATEGORIES`) and its top 15 ops
    (also used by bench/padding.py --profile)."""
    categories: dict[str, float] = {}
    ops: dict[str, float] = {}
    for event in prof.key_averages():
        if event.key in PHASES or event.key.startswith(("ProfilerStep", "autograd::engine", "Optimizer.")):
            continue
        self_s = event.self_cpu_time_total / 1e6
        categories[_category(event.key)] = categories.get(_category(event.key), 0.0) + self_s
        ops[event.key] = self_s
    total = sum(categories.values())
    top = sorted(ops.items(), key=lambda item: -item[1])[:15]
    return {
        "categories_s": dict(sorted(categories.items(), key=lambda item: -item[1])),
        "categories_share": {k: v / total for k, v in sorted(categories.items(), key=lambda item: -item[1])},
        "top_ops_s": dict(top),
        "profiled_self_cpu_s": total,
    }


def print_profile(name: str, profiles: dict) -> None:
    for model, result in profiles.items():
        label = "transformers" if model == "reference" else model
        phases = ", ".join(f"{k} {v:.2f}s" for k, v in result["phases_s"].items())
        print(f"\n[{name}] profile of one step, {label}: {phases}")
        for category, share in result["categories_share"].items():
            print(f"  {category:<34} {100 * share:5.1f}%  ({result['categories_s'][category]:.2f}s self CPU)")
        print("  top ops: " + ", ".join(f"{op} {t:.2f}s" for op, t in list(result["top_ops_s"].items())[:8]))


def run_preset(name: str, preset: Preset, args, device) -> dict:
    reference = build_reference(preset, args.vocab_multiple, args.seed, device, args.reference_sparse)
    vocab_size = reference.config.vocab_size
    variants = ["kiln"] + (list(ABLATIONS[preset.kind]) if args.ablate else [])
    batches = make_batches(preset, vocab_size, args.seed, device)
    runners = {"reference": StepRunner("reference", reference, batches, args.optimizer, args.bf16, device)}
    for variant in variants:
        runners[variant] = StepRunner(
            variant, build_kiln(reference, variant, preset.kind), batches, args.optimizer, args.bf16, device
        )
    check = check_same_function(
        runners["reference"], runners["kiln"], batches[0], 2e-2 if args.bf16 else 1e-4
    )
    print(
        f"[{name}] same function: loss {check['kiln_loss']:.5f} (kiln) vs {check['reference_loss']:.5f}, "
        f"grad norm {check['kiln_grad_norm']:.5f} vs {check['reference_grad_norm']:.5f}",
        flush=True,
    )
    for variant in variants:
        if args.compile:
            runners[variant].call = torch.compile(runners[variant].model)
    if args.compile_reference:
        runners["reference"].call = torch.compile(reference)

    saved_mb = {}
    order = ["kiln", "reference"] + variants[1:]
    for runner_name in order:  # warm-up (compilation happens here), the first step also counts saved bytes
        runner = runners[runner_name]
        start = time.perf_counter()
        saved_mb[runner_name] = runner.saved_bytes_step() / 2**20
        # compiled: one step per distinct batch first, so (re)compilation for each shape stays out of the timing
        warm_steps = preset.warmup - 1 + (NUM_BATCHES if runner.call is not runner.model else 0)
        for _ in range(warm_steps):
            runner.step()
        print(f"[{name}] warm-up {runner_name}: {time.perf_counter() - start:.1f}s", flush=True)

    rounds = args.rounds or preset.rounds
    matmul = MatmulPeak(device, args.matmul_size, args.matmul_repeats) if args.matmul_repeats else None
    if matmul:
        matmul.sample()  # warm-up (thread pool, pages); not used
        matmul.samples.clear()
        matmul.cpu_samples.clear()
    load = [os.getloadavg()[0]]
    for index in range(rounds):
        for runner_name in order if index % 2 == 0 else order[::-1]:
            runners[runner_name].timed_step()
        if matmul:
            matmul.sample()
        load.append(os.getloadavg()[0])
        times = "  ".join(f"{n} {runners[n].times[-1]:.2f}s" for n in order)
        peak_note = f"  matmul {matmul.samples[-1] / 1e9:.1f} GFLOP/s" if matmul else ""
        print(f"[{name}] round {index + 1}/{rounds}: {times}{peak_note}  (load {load[-1]:.2f})", flush=True)

    profiles = None
    if args.profile:  # one more step per model, under torch.profiler (not part of the timing)
        profiles = {runner_name: profile_step(runners[runner_name]) for runner_name in order}
        print_profile(name, profiles)

    tokens = preset.batch_size * preset.seq_len
    lm_share = {"encoder": MASK_PROBABILITY, "modernbert": MODERNBERT_MASK_PROBABILITY}.get(preset.kind, 1.0)
    kiln_config = runners["kiln"].model.config
    flops_per_token = count_flops_per_token(kiln_config, preset.seq_len, lm_head_fraction=lm_share)
    peak = peak_flops(device, args.bf16, args.peak_tflops)
    measured = matmul.samples if matmul else []
    measured_for_mfu = None  # per-round matmul rates MFU divides by, when the peak is the measured one
    if peak is None and measured and device.type == "cpu" and not args.bf16:
        measured_for_mfu = measured
        peak = max(measured)
        peak_source = f"measured: fp32 torch.mm {args.matmul_size}^2, best of {args.matmul_repeats} per round"
    else:
        peak_source = "--peak-tflops" if args.peak_tflops else ("GPU table" if peak else None)
    reference_times = runners["reference"].times
    models = {}
    for runner_name in order:
        runner = runners[runner_name]
        median_time = statistics.median(runner.times)
        result = {
            "step_times_s": runner.times,
            "cpu_times_s": runner.cpu_times,
            "median_step_s": median_time,
            "tokens_per_s": tokens / median_time,
            "best_tokens_per_s": tokens / min(runner.times),
            "model_tflops_per_s": tokens / median_time * flops_per_token / 1e12,
            "mfu": tokens / median_time * flops_per_token / peak if peak else None,
            "mfu_best": tokens / min(runner.times) * flops_per_token / peak if peak else None,
            "saved_mb": saved_mb[runner_name],
            "peak_mb": max(runner.peak_bytes) / 2**20 if runner.peak_bytes else None,
        }
        if runner_name != "reference":
            paired = [r / k for r, k in zip(reference_times, runner.times)]
            result["speedup"] = statistics.median(paired)  # median of the paired per-round ratios
            result["speedup_min"] = min(paired)
            result["speedup_max"] = max(paired)
            result["speedup_best_times"] = min(reference_times) / min(runner.times)
            result["speedup_cpu_time"] = statistics.median(
                runners["reference"].cpu_times
            ) / statistics.median(runner.cpu_times)
        if measured_for_mfu:  # per round: achieved FLOP/s over that round's matmul rate, median
            per_round = [tokens * flops_per_token / t / p for t, p in zip(runner.times, measured_for_mfu)]
            result["mfu"] = statistics.median(per_round)
            result["mfu_rounds"] = per_round
            # the same fraction in CPU time: FLOPs per CPU-second of the step over those of the matmul. On a
            # machine shared with other jobs, wall time counts the time other processes held the cores, CPU time
            # does not (idle-spinning worker threads still count, so this errs low)
            best_matmul_cpu = max(matmul.cpu_samples)
            result["mfu_cpu_time"] = statistics.median(
                tokens * flops_per_token / t / best_matmul_cpu for t in runner.cpu_times
            )
        models[runner_name] = result
    if device.type == "cpu" and not args.no_memory:
        del runners, reference  # the probes need the memory (the reference at GPT-2 small peaks at >15 GB)
        gc.collect()
        for runner_name in order:
            models[runner_name]["peak_mb"] = cpu_peak_memory(runner_name, preset, args)

    return {
        "preset": name,
        "shape": asdict(replace(preset, vocab=vocab_size, rounds=rounds)),
        "settings": {
            "optimizer": f"AdamW ({args.optimizer})",
            "bf16_autocast": args.bf16,
            "compile_kiln": args.compile,
            "compile_reference": args.compile_reference,
            "vocab_multiple": args.vocab_multiple,
            "seed": args.seed,
            "reference_sparse_prediction": args.reference_sparse,
            "peak_memory": "cuda max_memory_allocated per step"
            if device.type == "cuda"
            else "peak RSS of one warm step in a fresh subprocess (VmHWM reset before the step)",
        },
        "flops_per_token": flops_per_token,
        "peak_flops": peak,
        "peak_source": peak_source,
        "matmul_flops_per_round": measured,
        "matmul_flops_per_cpu_s": matmul.cpu_samples if matmul else [],
        "check": check,
        "profile": profiles,
        "load_average": load,
        "machine": machine_info(device),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "models": models,
    }


# ----------------------------------------------------------------------------------------------------- report
def shape_label(shape: dict) -> str:
    return (
        f"{shape['kind']} L{shape['layers']}/H{shape['hidden']}/A{shape['heads']} V{shape['vocab']} "
        f"{shape['batch_size']}x{shape['seq_len']}"
    )


def _mb(value) -> str:
    return f"{value:,.0f}" if value is not None else "-"


def print_table(results: list[dict]) -> None:
    header = (
        f"{'preset':<14} {'shape':<38} {'model':<22} {'tokens/s':>9} {'speedup':>16} "
        f"{'peak MB':>9} {'saved MB':>9} {'TFLOP/s':>8} {'MFU':>6}"
    )
    print(header)
    print("-" * len(header))
    for result in results:
        for name, model in result["models"].items():
            if name == "reference":
                speedup = "1.00"
            else:
                speedup = f"{model['speedup']:.2f} ({model['speedup_min']:.2f}-{model['speedup_max']:.2f})"
            mfu = f"{100 * model['mfu']:.1f}%" if model["mfu"] is not None else "-"
            label = "transformers" if name == "reference" else name
            print(
                f"{result['preset']:<14} {shape_label(result['shape']):<38} {label:<22} "
                f"{model['tokens_per_s']:>9,.0f} {speedup:>16} {_mb(model['peak_mb']):>9} "
                f"{_mb(model['saved_mb']):>9} {model['model_tflops_per_s']:>8.3f} {mfu:>6}"
            )
    loads = [value for result in results for value in result["load_average"]]
    machine = results[0]["machine"]
    print(
        f"\n{machine.get('cpu') or machine['device']} ({machine['device']}), {machine['threads']} threads, "
        f"torch {machine['torch']}, transformers {machine['transformers']}; "
        f"1-min load average during timing {min(loads):.2f}-{max(loads):.2f}"
    )
    print("speedup: median over rounds of reference step time / Kiln step time (min-max over rounds)")
    for result in results:
        if result.get("peak_source"):
            cpu_mfu = ", ".join(
                f"{'transformers' if n == 'reference' else n} {100 * m['mfu_cpu_time']:.1f}%"
                for n, m in result["models"].items()
                if m.get("mfu_cpu_time") is not None
            )
            if cpu_mfu:
                print(
                    f"MFU in CPU time [{result['preset']}] (FLOPs per CPU-second / the matmul's): {cpu_mfu}"
                )
            print(
                f"MFU [{result['preset']}]: model FLOP/s / peak {result['peak_flops'] / 1e12:.3f} TFLOP/s "
                f"({result['peak_source']}; per-round matmul rates "
                f"{', '.join(f'{p / 1e9:.0f}' for p in result.get('matmul_flops_per_round') or [])} GFLOP/s)"
            )


def plot(paths: list[str], png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = []
    for path in paths:
        with open(path) as file:
            data = json.load(file)
        results += data if isinstance(data, list) else [data]
    labels, kiln, reference, speedups = [], [], [], []
    for result in results:
        suffix = ""
        if result["settings"].get("vocab_multiple", 1) > 1:
            suffix = f"\nvocab padded to {result['settings']['vocab_multiple']}"
        if result["settings"].get("compile_kiln"):
            suffix += "\ncompiled"
        labels.append(f"{result['preset']}\n{shape_label(result['shape']).split(' ', 1)[1]}{suffix}")
        kiln.append(result["models"]["kiln"]["tokens_per_s"])
        reference.append(result["models"]["reference"]["tokens_per_s"])
        speedups.append(result["models"]["kiln"]["speedup"])
    figure, axis = plt.subplots(figsize=(max(6, 2.4 * len(labels)), 4.5))
    x = range(len(labels))
    width = 0.38
    axis.bar([i - width / 2 for i in x], reference, width, label="transformers", color="#9e9e9e")
    bars = axis.bar([i + width / 2 for i in x], kiln, width, label="Kiln", color="#d35400")
    for bar, speedup in zip(bars, speedups):
        axis.annotate(
            f"{speedup:.2f}x",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    axis.set_xticks(list(x), labels, fontsize=7)
    axis.set_ylabel("training tokens/s (median)")
    axis.set_yscale("log")
    machine = results[0]["machine"]
    axis.set_title(
        f"Training step throughput, {machine.get('cpu') or machine['device']}, {machine['threads']} threads",
        fontsize=10,
    )
    axis.legend()
    figure.tight_layout()
    figure.savefig(png, dpi=120)
    print(f"wrote {png}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--preset", action="append", choices=sorted(PRESETS), help="repeatable; default encoder-l4"
    )
    parser.add_argument("--rounds", type=int, help="timed rounds (default: the preset's)")
    parser.add_argument("--warmup", type=int, help="untimed steps per model first (default: the preset's)")
    parser.add_argument("--batch-size", type=int, help="override the preset's batch size")
    parser.add_argument("--seq-len", type=int, help="override the preset's sequence length")
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast for both models")
    parser.add_argument("--compile", action="store_true", help="torch.compile Kiln (compile time not timed)")
    parser.add_argument("--compile-reference", action="store_true", help="torch.compile the reference too")
    parser.add_argument(
        "--optimizer",
        choices=["fused", "foreach", "forloop"],
        default="fused",
        help="AdamW implementation for both models (fused: the HF Trainer default)",
    )
    parser.add_argument("--vocab-multiple", type=int, default=1, help="pad the vocabulary to a multiple (64)")
    parser.add_argument(
        "--reference-sparse",
        action="store_true",
        help="modernbert presets: ModernBertForMaskedLM with its sparse_prediction on (logits at masked tokens only)",
    )
    parser.add_argument(
        "--ablate", action="store_true", help="also time Kiln with each fast path switched off"
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the CPU peak-RSS subprocesses")
    parser.add_argument(
        "--peak-tflops", type=float, help="device peak TFLOP/s for MFU (known GPUs: automatic)"
    )
    parser.add_argument(
        "--matmul-size", type=int, default=2048, help="square fp32 matmul timed every round (the CPU peak)"
    )
    parser.add_argument(
        "--matmul-repeats", type=int, default=3, help="matmuls per round, best kept (0: do not measure)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after timing, profile one more step per model (torch.profiler)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--plot", nargs="+", metavar="JSON", help="bar chart from result files (with --png)")
    parser.add_argument("--png", default="bench/results/throughput.png")
    parser.add_argument("--memory-probe", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.memory_probe:
        print(json.dumps(memory_probe(json.loads(args.memory_probe))))
        return
    if args.plot:
        plot(args.plot, args.png)
        return
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch sees no GPU; use --device cpu.")
    if args.bf16 and device.type == "cpu":
        print(
            "note: bf16 autocast on a CPU without native bf16 matmuls is usually slower than fp32",
            file=sys.stderr,
        )
    results = []
    for name in args.preset or ["encoder-l4"]:
        preset = PRESETS[name]
        preset = replace(
            preset,
            batch_size=args.batch_size or preset.batch_size,
            seq_len=args.seq_len or preset.seq_len,
            warmup=args.warmup or preset.warmup,
        )
        results.append(run_preset(name, preset, args, device))
        gc.collect()
    print()
    print_table(results)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as file:
            json.dump(results if len(results) > 1 else results[0], file, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
