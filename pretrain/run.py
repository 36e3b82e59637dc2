"""Pretrain a Kiln encoder (MLM + NSP/SOP) or decoder (causal LM).

accelerate launch pretrain/run.py                                   # the default tiny encoder run
accelerate launch pretrain/run.py --config configs/pretrain/decoder-tiny.yaml --training.lr 3e-4
"""

from __future__ import annotations

import os
import sys

if __package__ in (
    None,
    "",
):  # run as a script (accelerate launch pretrain/run.py): import the package, not siblings
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import dataclasses  # noqa: E402
import logging  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

from kiln.cli import run_cli  # noqa: E402
from kiln.config import build_config  # noqa: E402
from kiln.errors import ConfigError  # noqa: E402
from pretrain.config import RunConfig, model_options  # noqa: E402

logger = logging.getLogger("kiln")

DESCRIPTION = """Pretrain a BERT-like encoder (masked LM + next-sentence / sentence-order prediction) or a GPT-like
decoder (causal LM) from scratch: trains a tokenizer on the corpus (or reuses one), builds the examples, runs the
shared accelerate loop with evaluation, resumable checkpoints and tracking, then saves output_dir/final/
(safetensors, tokenizer, config, model card) and optionally pushes it to the Hugging Face Hub.
Guide: docs/pretraining.md."""

ENCODER_OBJECTIVES = ("mlm+nsp", "mlm+sop", "mlm", "electra")
DECODER_OBJECTIVES = ("clm", "clm+mntp")


def check_pieces(model) -> None:
    """The block preset and pieces: encoder options with known values (KilnEncoderConfig's own check, as a
    config error)."""
    from pretrain.modeling import KilnEncoderConfig
    from pretrain.modeling.configuration_kiln import DECODER_PRESETS

    named = [name for name in ENCODER_PIECE_FIELDS if getattr(model, name) is not None]
    if model.kind == "decoder":
        if named:
            raise ConfigError(f"--model.{named[0]} is an encoder option; remove it for --model.kind decoder")
        if model.preset not in (None, *DECODER_PRESETS):
            raise ConfigError(
                f"--model.preset {model.preset!r} is not a decoder preset; use one of {', '.join(DECODER_PRESETS)}"
            )
        return
    if model.num_key_value_heads is not None:
        raise ConfigError(
            "--model.num_key_value_heads is a decoder option; remove it for --model.kind encoder"
        )
    try:
        KilnEncoderConfig(**encoder_pieces(model))
    except ValueError as error:
        raise ConfigError(f"model: {error}") from None


ENCODER_PIECE_FIELDS = (  # the preset is both kinds' (each its own presets)
    "position_embedding_type",
    "norm_position",
    "mlp_type",
    "bias",
    "classifier_head",
    "local_attention",
    "global_attn_every_n_layers",
)


