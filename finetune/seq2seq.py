"""Fine-tune an encoder-decoder made of a pretrained Kiln encoder and a pretrained Kiln decoder (cross-attention
newly initialised) for summarization or translation, as a `KilnEncoderDecoderModel` (transformers'
`EncoderDecoderModel` with Kiln's own config class, so the saved folder carries its code).

    accelerate launch finetune/seq2seq.py                               # SciTLDR sample: abstract -> TL;DR
    accelerate launch finetune/seq2seq.py --model.from_scratch          # same shapes, random weights
    accelerate launch finetune/seq2seq.py --config configs/finetune/seq2seq-multi30k.yaml
    accelerate launch finetune/seq2seq.py --predict --model.checkpoint runs/seq2seq-scitldr/final

The saved folder holds the model plus both tokenizers (encoder_tokenizer/, decoder_tokenizer/):

    from transformers import AutoModelForSeq2SeqLM
    from finetune.seq2seq import Seq2SeqTokenizers
    model = AutoModelForSeq2SeqLM.from_pretrained("runs/seq2seq-scitldr/final", trust_remote_code=True)
    tokenizers = Seq2SeqTokenizers.from_pretrained("runs/seq2seq-scitldr/final")
    inputs = tokenizers.encoder(["An abstract ..."], return_tensors="pt", return_token_type_ids=False)
    print(tokenizers.decoder.batch_decode(model.generate(**inputs), skip_special_tokens=True))
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script (accelerate launch finetune/seq2seq.py): import the packages
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

from finetune.common import (  # noqa: E402
    EvalConfig,
    check_best_metric,
    check_vocabulary,
    finetune_training,
    load_checkpoint_tokenizer,
    pop_flags,
    positions_limit,
    quiet_transformers,
    report_loading,
    report_truncation,
    resolve_start_model,
    run_finetune_cli,
)
from finetune.runner import FinetuneTask, Head, run_task  # noqa: E402
from kiln.config import HubConfig, LoggingConfig, TrainingConfig  # noqa: E402
from kiln.errors import ConfigError  # noqa: E402
from kiln.option_range import bounded  # noqa: E402
from pretrain.config import LONGEST  # noqa: E402

DESCRIPTION = """Fine-tune an encoder-decoder built from a pretrained Kiln encoder and a pretrained Kiln decoder
(local runs/.../final folders or Hub ids; the decoder's cross-attention is new), or the same shapes from
scratch (--model.from_scratch), on summarization (SciTLDR sample by default; ROUGE-1/2/L) or translation
(e.g. Multi30k en->de; sacreBLEU and chrF). Sources are tokenized with the encoder's tokenizer, targets with
the decoder's. Training uses teacher forcing; evaluation and --predict generate with greedy or beam search.
Keeps the best model, writes test-split predictions and output_dir/final (model + encoder_tokenizer/ +
decoder_tokenizer/, ready for `generate`), and can push it to the Hub. Guide: docs/finetuning.md."""

CARD_USAGE = """
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

model = AutoModelForSeq2SeqLM.from_pretrained("{repo}", trust_remote_code=True)  # the model code ships with it
source_tokenizer = AutoTokenizer.from_pretrained("{repo}", subfolder="encoder_tokenizer")
target_tokenizer = AutoTokenizer.from_pretrained("{repo}", subfolder="decoder_tokenizer")
inputs = source_tokenizer(["Your text ..."], return_tensors="pt", return_token_type_ids=False)
print(target_tokenizer.batch_decode(model.generate(**inputs), skip_special_tokens=True))
"""

TASK_METRICS = {
    "summarization": (["loss", "rouge1", "rouge2", "rougeL", "rougeLsum"], "rougeL"),
    "translation": (["loss", "bleu", "chrf", "brevity_penalty"], "bleu"),
}


@dataclass
class Seq2SeqModelConfig:
    encoder_checkpoint: str = "runs/encoder-tiny/final"
    """Kiln encoder checkpoint (local folder or Hub id): `runs/encoder-tiny/final` is written by `accelerate launch pretrain/run.py`."""
    decoder_checkpoint: str = "runs/decoder-tiny/final"
    """Kiln decoder checkpoint (local folder or Hub id): `runs/decoder-tiny/final` is written by `accelerate launch pretrain/run.py --config configs/pretrain/decoder-tiny.yaml`."""
    checkpoint: str | None = None
    """A fine-tuned Kiln seq2seq folder (or Hub id) to continue from, or to predict with (--predict); replaces encoder_checkpoint and decoder_checkpoint."""
    from_scratch: bool = False
    """Random weights with the shapes (and tokenizers) of encoder_checkpoint and decoder_checkpoint, to compare against pretraining."""
    revision: str | None = None
    """Hub revision (branch, tag or commit) of the checkpoints."""
    attn_implementation: str = "sdpa"
    """Attention kernel: `sdpa` (PyTorch fused) or `eager`."""

    @property
    def kind(self) -> str:  # read by the model card
        return "encoder-decoder"

    @property
    def objective(self) -> str:
        return "sequence-to-sequence cross-entropy (teacher forcing)"


@dataclass
class Seq2SeqDataConfig:
    task: str = "summarization"
    """`summarization` (scored with ROUGE) or `translation` (scored with sacreBLEU and chrF)."""
    dataset_name: str | None = None
    """Hub dataset (e.g. `allenai/scitldr`, `bentrevett/multi30k`) or a local dataset folder; when set, the *_file options are ignored."""
    dataset_config: str | None = None
    """Hub dataset configuration name."""
    dataset_revision: str | None = None
    """Hub dataset revision: a branch, tag or commit, or `refs/convert/parquet` for the Hub's Parquet export of a dataset that has only a loading script (which `datasets` no longer runs)."""
    train_file: str | None = "data/finetune/scitldr/train.jsonl.gz"
    """Training data: .json/.jsonl/.csv/.tsv/.parquet (.gz allowed) or, with source_lang/target_lang, parallel text files (`train.en` pairs with `train.de`); relative paths are also looked up from the repo root."""
    validation_file: str | None = "data/finetune/scitldr/dev.jsonl.gz"
    """Validation data; without it, validation_split_percentage of the training pairs are held out."""
    test_file: str | None = "data/finetune/scitldr/test.jsonl.gz"
    """Test data to predict after training (and with --predict)."""
    source_column: str = "source"
    """Column with the input text (a list of sentences is joined with spaces)."""
    target_column: str = "target"
    """Column with the output text (a list counts as several references; the first one is trained on)."""
    source_lang: str | None = None
    """Translation: source language code, for parallel text files or a `translation` column (e.g. `en`)."""
    target_lang: str | None = None
    """Translation: target language code (e.g. `de`)."""
    validation_split_percentage: float = bounded(10.0, 0, 100, high_open=True)
    """Percent of the training pairs held out for validation when there is no validation split."""
    max_source_length: int | None = bounded(None, 2, LONGEST)  # [CLS] and [SEP]
    """Source tokens, [CLS] and [SEP] included; None: the encoder's max_position_embeddings."""
    max_target_length: int | None = bounded(None, 1, LONGEST)
    """Target tokens trained on, end-of-text included; None: the decoder's max_position_embeddings."""
    truncation: str = "warn"
    """Longer sources and targets are truncated: `warn` says how many, `quiet` does not, `error` refuses them."""
    max_train_samples: int | None = bounded(None, low=1)
    """Use only the first N training pairs (quick runs)."""
    max_eval_samples: int | None = bounded(None, low=1)
    """Use only the first N validation pairs (each is generated at every evaluation)."""
    max_predict_samples: int | None = bounded(None, low=1)
    """Predict only the first N test pairs."""


@dataclass
class GenerationSettings:
    num_beams: int = bounded(1, 1, 1024)
    """Beams for evaluation and --predict (1: greedy decoding)."""
    max_new_tokens: int = bounded(64, 1, LONGEST)
    """Longest output in decoder tokens (capped by the decoder's max_position_embeddings - 1)."""
    length_penalty: float = bounded(1.0)  # any finite exponent (< 0 favours shorter outputs)
    """Beam search: exponent on the length that divides the score (> 1 favours longer outputs)."""
    no_repeat_ngram_size: int = bounded(3, 0, LONGEST)
    """Never repeat an n-gram of this size in one output (0: allow repeats)."""


@dataclass
class Seq2SeqConfig:
    model: Seq2SeqModelConfig = field(default_factory=Seq2SeqModelConfig)
    data: Seq2SeqDataConfig = field(default_factory=Seq2SeqDataConfig)
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    eval: EvalConfig = field(default_factory=EvalConfig)
    training: TrainingConfig = field(
        default_factory=lambda: finetune_training(
            "runs/seq2seq-scitldr", num_train_epochs=10.0, lr=5e-4, per_device_train_batch_size=16
        )
    )
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    hub: HubConfig = field(default_factory=HubConfig)
    predict: bool = False
    """Do not train: load --model.checkpoint (a fine-tuned seq2seq folder), generate for the test split and write the outputs (and metrics) into output_dir."""


# ----------------------------------------------------------------------------------------------------------
# tokenizers and model


class Seq2SeqTokenizers:
    """The encoder's tokenizer (sources) and the decoder's (targets), saved in two subfolders of the model
    folder; `save_pretrained` makes the pair usable wherever Kiln saves "the tokenizer" with the model."""

    ENCODER_FOLDER = "encoder_tokenizer"
    DECODER_FOLDER = "decoder_tokenizer"

    def __init__(self, encoder, decoder):
        self.encoder = encoder
        self.decoder = decoder

    def save_pretrained(self, save_directory, **kwargs):
        directory = Path(save_directory)
        return (
            *self.encoder.save_pretrained(directory / self.ENCODER_FOLDER, **kwargs),
            *self.decoder.save_pretrained(directory / self.DECODER_FOLDER, **kwargs),
        )

    @classmethod
    def from_pretrained(cls, path: str, revision: str | None = None) -> Seq2SeqTokenizers:
        return cls(
            load_checkpoint_tokenizer(path, "--model.checkpoint", revision, subfolder=cls.ENCODER_FOLDER),
            load_checkpoint_tokenizer(path, "--model.checkpoint", revision, subfolder=cls.DECODER_FOLDER),
        )


def freeze_pooler(encoder) -> None:
    """The pooled [CLS] vector is not used by the decoder: frozen, it stays out of the gradients (and of DDP's
    unused-parameter check) but keeps its weights, so the saved model reloads without missing keys."""
    if getattr(encoder, "pooler", None) is not None:
        encoder.pooler.requires_grad_(False)


def build_encoder_decoder(model_cfg, predict: bool):
    """(KilnEncoderDecoderModel, Seq2SeqTokenizers, summary facts for the model card)."""
    from transformers import AutoModelForSeq2SeqLM

    from pretrain.modeling import KilnDecoderForCausalLM, KilnEncoderDecoderModel, KilnEncoderModel

    revision, attn = model_cfg.revision, model_cfg.attn_implementation
    if model_cfg.checkpoint:
        path, _ = resolve_start_model(
            model_cfg.checkpoint, "--model.checkpoint", ("kiln_encoder_decoder", "encoder-decoder"), revision
        )
        with quiet_transformers():  # a Kiln folder, or an older plain EncoderDecoderModel one
            model = AutoModelForSeq2SeqLM.from_pretrained(path, revision=revision, trust_remote_code=False)
        freeze_pooler(model.encoder)
        return model, Seq2SeqTokenizers.from_pretrained(path, revision), {"base model": model_cfg.checkpoint}
    if predict:
        raise ConfigError(
            "--predict needs --model.checkpoint pointing at a fine-tuned seq2seq folder, e.g. runs/seq2seq-scitldr/final"
        )
    encoder_path, encoder_config = resolve_start_model(
        model_cfg.encoder_checkpoint, "--model.encoder_checkpoint", ("kiln_encoder",), revision
    )
    decoder_path, decoder_config = resolve_start_model(
        model_cfg.decoder_checkpoint, "--model.decoder_checkpoint", ("kiln_decoder",), revision
    )
    if model_cfg.from_scratch:
        encoder_config._attn_implementation = attn
        decoder_config.update({"add_cross_attention": True, "is_decoder": True})
        decoder_config._attn_implementation = attn
        encoder, decoder = KilnEncoderModel(encoder_config), KilnDecoderForCausalLM(decoder_config)
    else:
        with quiet_transformers():
            encoder, encoder_info = KilnEncoderModel.from_pretrained(
                encoder_path, revision=revision, attn_implementation=attn, output_loading_info=True
            )
            decoder, decoder_info = KilnDecoderForCausalLM.from_pretrained(
                decoder_path,
                revision=revision,
                attn_implementation=attn,
                add_cross_attention=True,
                is_decoder=True,
                output_loading_info=True,
            )
        report_loading(
            encoder_info, model_cfg.encoder_checkpoint, allowed_missing=lambda key: key.startswith("pooler.")
        )
        report_loading(
            decoder_info, model_cfg.decoder_checkpoint, allowed_missing=lambda key: ".cross_attention" in key
        )
    freeze_pooler(encoder)
    with quiet_transformers():
        model = KilnEncoderDecoderModel(encoder=encoder, decoder=decoder)
    tokenizers = Seq2SeqTokenizers(
        load_checkpoint_tokenizer(encoder_path, "--model.encoder_checkpoint", revision),
        load_checkpoint_tokenizer(decoder_path, "--model.decoder_checkpoint", revision),
    )
    check_vocabulary(tokenizers.encoder, model.config.encoder, model_cfg.encoder_checkpoint)
    check_vocabulary(tokenizers.decoder, model.config.decoder, model_cfg.decoder_checkpoint)
    summary = {
        "encoder": model_cfg.encoder_checkpoint,
        "decoder": model_cfg.decoder_checkpoint,
        "initialisation": "random (from scratch)"
        if model_cfg.from_scratch
        else "pretrained (new cross-attention)",
    }
    return model, tokenizers, summary


def set_special_tokens(model, tokenizers, generation, max_new_tokens: int) -> None:
    """decoder_start / pad / eos ids for training (labels shifted right after the start token) and for
    `generate`. The decoder's byte-level BPE has only <|endoftext|>: it starts, ends and pads targets alike
    (padding never reaches the loss: labels are -100 there, see Seq2SeqCollator)."""
    from transformers import GenerationConfig

    decoder_tokenizer = tokenizers.decoder
    eos = decoder_tokenizer.eos_token_id
    if eos is None:
        raise ConfigError(
            "the decoder's tokenizer has no eos_token; use a Kiln decoder checkpoint (it has <|endoftext|>)"
        )
    pad = decoder_tokenizer.pad_token_id if decoder_tokenizer.pad_token_id is not None else eos
    start = decoder_tokenizer.bos_token_id if decoder_tokenizer.bos_token_id is not None else eos
    if len(decoder_tokenizer) > model.config.decoder.vocab_size:
        raise ConfigError(
            f"the decoder's tokenizer has {len(decoder_tokenizer)} tokens but the decoder only "
            f"{model.config.decoder.vocab_size} embeddings; use the decoder checkpoint's own tokenizer"
        )
    model.config.decoder_start_token_id = start
    model.config.pad_token_id = pad
    model.config.eos_token_id = eos
    beams = generation.num_beams
    model.generation_config = GenerationConfig(
        decoder_start_token_id=start,
        bos_token_id=start,
        eos_token_id=eos,
        pad_token_id=pad,
        max_new_tokens=max_new_tokens,
        num_beams=beams,
        no_repeat_ngram_size=generation.no_repeat_ngram_size,
        **({"length_penalty": generation.length_penalty, "early_stopping": True} if beams > 1 else {}),
    )


# ----------------------------------------------------------------------------------------------------------
# data


class Seq2SeqCollator:
    """transformers' DataCollatorForSeq2Seq (sources padded, labels padded with -100, decoder_input_ids = labels
    shifted right after decoder_start_token_id) plus an explicit decoder_attention_mask: EncoderDecoderModel's
    default mask (decoder_input_ids != pad) would hide the start token, which is also the pad token here."""

    def __init__(self, tokenizer, model):
        from transformers import DataCollatorForSeq2Seq

        self.inner = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)

    def __call__(self, features):
        batch = self.inner(features)
        labels = batch.get("labels")
        if labels is not None:
            mask = labels.new_ones(labels.shape)
            mask[:, 1:] = labels[:, :-1] != -100  # the start token, then one position per target token
            batch["decoder_attention_mask"] = mask
        return batch


