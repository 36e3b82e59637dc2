"""Every model folder Kiln writes loads with transformers alone, in a fresh process that cannot import Kiln
(issue 13, item 4): the model through its Auto class with `trust_remote_code=True` (same outputs as in
Kiln's own process), the tokenizer through `AutoTokenizer` without any question on the terminal.

Folder kinds: encoder pretraining `final/`, decoder pretraining `final/`, a fine-tuned classifier's `final/`
and the `best/` checkpoint it kept during training, a tagger's `final/`, and the seq2seq `final/` (its two
tokenizers live in `encoder_tokenizer/` and `decoder_tokenizer/`).

Why the tokenizer calls name `trust_remote_code` (True or False): transformers 5.x `AutoTokenizer` reads the
model's config.json first, through `AutoConfig` with `trust_remote_code=None`, and a config whose
`model_type` transformers does not know but whose `auto_map` names a config class (every folder that carries
its code) makes it ask "Do you wish to run the custom code?" before it even opens the tokenizer files, whatever
they say. With either value it does not ask; the tokenizer itself is a plain `tokenizers` file
(`TokenizersBackend`) and needs no code. A bare call in a process without a terminal still returns the
tokenizer (the question reads end-of-file, and transformers falls back to a plain config), which is checked
too. What transformers logs is recorded per call at its default verbosity: the calls the model cards and
docs/models.md show (`trust_remote_code=True` for both, or `PreTrainedTokenizerFast` for the tokenizer alone, or
a bare `AutoTokenizer` where Kiln is imported) log nothing; `trust_remote_code=False` logs transformers' "model of
type ``" warning, which is why no page shows it.
"""

import json
import subprocess
import sys

import pytest
import torch
from kiln_testing import REPO, WITHOUT_THE_PROJECT, one_torch_thread
from test_finetune_scripts import (
    classify,
    seq2seq,
    synthetic_ner_sentences,
    tag,
    write_conll,
    write_sentiment,
)

TEXT = "the man was happy in the town"
SHORT = ["--training.max_steps", 2, "--training.save_steps", 0, "--data.truncation", "quiet"]

# (name, folder relative to the root, tokenizer subfolder, Auto class); the seq2seq folder twice, one row per
# tokenizer
FOLDERS = [
    ("encoder pretraining final", "enc/final", None, "AutoModelForPreTraining"),
    ("decoder pretraining final", "dec/final", None, "AutoModelForCausalLM"),
    ("classifier final", "classify/final", None, "AutoModelForSequenceClassification"),
    ("classifier best checkpoint", "classify/best", None, "AutoModelForSequenceClassification"),
    ("tagger final", "tag/final", None, "AutoModelForTokenClassification"),
    ("seq2seq final, source tokenizer", "seq2seq/final", "encoder_tokenizer", "AutoModelForSeq2SeqLM"),
    ("seq2seq final, target tokenizer", "seq2seq/final", "decoder_tokenizer", "AutoModelForSeq2SeqLM"),
]

# A fresh interpreter in which `kiln`, `pretrain` and `finetune` cannot be imported; stdin is /dev/null, so a
# question would read end-of-file instead of hanging
CHILD = (
    WITHOUT_THE_PROJECT
    + r"""
import contextlib, io, json, logging
import torch
import transformers

# every warning transformers logs (at its default verbosity), by call
warned = []
class Recorder(logging.Handler):
    def emit(self, record):
        warned.append(record.getMessage())
transformers.logging.set_verbosity_warning()
logging.getLogger("transformers").addHandler(Recorder(logging.WARNING))

specs, text, out_file = json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
results = []
for folder, subfolder, auto_class in specs:
    row = {"tokens": {}, "asked": {}, "warned": {}}
    where = {"subfolder": subfolder} if subfolder else {}
    calls = (
        ("trust", transformers.AutoTokenizer, {"trust_remote_code": True}),
        ("no_trust", transformers.AutoTokenizer, {"trust_remote_code": False}),
        ("bare", transformers.AutoTokenizer, {}),
        ("plain", transformers.PreTrainedTokenizerFast, {}),
    )
    for label, tokenizer_class, flag in calls:
        terminal = io.StringIO()
        warned.clear()
        with contextlib.redirect_stdout(terminal):
            tokenizer = tokenizer_class.from_pretrained(folder, **where, **flag)
        row["asked"][label] = "Do you wish to run the custom code" in terminal.getvalue()
        row["warned"][label] = list(warned)
        row["tokens"][label] = tokenizer(text)["input_ids"]
    warned.clear()
    model = getattr(transformers, auto_class).from_pretrained(folder, trust_remote_code=True).eval()
    row["warned"]["model"] = list(warned)
    row["class"] = type(model).__module__ + "." + type(model).__name__
    input_ids = torch.tensor([row["tokens"]["trust"]])
    with torch.no_grad():
        if auto_class == "AutoModelForSeq2SeqLM":
            row["output"] = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                           max_new_tokens=4).tolist()
        else:
            output = model(input_ids)
            row["output"] = (output.logits if "logits" in output else output.prediction_logits).tolist()
    results.append(row)
results.append({"imported": sorted(m for m in sys.modules if m.split(".")[0] in ("kiln", "pretrain", "finetune"))})
Path(out_file).write_text(json.dumps(results))
"""
)