def validate(config: RunConfig) -> None:
    model = config.model
    if model.kind not in ("encoder", "decoder"):
        raise ConfigError(f"--model.kind must be 'encoder' or 'decoder', got {model.kind!r}")
    if model.kind == "decoder":
        if model.objective == "mlm+nsp":  # the field's default (the encoder's): the decoder's usual one
            model.objective = "clm"
        elif model.objective not in DECODER_OBJECTIVES:
            raise ConfigError(
                f"--model.objective for a decoder must be one of {DECODER_OBJECTIVES}, got {model.objective!r}"
            )
    elif model.objective not in ENCODER_OBJECTIVES:
        raise ConfigError(
            f"--model.objective for an encoder must be one of {ENCODER_OBJECTIVES}, got {model.objective!r}"
        )
    check_pieces(model)
    if model.num_attention_heads > 0 and model.hidden_size % model.num_attention_heads:
        raise ConfigError(
            f"--model.hidden_size {model.hidden_size} is not divisible by --model.num_attention_heads "
            f"{model.num_attention_heads}; pick a head count that divides it (e.g. {_divisor_near(model)})"
        )
    check_model_values(model)
    check_attention(model)
    if model.objective == "electra":
        validate_electra(model)
    if model.init_from and _looks_local(model.init_from) and not os.path.isdir(model.init_from):
        raise ConfigError(
            f"--model.init_from {model.init_from} is not a folder; point it at a checkpoint folder saved by Kiln "
            "(e.g. runs/encoder-tiny/final) or a Hub id (user/name)"
        )
    if model.init_from:
        check_init_from(model)
    if config.eval.blimp and model.objective == "electra":
        raise ConfigError(
            "eval.blimp scores sentences with a masked LM, and ELECTRA's discriminator has none; drop --eval.blimp "
            "and score its generator afterwards (python -m pretrain.zero_shot blimp --model OUTPUT/final/generator)"
        )
    if config.eval.blimp and config.eval.blimp_data != "hub":
        check_blimp_folder(config.eval.blimp_data)
    if not model.init_from and config.data.max_seq_length > model.max_position_embeddings:
        raise ConfigError(
            f"--data.max_seq_length={config.data.max_seq_length} exceeds --model.max_position_embeddings="
            f"{model.max_position_embeddings}: lower --data.max_seq_length or raise --model.max_position_embeddings"
        )


def check_model_values(model) -> None:
    """The model options as the config class checks its own values (`check_values`: the head count against the
    width, key-value heads against heads), one line before anything is written; each option's own range was
    checked from its declaration (kiln.option_range). A start checkpoint's shape is its own (checked against its
    weights when it is read)."""
    from pretrain.modeling import KilnDecoderConfig, KilnEncoderConfig

    if model.init_from:
        return
    try:
        shape = dict(
            hidden_size=model.hidden_size,
            num_hidden_layers=model.num_hidden_layers,
            num_attention_heads=model.num_attention_heads,
            intermediate_size=model.intermediate_size,
            max_position_embeddings=model.max_position_embeddings,
        )
        if model.kind == "encoder":
            segments = model.type_vocab_size
            config = KilnEncoderConfig(**shape, type_vocab_size=segments, **encoder_pieces(model))
        else:
            theta = {"rope_theta": model.rope_theta} if model.rope_theta is not None else {}
            heads = model.num_key_value_heads
            config = KilnDecoderConfig(**shape, preset=model.preset, num_key_value_heads=heads, **theta)
        config.check_values()
    except ValueError as error:
        raise ConfigError(f"model: {error}") from None


def check_attention(model) -> None:
    """--model.attn_implementation: a kernel Kiln's models run, and one this run can train with on the device it
    trains on (flex attention: CUDA, no attention dropout). A start checkpoint with code of its own that the user
    trusts runs its own kernels: not checked."""
    from kiln.model_files import carries_code, read_model_config
    from pretrain.modeling.configuration_kiln import check_attn_implementation

    start = None
    if model.init_from and (model.attn_implementation == "flex_attention" or model.trust_remote_code):
        try:
            start = read_model_config(model.init_from)
        except OSError:
            return  # check_init_from says why it cannot be read
        if model.trust_remote_code and carries_code(start):
            return
    try:
        dropout = attention_dropout(model, start)
        check_attn_implementation(model.attn_implementation, training_device(), dropout)
    except ValueError as error:
        raise ConfigError(f"model: {error}") from None


def training_device() -> str:
    """The device type a run started now trains on, as accelerate picks it: `cpu` when ACCELERATE_USE_CPU is set
    (`accelerate launch --cpu`) or torch sees no GPU."""
    import torch
    from accelerate.utils import parse_flag_from_env

    if parse_flag_from_env("ACCELERATE_USE_CPU"):
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    return "mps" if torch.backends.mps.is_available() else "cpu"