def tokenize_splits(
    dataset, tokenizers, max_source: int, max_target: int, positions: tuple[int, int], data
) -> dict:
    """Tokenized copies of the splits: input_ids/attention_mask from the encoder's tokenizer, labels = the
    target's decoder tokens + <|endoftext|>; sources and targets over their length are truncated (reported).
    `positions`: the encoder's and the decoder's max_position_embeddings."""
    encoder_tokenizer, decoder_tokenizer = tokenizers.encoder, tokenizers.decoder
    eos = decoder_tokenizer.eos_token_id

    def tokenize(batch):
        encoding = encoder_tokenizer(
            batch["source"], truncation=True, max_length=max_source, return_token_type_ids=False
        )
        full_sources = encoder_tokenizer(batch["source"], verbose=False, return_token_type_ids=False)[
            "input_ids"
        ]
        encoding["source_truncated"] = [len(ids) > max_source for ids in full_sources]
        if "target" in batch:
            targets = decoder_tokenizer(batch["target"], add_special_tokens=False, verbose=False)["input_ids"]
            encoding["labels"] = [ids[: max_target - 1] + [eos] for ids in targets]
            encoding["target_truncated"] = [len(ids) + 1 > max_target for ids in targets]
        return encoding

    tokenized, source_counts, target_counts = {}, {}, {}
    for split_name, split in dataset.items():
        mapped = split.map(
            tokenize, batched=True, remove_columns=split.column_names, desc=f"tokenizing {split_name}"
        )
        mapped, truncated = pop_flags(mapped, "source_truncated")
        source_counts[split_name] = (truncated, len(mapped))
        if "target_truncated" in mapped.column_names:
            mapped, truncated = pop_flags(mapped, "target_truncated")
            target_counts[split_name] = (truncated, len(mapped))
        tokenized[split_name] = mapped
    report_truncation(
        source_counts, "sources", max_source, positions[0], "--data.max_source_length", data.truncation
    )
    report_truncation(
        target_counts, "targets", max_target, positions[1], "--data.max_target_length", data.truncation
    )
    return tokenized


