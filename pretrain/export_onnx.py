"""Export a saved Kiln model folder to ONNX for serving, and check it against PyTorch with onnxruntime.

    python -m pretrain.export_onnx runs/encoder-tiny/final onnx/encoder-tiny       # the folder's own head
    python -m pretrain.export_onnx runs/classify-authorship/final onnx/classify

Writes OUT/model.onnx (inputs `input_ids`, `attention_mask`, plus `token_type_ids` for the encoder; batch and
sequence axes dynamic; outputs named as the model's output fields, e.g. `logits`, `start_logits`/`end_logits`,
`prediction_logits`/`seq_relationship_logits`) next to the folder's config and tokenizer files, then runs the
graph with onnxruntime on a padded batch of another shape than the one traced and refuses the export (exit 1)
if any output differs from PyTorch's by more than 1e-4. Every encoder head and the decoder's heads export; the
decoder graph computes the whole sequence (no key/value cache inputs), and the seq2seq model does not export yet.
Needs `pip install onnx onnxruntime` (in the dev extras).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import warnings
from pathlib import Path

import torch

# Kiln class -> the output fields the graph returns
OUTPUTS = {
    "KilnEncoderModel": ("last_hidden_state", "pooler_output"),
    "KilnEncoderForPreTraining": ("prediction_logits", "seq_relationship_logits"),
    "KilnEncoderForMaskedLM": ("logits",),
    "KilnEncoderForNextSentencePrediction": ("logits",),
    "KilnEncoderForSequenceClassification": ("logits",),
    "KilnEncoderForMultipleChoice": ("logits",),
    "KilnEncoderForTokenClassification": ("logits",),
    "KilnEncoderForQuestionAnswering": ("start_logits", "end_logits"),
    "KilnDecoderModel": ("last_hidden_state",),
    "KilnDecoderForCausalLM": ("logits",),
    "KilnDecoderForSequenceClassification": ("logits",),
    "KilnDecoderForTokenClassification": ("logits",),
}
COPIED = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)
ATOL = 1e-4
GRAPH_FILES = ("model.onnx", "model.onnx.data")
"""What the exporter writes beside COPIED (the weights go into model.onnx.data past protobuf's 2 GB)."""


class _Graph(torch.nn.Module):
    """Positional tensors in, the head's output fields out (what the ONNX tracer needs)."""

    def __init__(self, model, input_names, output_names):
        super().__init__()
        self.model, self.input_names, self.output_names = model, input_names, output_names

    def forward(self, *inputs):
        outputs = self.model(**dict(zip(self.input_names, inputs)), return_dict=True)
        return tuple(outputs[name] for name in self.output_names)


def example_inputs(model, batch_size: int, seq_len: int, seed: int) -> dict[str, torch.Tensor]:
    """A batch with right padding in its first row (so the traced graph keeps the padding-mask path)."""
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    low = 3 if config.vocab_size > 3 else 0
    shape = (
        (batch_size, 2, seq_len) if type(model).__name__.endswith("MultipleChoice") else (batch_size, seq_len)
    )
    input_ids = torch.randint(low, config.vocab_size, shape, generator=generator)
    pad = getattr(config, "pad_token_id", None)
    input_ids[input_ids == pad] = low  # padding only where the mask says so
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, ..., seq_len - 2 :] = 0
    if pad is not None:
        input_ids[attention_mask == 0] = pad
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if config.model_type == "kiln_encoder":
        token_type_ids = torch.zeros_like(input_ids)
        token_type_ids[..., seq_len // 2 :] = 1
        inputs["token_type_ids"] = token_type_ids
    return inputs


# the fix the model gate names for a folder whose weights are only in torch's pickle format: convert them to a
# transformers folder (safetensors) and back to Kiln
PICKLE_FIX = (
    "convert them to safetensors first with `python -m pretrain.convert {folder} DST --trust_pickles` (only for a "
    "file you trust) and back with `python -m pretrain.convert DST KILN`, and export KILN"
)


def load(folder: Path):
    """FOLDER's Kiln model, in eval mode: a ConfigError (one line) when FOLDER is no Kiln model folder this export
    takes (no folder, no readable config.json, another architecture, or refused by the model gate)."""
    import transformers

    import pretrain.modeling as modeling
    from kiln.errors import ConfigError
    from kiln.model_files import read_model_config, weight_file_errors, weight_files

    if not folder.is_dir():
        raise ConfigError(f"FOLDER {folder} does not exist; point it at a model folder written by Kiln")
    if not (folder / "config.json").is_file():
        hint = f"; point it at the model inside: {folder / 'final'}" if (folder / "final").is_dir() else ""
        raise ConfigError(f"FOLDER {folder} holds no config.json, so it is not a saved model{hint}")
    try:
        config = read_model_config(str(folder))
    except OSError as err:
        raise ConfigError(f"FOLDER {folder}: {err}; point it at a model folder written by Kiln") from None
    architecture = (config.get("architectures") or [None])[0]
    if architecture not in OUTPUTS:
        supported = ", ".join(OUTPUTS)
        raise ConfigError(
            f"{folder} holds a {architecture or config.get('model_type')} model; ONNX export supports {supported}."
        )
    from pretrain.model_gate import check_model_folder

    # the model gate: files, depth, every tensor, before the build
    check_model_folder(str(folder), "", config, pickle_fix=PICKLE_FIX.format(folder=folder))
    if weight_files(folder) is None:
        raise ConfigError(
            f"{folder} holds no weights (no model.safetensors); point it at a model folder written by Kiln"
        )
    verbosity = transformers.logging.get_verbosity()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.logging.set_verbosity_error()
        try:
            with weight_file_errors(str(folder)):
                model = getattr(modeling, architecture).from_pretrained(folder, attn_implementation="eager")
        finally:
            transformers.logging.set_verbosity(verbosity)
    return model.eval()


def export(folder: str | Path, out: str | Path, opset: int = 17) -> dict[str, float]:
    """Export FOLDER's model to OUT/model.onnx; returns the largest |ONNX - PyTorch| per output (checked). OUT is
    written whole into a fresh staging folder beside it and renamed into place once the graph is checked
    (`kiln.safe_write.staged_folder`): a link inside an earlier OUT is never written through, and a failed export
    or check leaves OUT as it was. OUT must be new, empty or an earlier export (`check_export_folder`)."""
    from kiln.safe_write import staged_folder

    folder, out = Path(folder), Path(out)
    check_export_folder(folder, out)
    model = load(folder)
    output_names = [
        name
        for name in OUTPUTS[type(model).__name__]
        if not (name == "pooler_output" and getattr(model, "pooler", None) is None)
    ]
    traced = example_inputs(model, batch_size=2, seq_len=8, seed=0)
    input_names = list(traced)
    sequence_axis = (
        {0: "batch", 1: "choices", 2: "sequence"}
        if traced["input_ids"].dim() == 3
        else {0: "batch", 1: "sequence"}
    )
    with staged_folder(out) as staging:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter(
                "ignore"
            )  # the tracer's notes on Python-side checks (sizes, vocabulary range)
            try:
                torch.onnx.export(
                    _Graph(
                        model, input_names, output_names
                    ).eval(),  # the exporter restores this mode afterwards
                    tuple(traced.values()),
                    str(staging / "model.onnx"),
                    dynamo=False,
                    input_names=input_names,
                    output_names=output_names,
                    dynamic_axes={name: sequence_axis for name in input_names},
                    opset_version=opset,
                )
            except RuntimeError as err:  # an opset newer than torch's exporter writes: the option refused
                if "Unsupported onnx_opset_version" not in str(err):
                    raise
                from kiln.errors import ConfigError, first_line

                raise ConfigError(
                    f"--opset {opset}: torch's ONNX exporter does not write it ({first_line(err)}); pick an "
                    "older opset (the default is 17)"
                ) from None
        for name in COPIED:
            if (folder / name).is_file():
                shutil.copy(folder / name, staging / name)
        differences = check(model, staging / "model.onnx", output_names)
    return differences


def check_export_folder(folder: Path, out: Path) -> None:
    """OUT is replaced whole by the export: a one-line ConfigError, before anything is loaded, when that would
    lose something: OUT is FOLDER or holds it, is a file, or holds anything an export does not write (a user's
    file, a folder). A link at one of an export's names goes as a link: what it leads to is never touched."""
    from kiln.errors import ConfigError

    if out.resolve() == folder.resolve() or out.resolve() in folder.resolve().parents:
        raise ConfigError(f"OUT {out} is the model folder {folder} or holds it; export into another folder")
    if out.exists() and not out.is_dir() and not out.is_symlink():
        raise ConfigError(f"OUT {out} is a file; remove it or export into another folder")
    if not out.is_dir() or out.is_symlink():
        return  # new (a link at OUT is refused by the staged writer, naming it)
    ours = {*GRAPH_FILES, *COPIED}
    foreign = sorted(
        p.name for p in out.iterdir() if p.name not in ours or not (p.is_symlink() or p.is_file())
    )
    if foreign:
        raise ConfigError(
            f"OUT {out} holds {', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}, which an export does "
            "not write, and the export replaces the whole folder; export into a new or empty folder"
        )


def check(model, onnx_path: Path, output_names) -> dict[str, float]:
    """Run the graph with onnxruntime on a batch of another shape than the traced one; compare with PyTorch."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    inputs = example_inputs(model, batch_size=3, seq_len=11, seed=1)
    got = session.run(list(output_names), {name: tensor.numpy() for name, tensor in inputs.items()})
    with torch.no_grad():
        expected = model(**inputs, return_dict=True)
    differences = {}
    real = inputs["attention_mask"].bool()
    for name, value in zip(output_names, got):
        reference, actual = expected[name], torch.from_numpy(value)
        if reference.shape[: real.dim()] == real.shape:  # per token: padded positions carry no meaning
            reference, actual = reference[real], actual[real]
        differences[name] = float((actual - reference).abs().max())
    worst = max(differences.values())
    if not worst <= ATOL:
        raise ValueError(
            f"the ONNX graph differs from PyTorch by {worst:.2e} (> {ATOL}); please report this model."
        )
    return differences


def export_parser() -> argparse.ArgumentParser:
    """The command line of `python -m pretrain.export_onnx`."""
    from kiln.cli import add_print_config
    from kiln.option_range import number_argument

    parser = argparse.ArgumentParser(
        prog="python -m pretrain.export_onnx",
        description="Export a saved Kiln model folder to OUT/model.onnx (with its config and tokenizer files) and "
        "check it against PyTorch with onnxruntime. Guide: docs/models.md; every option: docs/configuration.md.",
    )
    parser.add_argument("folder", metavar="FOLDER", help="a folder written by Kiln (save_pretrained)")
    parser.add_argument(
        "out",
        metavar="OUT",
        help="output folder: new, empty or an earlier export, replaced whole once the export is checked",
    )
    # 7: the first opset torch's exporter writes; a newer one than it knows is refused in one line (`export`)
    parser.add_argument(
        "--opset", type=number_argument(int, low=7), default=17, help="ONNX opset (default 17)"
    )
    add_print_config(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    from kiln.cli import answer_print_config
    from kiln.errors import ConfigError

    args = export_parser().parse_args(argv)
    answer_print_config(args)
    try:
        differences = export(args.folder, args.out, args.opset)
    except ImportError as error:  # the environment, not the input: exit status 1
        sys.exit(f"error: {error.name} is missing; pip install onnx onnxruntime")
    except ConfigError as error:
        # a refused input, said before anything is built or written: FOLDER (no Kiln model there, one this export
        # does not take, refused by the model gate) or OUT (check_export_folder): exit status 2, as argparse's
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except (ValueError, OSError) as error:  # a failure during the export (a graph that differs, a full disk)
        sys.exit(f"error: {error}")
    detail = ", ".join(f"{name} {value:.1e}" for name, value in differences.items())
    print(f"wrote {Path(args.out) / 'model.onnx'}; onnxruntime vs PyTorch, largest difference: {detail}")


if __name__ == "__main__":
    main()