def attention_dropout(model, start: dict | None) -> float:
    """The attention dropout the run trains with: the start checkpoint's (`start`, its config.json), else the
    option, or its preset's where it is not given (`model_options`)."""
    if start is not None:
        for name in ("attention_probs_dropout_prob", "attn_pdrop", "attention_dropout"):
            if isinstance(start.get(name), (int, float)):
                return float(start[name])
        return 0.0
    return model_options(model)["attention_probs_dropout_prob"]


def check_prepared_sources(data, given: set[str]) -> None:
    """A run with data.prepared trains on the sources its manifest records: data named beside it on the command
    line (`given`: the options given there) would be ignored, so it is a one-line ConfigError when it is a Hub
    dataset or training or validation files other than those sources. A config file's data_files are what the
    corpus may have been prepared from with other files given (`prepare --config X --data.data_files ...`): not
    compared. Files given that this machine does not hold are not compared (it may have been prepared elsewhere)."""
    import glob
    import json
    from collections import Counter

    from kiln.config import resolve_path
    from kiln.public import public_file_names, public_name

    if not data.prepared:
        return
    where = f"--data.prepared {public_name(data.prepared)}"
    if data.dataset_name and "data.dataset_name" in given:
        raise ConfigError(
            f"--data.dataset_name {data.dataset_name} and {where} name two corpora; drop one (a prepared folder "
            "trains on the files it was prepared from)"
        )
    folder = Path(resolve_path(data.prepared))
    sources = None
    for name in ("manifest.json", "plan.json"):
        try:
            sources = json.loads((folder / name).read_text())["sources"]
            break
        except (OSError, ValueError, TypeError, KeyError):
            continue
    if not isinstance(sources, dict):
        return  # not a prepared folder: opening it says so
    flags = {
        "data.data_files": ("train", data.data_files),
        "data.validation_files": ("validation", data.validation_files),
    }
    for option, (split, patterns) in flags.items():
        if option not in given or not patterns:
            continue
        files: list[str] = []
        unmatched = False
        for pattern in patterns:
            matched = sorted(p for p in glob.glob(resolve_path(pattern), recursive=True) if os.path.isfile(p))
            unmatched |= not matched
            files += [p for p in matched if p not in files]
        recorded = sources.get(split) or []
        prepared = Counter(
            zip(
                public_file_names([os.path.basename(str(s.get("name"))) for s in recorded]),
                [s.get("bytes") for s in recorded],
            )
        )
        named = Counter(zip(public_file_names(files), [os.path.getsize(p) for p in files]))
        extra, missing = named - prepared, Counter() if unmatched else prepared - named
        if extra or missing:
            what = (
                f"{next(iter(extra))[0]} ({next(iter(extra))[1]:,} bytes) is not among its {split} sources"
                if extra
                else f"its {split} source {next(iter(missing))[0]} is not among them"
            )
            raise ConfigError(
                f"--{option} names other files than {where} was prepared from ({what}); drop --{option} (the run "
                "trains on the prepared sources) or prepare the corpus again from these files"
            )


def validate_electra(model) -> None:
    """The generator must be a model of its own: its head count divides its width (generator_size and
    discriminator_weight are in their declared ranges: kiln.option_range)."""
    from pretrain.modeling import electra_generator_shape

    hidden, heads, _ = electra_generator_shape(
        model.hidden_size, model.num_attention_heads, model.intermediate_size, model.generator_size
    )
    if hidden % heads:
        raise ConfigError(
            f"--model.generator_size {model.generator_size} gives a generator of hidden size {hidden} with {heads} "
            "attention heads, which do not divide it; pick a generator_size that keeps hidden_size * size "
            "divisible by num_attention_heads * size (e.g. 0.25 or 0.5)"
        )
    if model.init_from:
        raise ConfigError(
            "--model.init_from is not supported with --model.objective electra yet; start ELECTRA from random "
            "weights, or fine-tune its final/ folder (the discriminator) directly"
        )