# ----------------------------------------------------------------------------------------------------------
# generating and scoring


def make_infer(decoder_tokenizer, generation_config):
    def infer(model, loader, accelerator):
        """Generated texts in dataset order, and the teacher-forced loss per target token."""
        import torch
        import torch.nn.functional as F

        unwrapped = accelerator.unwrap_model(model)
        texts, loss_sum, count = [], 0.0, 0
        for batch in loader:
            labels = batch.pop("labels", None)
            if labels is not None:
                logits = model(**batch).logits.float()  # (B, T, V)
                token_loss = F.cross_entropy(
                    logits.transpose(1, 2), labels, ignore_index=-100, reduction="none"
                )
                per_pair = torch.stack([token_loss.sum(-1), (labels != -100).sum(-1).float()], dim=-1)
                sums = accelerator.gather_for_metrics(per_pair).sum(0)
                loss_sum, count = loss_sum + float(sums[0]), count + float(sums[1])
            generated = unwrapped.generate(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                generation_config=generation_config,
            )
            generated = accelerator.pad_across_processes(
                generated, dim=1, pad_index=generation_config.pad_token_id
            )
            generated = accelerator.gather_for_metrics(generated)
            texts.extend(
                text.strip() for text in decoder_tokenizer.batch_decode(generated, skip_special_tokens=True)
            )
        return texts, (loss_sum / count if count else None)

    return infer