@pytest.fixture(scope="module")
def kiln_folders(kiln_checkpoints, tmp_path_factory):
    """One folder of every kind: the shared tiny pretraining runs, and 2-step fine-tuning runs from them."""
    encoder, decoder = kiln_checkpoints
    root = tmp_path_factory.mktemp("folders")
    (root / "enc").symlink_to(encoder.parent)
    (root / "dec").symlink_to(decoder.parent)
    data = root / "data"
    data.mkdir()
    sentiment = write_sentiment(data, sizes=(32, 8, 8))
    ner = {
        split: write_conll(data / f"{split}.txt", synthetic_ner_sentences(n, seed))
        for split, n, seed in (("train", 16, 0), ("validation", 8, 1), ("test", 8, 2))
    }
    with one_torch_thread():
        classify(
            "--model.checkpoint",
            encoder,
            "--training.output_dir",
            root / "classify",
            *SHORT,
            "--data.train_file",
            sentiment["train"],
            "--data.validation_file",
            sentiment["validation"],
            "--data.test_file",
            sentiment["test"],
            "--training.per_device_train_batch_size",
            16,
        )
        tag(
            "--model.checkpoint",
            encoder,
            "--training.output_dir",
            root / "tag",
            *SHORT,
            "--data.train_file",
            ner["train"],
            "--data.validation_file",
            ner["validation"],
            "--data.test_file",
            ner["test"],
            "--training.per_device_train_batch_size",
            8,
        )
        seq2seq(
            "--model.encoder_checkpoint",
            encoder,
            "--model.decoder_checkpoint",
            decoder,
            "--training.output_dir",
            root / "seq2seq",
            *SHORT,
            "--data.max_train_samples",
            8,
            "--data.max_eval_samples",
            4,
            "--data.max_predict_samples",
            4,
            "--training.per_device_train_batch_size",
            4,
            "--generation.max_new_tokens",
            4,
        )
    return root


def kiln_side(folder, subfolder, auto_class):
    """What the same calls give in this process, where Kiln is imported (no remote code involved); a bare
    AutoTokenizer call does not ask here either, since the config's model_type is registered."""
    import contextlib
    import io
    import logging

    import transformers

    import pretrain.modeling  # noqa: F401  (registers the Auto classes)

    warned = []
    recorder = logging.Handler(logging.WARNING)
    recorder.emit = lambda record: warned.append(record.getMessage())
    library_logger = logging.getLogger("transformers")
    terminal = io.StringIO()
    library_logger.addHandler(recorder)
    try:
        with contextlib.redirect_stdout(terminal):
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                folder, **({"subfolder": subfolder} if subfolder else {})
            )
    finally:
        library_logger.removeHandler(recorder)
    assert "Do you wish to run the custom code" not in terminal.getvalue(), folder
    # silent, unless this process turned transformers' warnings off (then there is nothing to see either)
    assert not [line for line in warned if "model of type" in line], (folder, warned)
    input_ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    model = getattr(transformers, auto_class).from_pretrained(folder).eval()
    with torch.no_grad():
        if auto_class == "AutoModelForSeq2SeqLM":
            output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=4)
            return input_ids[0].tolist(), type(model).__name__, output
        output = model(input_ids)
        return (
            input_ids[0].tolist(),
            type(model).__name__,
            output.logits if "logits" in output else output.prediction_logits,
        )


@pytest.mark.slow
def test_every_folder_kind_loads_with_transformers_alone_and_the_tokenizer_never_asks(kiln_folders, tmp_path):
    import os

    specs = [
        (str(kiln_folders / folder), subfolder, auto_class) for _, folder, subfolder, auto_class in FOLDERS
    ]
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("HF_")}
    environment.update(HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1")
    out_file = tmp_path / "results.json"
    subprocess.run(
        [sys.executable, "-c", CHILD, str(REPO), json.dumps(specs), TEXT, str(out_file)],
        cwd=tmp_path,
        env=environment,
        check=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    *rows, imported = json.loads(out_file.read_text())
    assert imported == {"imported": []}

    for (name, _, _, _), (folder, subfolder, auto_class), row in zip(FOLDERS, specs, rows):
        tokens, class_name, expected = kiln_side(folder, subfolder, auto_class)
        assert row["asked"]["trust"] is False and row["asked"]["no_trust"] is False, name
        if subfolder:  # the seq2seq tokenizers' subfolders hold no config.json: nothing to ask about
            assert row["asked"]["bare"] is False, name
        assert row["tokens"] == {"trust": tokens, "no_trust": tokens, "bare": tokens, "plain": tokens}, name
        # the calls the model cards and docs/models.md show are silent: the model with its code, the tokenizer
        # beside it with the same flag or alone without any code (no "model of type ``" warning)
        assert row["warned"]["model"] == [] and row["warned"]["trust"] == [], (name, row["warned"])
        assert row["warned"]["plain"] == [], (name, row["warned"])
        if not subfolder:  # the warning the documented calls avoid (transformers' fallback to a bare config)
            assert any("model of type" in line for line in row["warned"]["no_trust"]), (name, row["warned"])
        assert row["class"].startswith("transformers_modules.") and row["class"].endswith(class_name), name
        torch.testing.assert_close(torch.tensor(row["output"]).to(expected.dtype), expected, msg=name)