def check_init_from(model) -> None:
    """model.init_from is a checkpoint of model.kind, decided from its config.json read as data: nothing it names
    is imported or run here (a non-Kiln checkpoint with code of its own is refused unless model.trust_remote_code).
    A transformers BERT / ELECTRA (encoder) or GPT-2 (decoder) checkpoint is converted to Kiln (`start_folder`)."""
    from kiln.model_files import carries_code, read_model_config
    from pretrain.convert import convert_first_advice, convertible
    from pretrain.model_gate import check_model_folder

    try:
        found = read_model_config(model.init_from)
    except OSError as err:  # not a folder with config.json, not a Hub repo, no network
        raise ConfigError(
            f"--model.init_from {model.init_from}: cannot load a checkpoint from it ({err}); point it at a "
            "checkpoint folder saved by Kiln (e.g. runs/encoder-tiny/final), a transformers BERT, ELECTRA or GPT-2 "
            "folder, or a Hub id (user/name)"
        ) from None
    expected_type = "kiln_encoder" if model.kind == "encoder" else "kiln_decoder"
    found_type = found.get("model_type")
    # the model gate (one converted on the way in passes it there: start_folder)
    if convertible(found) is None:
        check_model_folder(model.init_from, "--model.init_from", found)
    if (model.trust_remote_code and carries_code(found)) or found_type == expected_type:
        return
    kinds = {"kiln_encoder": ("a Kiln encoder", "encoder"), "kiln_decoder": ("a Kiln decoder", "decoder")}
    family = convertible(found)
    if family is not None:
        kinds[found_type] = (f"a transformers {family[0]} ({family[1]})", family[1])
    if found_type in kinds:
        what, kind = kinds[found_type]
        if kind == model.kind:
            start_folder(model)  # converted now: a checkpoint that cannot be is refused before the run starts
            return
        raise ConfigError(
            f"--model.init_from {model.init_from} is {what} checkpoint but --model.kind is {model.kind}; "
            f"set --model.kind {kind}"
        )
    starts = (
        "a Kiln encoder checkpoint or a transformers BERT or ELECTRA one (converted on the way in)"
        if model.kind == "encoder"
        else "a Kiln decoder checkpoint or a transformers GPT-2 one (converted on the way in)"
    )
    advice = convert_first_advice(found, model.init_from, "--model.init_from")
    if advice and model.kind == "encoder":
        raise ConfigError(advice)
    if carries_code(found):
        raise ConfigError(
            f"--model.init_from {model.init_from} is a {found_type} checkpoint with Python code of its own "
            f"(auto_map), which Kiln runs only with --model.trust_remote_code; point it at {starts}"
        )
    raise ConfigError(
        f"--model.init_from {model.init_from} is a {found_type} checkpoint, which Kiln cannot start "
        f"{'an encoder' if model.kind == 'encoder' else 'a decoder'} from; point it at {starts}"
    )


def start_folder(model) -> str:
    """Where build_model loads model.init_from from: the folder or Hub id itself, or for a transformers BERT /
    ELECTRA / GPT-2 checkpoint the Kiln folder converted from it (`pretrain.convert.converted_start`)."""
    from kiln.model_files import read_model_config
    from pretrain.convert import converted_start, convertible

    if convertible(read_model_config(model.init_from)) is None:  # Kiln's own, or code the user trusts
        return model.init_from
    return converted_start(model.init_from, "--model.init_from")


def _looks_local(spec: str) -> bool:
    """A path rather than a Hub id (`user/name`): absolute, relative with ./ or ../, or with more parts."""
    return os.path.isabs(spec) or spec.startswith((".", "~")) or spec.count("/") > 1 or os.path.exists(spec)


def _divisor_near(model) -> int:
    heads = [h for h in range(1, model.hidden_size + 1) if model.hidden_size % h == 0]
    return min(heads, key=lambda h: abs(h - model.num_attention_heads))