def make_scoring(task: str):
    from finetune.metrics import load_metric

    metric = load_metric("rouge_summary" if task == "summarization" else "translation")

    def references_of(split):
        return split["references"] if "references" in split.column_names else split["target"]

    def compute_metrics(predictions, split) -> dict[str, float]:
        scores = metric.compute(predictions=predictions, references=references_of(split))
        if task == "translation":
            return {
                "bleu": scores["bleu"],
                "chrf": scores["chrf"],
                "brevity_penalty": scores["brevity_penalty"],
            }
        return scores

    def prediction_rows(predictions, split) -> list[dict]:
        sources = split["source"]
        key = "references" if "references" in split.column_names else "reference"
        references = references_of(split) if "target" in split.column_names else None
        rows = []
        for i, prediction in enumerate(predictions):
            row = {"source": sources[i], "prediction": prediction}
            if references is not None:
                row[key] = references[i]
            rows.append(row)
        return rows

    return compute_metrics, prediction_rows


# ----------------------------------------------------------------------------------------------------------


# the task


def start(config) -> None:
    """The task's checks, before the run starts."""
    data, generation = config.data, config.generation
    if data.task not in TASK_METRICS:
        raise ConfigError(f"--data.task must be summarization or translation, got {data.task!r}")
    if generation.num_beams < 1 or generation.max_new_tokens < 1 or generation.no_repeat_ngram_size < 0:
        raise ConfigError(
            "--generation.num_beams and --generation.max_new_tokens must be >= 1, --generation.no_repeat_ngram_size >= 0"
        )
    choices, default_metric = TASK_METRICS[data.task]
    check_best_metric(config.training, choices, default=default_metric)