# Encoder fast paths pretraining turns on (off in the config by default, so the model classes keep transformers'
# output shapes; `save_model_files` writes them off again): MLM logits only at the masked positions, and a
# training-step loss that never holds them (pretraining never reads the training-step MLM logits)
PRETRAINING_FAST_PATHS = {"sparse_prediction": True, "chunked_mlm_loss": True}


def encoder_pieces(m) -> dict:
    """The encoder block's preset and the pieces the run sets (None: the preset's), as KilnEncoderConfig takes
    them; `model.bias` sets every bias the preset turns on or off together."""
    pieces = dict(
        position_embedding_type=m.position_embedding_type,
        norm_position=m.norm_position,
        mlp_type=m.mlp_type,
        classifier_head=m.classifier_head,
        local_attention=m.local_attention,
        global_attn_every_n_layers=m.global_attn_every_n_layers,
    )
    if m.bias is not None:
        pieces.update(attention_bias=m.bias, mlp_bias=m.bias, norm_bias=m.bias, classifier_bias=m.bias)
    return dict(
        preset=m.preset or "bert",
        **({"rope_theta": m.rope_theta} if m.rope_theta is not None else {}),
        local_rope_theta=m.local_rope_theta,
        **{name: value for name, value in pieces.items() if value is not None},
    )


def model_config_kwargs(config: RunConfig, vocab_size: int, tokenizer) -> dict:
    m = config.model
    common = dict(
        vocab_size=vocab_size,
        hidden_size=m.hidden_size,
        num_hidden_layers=m.num_hidden_layers,
        num_attention_heads=m.num_attention_heads,
        intermediate_size=m.intermediate_size,
        max_position_embeddings=m.max_position_embeddings,
        initializer_range=m.initializer_range,
        pad_token_id=tokenizer.pad_token_id,
    )
    options = model_options(m)  # each option given, else its preset's
    if m.kind == "encoder":
        return dict(
            common,
            **options,
            type_vocab_size=m.type_vocab_size,
            **encoder_pieces(m),
            **PRETRAINING_FAST_PATHS,
        )
    return dict(
        common,
        activation_function=options["hidden_act"],
        resid_pdrop=options["hidden_dropout_prob"],
        embd_pdrop=options["hidden_dropout_prob"],
        attn_pdrop=options["attention_probs_dropout_prob"],
        layer_norm_epsilon=options["layer_norm_eps"],
        bos_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        preset=m.preset,
        num_key_value_heads=m.num_key_value_heads,
        **({"rope_theta": m.rope_theta} if m.rope_theta is not None else {}),
        tie_word_embeddings=m.tie_word_embeddings,
    )


def build_model(config: RunConfig, tokenizer, vocab_size: int):
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForPreTraining

    from pretrain.convert import announce_conversions
    from pretrain.modeling import (
        KilnDecoderConfig,
        KilnDecoderForCausalLM,
        KilnEncoderConfig,
        KilnEncoderForElectraPreTraining,
        KilnEncoderForMaskedLM,
        KilnEncoderForPreTraining,
    )

    m = config.model
    if m.init_from:  # a checkpoint of model.kind (check_init_from)
        start = start_folder(m)
        if m.trust_remote_code and start == m.init_from:  # the user opted into the checkpoint's own code
            auto = AutoModelForCausalLM
            if m.kind == "encoder":
                auto = AutoModelForMaskedLM if m.objective == "mlm" else AutoModelForPreTraining
            model = auto.from_pretrained(
                m.init_from, attn_implementation=m.attn_implementation, trust_remote_code=True
            )
        else:
            kiln_class = KilnDecoderForCausalLM
            if m.kind == "encoder":
                kiln_class = KilnEncoderForMaskedLM if m.objective == "mlm" else KilnEncoderForPreTraining
            model = kiln_class.from_pretrained(start, attn_implementation=m.attn_implementation)
            announce_conversions()
        if m.kind == "encoder":
            for name, value in PRETRAINING_FAST_PATHS.items():
                setattr(model.config, name, value)
        if len(tokenizer) > model.config.vocab_size:
            raise ConfigError(
                f"the tokenizer has {len(tokenizer)} tokens but {m.init_from} has vocab_size "
                f"{model.config.vocab_size}; use the checkpoint's own tokenizer (--tokenizer.name_or_path {m.init_from})"
            )
        return model
    kwargs = model_config_kwargs(config, vocab_size, tokenizer)
    if m.objective == "electra":
        model_config = KilnEncoderConfig(
            **kwargs, generator_size=m.generator_size, discriminator_weight=m.discriminator_weight
        )
        model_config._attn_implementation = m.attn_implementation
        return KilnEncoderForElectraPreTraining(model_config)
    if m.kind == "encoder":
        model_config = KilnEncoderConfig(**kwargs)
        model_config._attn_implementation = m.attn_implementation
        # MLM alone: no pooler and NSP head, which would get no gradient (DDP refuses that on its second step)
        return (KilnEncoderForMaskedLM if m.objective == "mlm" else KilnEncoderForPreTraining)(model_config)
    model_config = KilnDecoderConfig(**kwargs)
    model_config._attn_implementation = m.attn_implementation
    return KilnDecoderForCausalLM(model_config)


def main(argv: list[str] | None = None):
    """Parse the config and hand the engine the run (kiln.job.run_job); returns the run's TrainState."""

    argv = list(sys.argv[1:] if argv is None else argv)
    config = build_config(RunConfig, argv, prog="accelerate launch pretrain/run.py", description=DESCRIPTION)
    check_prepared_sources(config.data, given_options(argv))
    return run_pretraining(config)


def given_options(argv: list[str]) -> set[str]:
    """The `section.key` options given on the command line (not by --config or the defaults)."""
    from kiln.config import _walk_fields, parse_overrides

    _, nested = parse_overrides(argv, {key for key, tp, _, _ in _walk_fields(RunConfig) if tp is bool})
    return {
        f"{section}.{key}" for section, values in nested.items() if isinstance(values, dict) for key in values
    }


def run_pretraining(config: RunConfig, card_summary: dict | None = None):
    """Check a parsed config and hand the engine the run; `card_summary`: more facts for the model card (what
    finetune/adapt.py adapted from and on)."""
    from kiln.job import TrainingJob, run_job

    validate(config)
    job = TrainingJob(
        config,
        build=lambda accelerator, run_config: build_run(run_config, accelerator, card_summary=card_summary),
        metadata={"model_kind": config.model.kind, "objective": config.model.objective},
        output_before_build=True,  # the tokenizer is trained into output_dir/tokenizer
        # a model drawn from this config has its width known now; one started from weights learns it at the build
        model_width=None if config.model.init_from else config.model.hidden_size,
    )
    return run_job(job).state