def head(config, start, labels) -> Head:
    """Built right after seeding: the new weights (cross-attention, or all of them from scratch) are seeded."""
    model, tokenizers, summary = build_encoder_decoder(config.model, config.predict)
    return Head(model, tokenizers, summary=summary, metadata={"seq2seq_task": config.data.task})


def read(config, files: dict, start):
    from finetune.data import load_seq2seq_data

    data = config.data
    return load_seq2seq_data(
        dataset_name=data.dataset_name,
        dataset_config=data.dataset_config,
        dataset_revision=data.dataset_revision,
        **files,
        source_column=data.source_column,
        target_column=data.target_column,
        source_lang=data.source_lang,
        target_lang=data.target_lang,
        validation_split_percentage=data.validation_split_percentage,
        seed=config.training.seed,
    )


def tokenize(config, head, dataset, labels, accelerator) -> dict:
    """Source and target lengths and the generation settings (capped by the model's positions), then the
    tokenized splits."""
    data, generation, model = config.data, config.generation, head.model
    encoder_positions = model.config.encoder.max_position_embeddings
    decoder_positions = model.config.decoder.max_position_embeddings
    max_source = positions_limit(data.max_source_length, encoder_positions, "data.max_source_length")
    max_target = positions_limit(data.max_target_length, decoder_positions, "data.max_target_length")
    # generation feeds the start token plus every new token through the decoder's positions
    max_new_tokens = positions_limit(
        generation.max_new_tokens,
        decoder_positions - 1,
        "generation.max_new_tokens",
        "the decoder's max_position_embeddings - 1",
    )
    set_special_tokens(model, head.tokenizer, generation, max_new_tokens)
    head.summary.update(
        {
            "task": data.task,
            "max source / target length": f"{max_source} / {max_target}",
            "generation": f"num_beams {generation.num_beams}, max_new_tokens {max_new_tokens}, "
            f"length_penalty {generation.length_penalty}, no_repeat_ngram_size {generation.no_repeat_ngram_size}",
        }
    )
    with accelerator.main_process_first():
        positions = (encoder_positions, decoder_positions)
        return tokenize_splits(dataset, head.tokenizer, max_source, max_target, positions, data)


def collator(head):
    return Seq2SeqCollator(head.tokenizer.encoder, head.model)


def scoring(config, head, labels):
    return (make_infer(head.tokenizer.decoder, head.model.generation_config), *make_scoring(config.data.task))


TASK = FinetuneTask(
    script="finetune/seq2seq.py",
    config=Seq2SeqConfig,
    description=DESCRIPTION,
    pipeline_tag="text2text-generation",
    reference_column="target",
    start=start,
    read=read,
    head=head,
    tokenize=tokenize,
    collator=collator,
    scoring=scoring,
    card_usage=CARD_USAGE,
)


def main(argv: list[str] | None = None):
    return run_task(TASK, argv)


if __name__ == "__main__":
    run_finetune_cli(main)