def build_run(config: RunConfig, accelerator, card_summary: dict | None = None):
    """The run's parts: tokenizer, model and examples (`build_inputs`), evaluation, FLOPs and the model card."""
    from kiln.export import ModelCardFacts
    from kiln.job import RunParts
    from pretrain.evaluation import evaluate_decoder, evaluate_encoder, with_blimp
    from pretrain.modeling import count_flops_per_token

    model_cfg, data_cfg = config.model, config.data
    tokenizer, model, data = build_inputs(config, accelerator, Path(config.training.output_dir))
    encoder, electra = model_cfg.kind == "encoder", model_cfg.objective == "electra"
    evaluator = evaluate_encoder if encoder else evaluate_decoder
    if config.eval.blimp:
        evaluator = with_blimp(evaluator, blimp_evaluation(config, tokenizer, model, accelerator))
    return RunParts(
        model=model,
        tokenizer=tokenizer,
        card=ModelCardFacts(
            model_kind=model_cfg.kind,
            objective=model_cfg.objective,
            datasets=card_datasets(data_cfg),
            usage=ELECTRA_USAGE if electra else None,
            summary={
                **({"initialised from": start_name(model_cfg.init_from)} if model_cfg.init_from else {}),
                **(card_summary or {}),
            },
        ),
        train_dataset=data.train_dataset,
        collator=data.collator,
        eval_dataset=data.eval_dataset,
        eval_collator=data.eval_collator,
        evaluator=evaluator,
        # the encoder's vocabulary projection runs only at the masked positions (sparse prediction)
        flops_per_token=electra_flops_per_token(model, data_cfg)
        if electra
        else count_flops_per_token(
            model.config,
            data_cfg.max_seq_length,
            lm_head_fraction=data_cfg.mlm_probability if encoder else 1.0,
        ),
        # ELECTRA: lambda on the discriminator's loss; its accuracy is logged beside the losses
        loss_weights={"rtd_loss": model_cfg.discriminator_weight, "rtd_accuracy": 0.0} if electra else None,
        num_workers=data_cfg.num_workers,
    )


def check_blimp_folder(source: str) -> None:
    """eval.blimp's folder holds BLiMP's files: said in one line before any tokenizer or data work."""
    from kiln.config import resolve_path
    from pretrain.zero_shot import ZeroShotError
    from pretrain.zero_shot.blimp import blimp_files

    try:
        blimp_files(resolve_path(source))
    except ZeroShotError as err:
        raise ConfigError(f"eval.blimp: {err} (eval.blimp_data {source})") from None


def blimp_evaluation(config: RunConfig, tokenizer, model, accelerator):
    """BLiMP's first eval.blimp pairs of each paradigm, tokenized once for the run's tokenizer."""
    from kiln.config import resolve_path
    from pretrain.zero_shot import BlimpEvaluation, ZeroShotError, read_blimp
    from pretrain.zero_shot.scoring import max_input_length

    source = config.eval.blimp_data
    try:
        pairs = read_blimp(None if source == "hub" else resolve_path(source), config.eval.blimp)
        evaluation = BlimpEvaluation(pairs, tokenizer, config.model.kind, max_length=max_input_length(model))
    except ZeroShotError as err:
        raise ConfigError(f"eval.blimp: {err} (eval.blimp_data {source})") from None
    if accelerator.is_main_process:
        paradigms = len({pair.paradigm for pair in pairs})
        logger.info(
            "BLiMP at every evaluation: %d pairs of %d paradigms from %s", len(pairs), paradigms, source
        )
    return evaluation


def build_inputs(config: RunConfig, accelerator, out):
    """The tokenizer (trained or reused), the model and the examples of a run."""
    from kiln.nodes import writes_run_files
    from kiln.run_folder import record_files, staged_run_folder
    from pretrain.data import build_pretraining_data, padded_vocab_size, prepare_tokenizer

    corpus = None
    if config.data.prepared:  # tokenizer and tokenized corpus from `python -m pretrain.data prepare`
        from pretrain.data.prepared import PreparedCorpus, build_prepared_data

        corpus = PreparedCorpus.open(config.data.prepared)
        corpus.check_run(config)
        corpus.verify(accelerator)
        tokenizer = corpus.load_tokenizer(config.data.max_seq_length)
    else:
        trained = not config.tokenizer.name_or_path and not (out / "tokenizer" / "tokenizer.json").is_file()
        tokenizer = prepare_tokenizer(
            config.tokenizer,
            config.data,
            config.model.kind,
            str(out / "tokenizer"),
            accelerator=accelerator,
            staged=lambda _: staged_run_folder(out, "tokenizer"),  # on the record; a user's file there kept
            objective=config.model.objective,
        )
        if trained and writes_run_files(accelerator, config.training):
            record_files(out, "tokenizer")  # on the run folder's record (each node's, on node-local disks)
    vocab_size = padded_vocab_size(tokenizer, config.tokenizer.pad_vocab_to_multiple_of)
    model = build_model(config, tokenizer, vocab_size)
    data_cfg = config.data
    if config.model.kind == "decoder" and data_cfg.document_masking and not masks_documents(model):
        if accelerator.is_main_process:
            logger.info(
                "data.document_masking: %s with attn_implementation %r cannot mask packed documents apart; its "
                "blocks attend across documents (use sdpa, eager or flex_attention)",
                type(model).__name__,
                model.config._attn_implementation,
            )
        data_cfg = dataclasses.replace(data_cfg, document_masking=False)
    build = build_pretraining_data if corpus is None else partial(build_prepared_data, corpus)
    data = build(
        data_cfg,
        tokenizer,
        config.model.kind,
        config.model.objective,
        seed=config.training.seed,
        max_position_embeddings=model.config.max_position_embeddings,
        accelerator=accelerator,
        vocab_size=model.config.vocab_size,
    )
    if accelerator.is_main_process:
        n_params = sum(p.numel() for p in model.parameters())
        logger.info("%s with %.2fM parameters, vocab %d", type(model).__name__, n_params / 1e6, vocab_size)
    return tokenizer, model, data


def masks_documents(model) -> bool:
    """Whether `model` attends within each packed document when given restarting position ids: Kiln's decoder
    with the kernels whose masks it builds or has transformers build (not code loaded with trust_remote_code,
    whose handling of position ids Kiln cannot know)."""
    from pretrain.modeling import KilnDecoderPreTrainedModel

    return isinstance(model, KilnDecoderPreTrainedModel) and model.config._attn_implementation in (
        "sdpa",
        "eager",
        "flex_attention",
    )


def electra_flops_per_token(model, data_cfg) -> float:
    """ELECTRA's step: the discriminator on every token (its one-logit head left out, like the pooler), the
    generator with its vocabulary projection at the masked positions."""
    from pretrain.modeling import count_flops_per_token

    seq_len, generator = data_cfg.max_seq_length, model.generator.config
    vocabulary_projection = 6 * generator.embedding_size * generator.vocab_size * data_cfg.mlm_probability
    return (
        count_flops_per_token(model.discriminator.config, seq_len)
        + count_flops_per_token(generator, seq_len)
        + vocabulary_projection
    )


ELECTRA_USAGE = """from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

# the discriminator: load it into any encoder head (AutoModelForSequenceClassification, ...) to fine-tune it
tokenizer = AutoTokenizer.from_pretrained("{repo}", trust_remote_code=True)
encoder = AutoModel.from_pretrained("{repo}", trust_remote_code=True)
# the generator that trained it, a small masked LM
generator = AutoModelForMaskedLM.from_pretrained("{repo}", subfolder="generator", trust_remote_code=True)"""


def start_name(init_from: str) -> str:
    """The start checkpoint as a model card may name it: a Hub id as it is, a local folder by its last parts
    (`encoder-tiny/final`: a bare `final` says nothing), never the folders above."""
    from kiln.public import is_local_path, public_name

    if not is_local_path(init_from):
        return init_from
    path = Path(init_from.rstrip("/"))
    return (
        f"{path.parent.name}/{path.name}"
        if path.name in ("final", "best") and path.parent.name
        else public_name(init_from)
    )


def card_datasets(data) -> list[str]:
    """The data named by the model card: the Hub dataset, a prepared corpus folder (the card lists the sources its
    manifest records), or the local training and validation files (kept out of its Hub metadata)."""
    if data.dataset_name:
        return [data.dataset_name]
    if data.prepared:
        return [data.prepared]
    return [*data.data_files, *(data.validation_files or [])]


def cli(argv: list[str] | None = None):
    def user_errors():
        from pretrain.data import DataError

        return (DataError,)

    return run_cli(main, argv, user_errors)


if __name__ == "__main__":
    cli()
