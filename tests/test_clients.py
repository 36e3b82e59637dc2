"""The tools people run on BERT/GPT-2 folders, run on tiny Kiln folders in a fresh process that cannot import Kiln
(`trust_remote_code=True`): the calls of transformers' example scripts (run_mlm, run_mlm_no_trainer, run_clm,
run_glue/run_classification, run_ner), PEFT LoRA, sentence-transformers, torch.export and static-cache generate.

The parent builds the folders with Kiln; each test runs one child script (`python -c`) whose sys.path has no
repository and whose import system refuses `kiln`, `pretrain` and `finetune`; the child writes what it measured to
a JSON or torch file the parent checks. A failure here is a defect of Kiln's folders or model code."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from kiln_testing import REPO, WITHOUT_THE_PROJECT, tiny_decoder_config, tiny_encoder_config

WORDS = "the a cat dog man woman sat ran saw liked on in by town park mat house big small red old".split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def sentences(count: int, seed: int) -> list[str]:
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(WORDS), (count, 7), generator=generator).tolist()
    return [" ".join(WORDS[i] for i in row) for row in picks]


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocabulary = {token: i for i, token in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocabulary, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=32,
    )


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """An encoder folder (pretraining heads, as pretrain/run.py writes `final/`) and a decoder folder of each preset
    (`decoder`: GPT-2 blocks, `decoder-llama`), each with its tokenizer and its model code (auto_map)."""
    from pretrain.modeling import KilnDecoderForCausalLM, KilnEncoderForPreTraining

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("clients")
    vocab_size = len(SPECIALS) + len(WORDS)
    settings = dict(vocab_size=vocab_size, max_position_embeddings=32, pad_token_id=0)
    models = {
        "encoder": KilnEncoderForPreTraining(tiny_encoder_config(**settings)),
        "decoder": KilnDecoderForCausalLM(tiny_decoder_config(**settings, bos_token_id=2, eos_token_id=3)),
        "decoder-llama": KilnDecoderForCausalLM(  # the llama preset, grouped-query attention
            tiny_decoder_config(
                **settings, bos_token_id=2, eos_token_id=3, preset="llama", num_key_value_heads=2
            )
        ),
    }
    for name, model in models.items():
        model.save_pretrained(root / name)
        tokenizer().save_pretrained(root / name)
        assert json.loads((root / name / "config.json").read_text())["auto_map"]
    return root


def run_child(script: str, tmp_path, *args, timeout=600):
    """`script` in a fresh interpreter without the project; returns what it wrote to tmp_path/out.json."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("HF_")}
    environment.update(
        HF_HOME=str(tmp_path / "hf_home"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        WANDB_DISABLED="true",
    )
    out = tmp_path / "out.json"
    command = [
        sys.executable,
        "-c",
        WITHOUT_THE_PROJECT + CHILD_COMMON + script,
        str(REPO),
        str(out),
        *map(str, args),
    ]
    done = subprocess.run(
        command,
        cwd=tmp_path,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result.pop("kiln_importable") is False
    assert all(module.startswith("transformers_modules.") for module in result.pop("model_modules")), result
    return result


# Shared by every child: no Kiln, and a record of where the loaded model classes came from
CHILD_COMMON = r"""
import importlib, json, math
for name in ("kiln", "pretrain", "finetune"):
    try:
        importlib.import_module(name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"{name} is importable in the child")
out_file = sys.argv[2]
results = {"kiln_importable": False, "model_modules": []}
import torch, transformers
from datasets import Dataset
torch.manual_seed(0)
load = dict(trust_remote_code=True)

def loaded(model):
    results["model_modules"].append(type(model).__module__)
    return model

WORDS = "the a cat dog man woman sat ran saw liked on in by town park mat house big small red old".split()

def sentences(count, seed):
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(WORDS), (count, 7), generator=generator).tolist()
    return [" ".join(WORDS[i] for i in row) for row in picks]

def args(output_dir, **overrides):  # TrainingArguments' defaults, with tiny step counts
    settings = dict(output_dir=output_dir, do_train=True, do_eval=True, max_steps=3, per_device_train_batch_size=4,
                    per_device_eval_batch_size=4, report_to="none")
    return transformers.TrainingArguments(**{**settings, **overrides})

def save():
    with open(out_file, "w") as f:
        json.dump(results, f)
"""


# ---------------------------------------------------------------------- transformers' example scripts' calls
SCRIPTS = r"""
import os
encoder_dir, work, decoder_dirs = sys.argv[3], sys.argv[4], sys.argv[5:]
tokenizer = transformers.AutoTokenizer.from_pretrained(encoder_dir, **load)
# the tokenizer alone needs no code: trust_remote_code=False reads it without the model's files and without asking
results["tokenizer_without_code"] = {}
for decoder_dir in decoder_dirs:
    plain = transformers.AutoTokenizer.from_pretrained(decoder_dir, trust_remote_code=False)
    results["tokenizer_without_code"][os.path.basename(decoder_dir)] = [
        type(plain).__module__.split(".")[0],
        plain(sentences(3, 9))["input_ids"] == tokenizer(sentences(3, 9))["input_ids"],
    ]
raw = {"train": sentences(32, 1), "validation": sentences(12, 2)}

def group_texts(examples, block_size=16):  # run_mlm / run_clm: concatenate, then cut into blocks
    joined = {k: sum(examples[k], []) for k in examples}
    total = (len(joined["input_ids"]) // block_size) * block_size
    return {k: [t[i : i + block_size] for i in range(0, total, block_size)] for k, t in joined.items()}

def lm_splits(tok, with_labels):
    splits = {}
    for split, texts in raw.items():
        data = Dataset.from_dict({"text": texts}).map(
            lambda b: tok(b["text"], return_special_tokens_mask=True), batched=True, remove_columns=["text"]
        ).map(group_texts, batched=True)
        if with_labels:
            data = data.map(lambda b: {"labels": b["input_ids"]}, batched=True)
        splits[split] = data
    return splits

def accuracy_of(predictions, labels):
    keep = labels != -100
    return float((predictions[keep] == labels[keep]).mean())

# run_mlm.py
config = transformers.AutoConfig.from_pretrained(encoder_dir, **load)
model = loaded(transformers.AutoModelForMaskedLM.from_pretrained(encoder_dir, config=config, **load))
if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
    model.resize_token_embeddings(len(tokenizer))
data = lm_splits(tokenizer, with_labels=False)
trainer = transformers.Trainer(
    model=model, args=args(f"{work}/mlm"), train_dataset=data["train"], eval_dataset=data["validation"],
    processing_class=tokenizer,
    data_collator=transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15),
    compute_metrics=lambda p: {"accuracy": accuracy_of(p.predictions, p.label_ids)},
    preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1),
)
trainer.train()
metrics = trainer.evaluate()
results["mlm"] = {"eval_loss": metrics["eval_loss"], "eval_accuracy": metrics["eval_accuracy"],
                  "perplexity": math.exp(metrics["eval_loss"]), "label_names": trainer.label_names}

# run_clm.py, on each decoder
for decoder_dir in decoder_dirs:
    name = os.path.basename(decoder_dir)
    clm_tokenizer = transformers.AutoTokenizer.from_pretrained(decoder_dir, **load)
    model = loaded(transformers.AutoModelForCausalLM.from_pretrained(decoder_dir, **load))
    data = lm_splits(clm_tokenizer, with_labels=True)
    trainer = transformers.Trainer(
        model=model, args=args(f"{work}/clm-{name}"), train_dataset=data["train"].remove_columns("special_tokens_mask"),
        eval_dataset=data["validation"].remove_columns("special_tokens_mask"), processing_class=clm_tokenizer,
        data_collator=transformers.default_data_collator,
        compute_metrics=lambda p: {"accuracy": accuracy_of(p.predictions[:, :-1], p.label_ids[:, 1:])},
        preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1),
    )
    trainer.train()
    metrics = trainer.evaluate()
    results[f"clm/{name}"] = {"eval_loss": metrics["eval_loss"], "eval_accuracy": metrics["eval_accuracy"],
                              "perplexity": math.exp(metrics["eval_loss"]), "label_names": trainer.label_names}

# run_glue.py / run_classification.py: sentence pairs, labels from the data, padding by the collator
pairs = {split: Dataset.from_dict({"sentence1": t, "sentence2": t[::-1], "label": [len(s) % 2 for s in t]})
         for split, t in raw.items()}
config = transformers.AutoConfig.from_pretrained(encoder_dir, num_labels=2, finetuning_task="mrpc", **load)
model = loaded(transformers.AutoModelForSequenceClassification.from_pretrained(encoder_dir, config=config, **load))
data = {split: d.map(lambda b: tokenizer(b["sentence1"], b["sentence2"], truncation=True, max_length=32),
                     batched=True, remove_columns=["sentence1", "sentence2"]) for split, d in pairs.items()}
trainer = transformers.Trainer(
    model=model, args=args(f"{work}/glue"), train_dataset=data["train"], eval_dataset=data["validation"],
    processing_class=tokenizer, data_collator=transformers.DataCollatorWithPadding(tokenizer),
    compute_metrics=lambda p: {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())},
)
trainer.train()
metrics = trainer.evaluate()
predictions = trainer.predict(data["validation"].remove_columns("label"))  # --do_predict: no labels
results["glue"] = {"eval_loss": metrics["eval_loss"], "eval_accuracy": metrics["eval_accuracy"],
                   "predictions": list(predictions.predictions.shape), "label_names": trainer.label_names}

# run_ner.py: words with tags, labels aligned to the first sub-token of each word
from seqeval.metrics import f1_score
label_list = ["O", "B-ANIMAL", "I-ANIMAL"]
def tags(words):
    return [1 if w in ("cat", "dog") else 0 for w in words]
ner = {split: Dataset.from_dict({"tokens": [s.split() for s in t], "ner_tags": [tags(s.split()) for s in t]})
       for split, t in raw.items()}
config = transformers.AutoConfig.from_pretrained(
    encoder_dir, num_labels=3, id2label=dict(enumerate(label_list)),
    label2id={l: i for i, l in enumerate(label_list)}, **load)
model = loaded(transformers.AutoModelForTokenClassification.from_pretrained(encoder_dir, config=config, **load))

def tokenize_and_align_labels(examples):
    tokenized = tokenizer(examples["tokens"], truncation=True, is_split_into_words=True)
    labels = []
    for i, word_tags in enumerate(examples["ner_tags"]):
        previous, row = None, []
        for word in tokenized.word_ids(batch_index=i):
            row.append(-100 if word is None or word == previous else word_tags[word])
            previous = word
        labels.append(row)
    tokenized["labels"] = labels
    return tokenized

data = {split: d.map(tokenize_and_align_labels, batched=True, remove_columns=["tokens", "ner_tags"])
        for split, d in ner.items()}

def ner_metrics(p):
    predictions = p.predictions.argmax(-1)
    truth = [[label_list[l] for l in row if l != -100] for row in p.label_ids]
    guess = [[label_list[q] for q, l in zip(prow, row) if l != -100] for prow, row in zip(predictions, p.label_ids)]
    return {"f1": f1_score(truth, guess, zero_division=0),
            "accuracy": float((predictions[p.label_ids != -100] == p.label_ids[p.label_ids != -100]).mean())}

trainer = transformers.Trainer(
    model=model, args=args(f"{work}/ner"), train_dataset=data["train"], eval_dataset=data["validation"],
    processing_class=tokenizer, data_collator=transformers.DataCollatorForTokenClassification(tokenizer),
    compute_metrics=ner_metrics,
)
trainer.train()
metrics = trainer.evaluate()
results["ner"] = {"eval_loss": metrics["eval_loss"], "eval_accuracy": metrics["eval_accuracy"],
                  "eval_f1": metrics["eval_f1"], "label_names": trainer.label_names}
save()
"""


DECODERS = pytest.mark.parametrize("decoder", ["decoder", "decoder-llama"])


@pytest.mark.slow
def test_the_example_scripts_calls_train_and_evaluate_without_kiln(folders, tmp_path):
    """transformers' example scripts' calls, in a fresh interpreter without Kiln: run_mlm, run_glue (with
    --do_predict) and run_ner on the encoder folder, run_clm on each decoder preset's folder (`decoder`,
    `decoder-llama`), each training and evaluating to finite metrics; a decoder's tokenizer loads without its
    code. One child for all: the encoder's scripts run once, not once per decoder preset."""
    decoders = ["decoder", "decoder-llama"]
    results = run_child(
        SCRIPTS, tmp_path, folders / "encoder", tmp_path / "work", *(folders / name for name in decoders)
    )
    assert results.pop("tokenizer_without_code") == {name: ["transformers", True] for name in decoders}
    assert set(results) == {"mlm", *(f"clm/{name}" for name in decoders), "glue", "ner"}
    for script, metrics in results.items():
        assert metrics.pop("label_names") == ["labels"], script  # as transformers' BERT/GPT-2 heads
        assert {"eval_loss", "eval_accuracy"} <= set(metrics), script
        for name, value in metrics.items():
            if name != "predictions":
                assert isinstance(value, float) and math.isfinite(value), (script, name, value)
    assert results["glue"]["predictions"] == [12, 2]
    assert 0.0 <= results["ner"]["eval_f1"] <= 1.0


NO_TRAINER = r"""
# run_mlm_no_trainer.py: accelerate's loop, gather_for_metrics, perplexity
from accelerate import Accelerator
from torch.utils.data import DataLoader
encoder_dir = sys.argv[3]
accelerator = Accelerator()
tokenizer = transformers.AutoTokenizer.from_pretrained(encoder_dir, **load)
model = loaded(transformers.AutoModelForMaskedLM.from_pretrained(encoder_dir, **load))
collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
def dataset(texts):
    return Dataset.from_dict({"text": texts}).map(
        lambda b: tokenizer(b["text"], return_special_tokens_mask=True), batched=True, remove_columns=["text"])
train = DataLoader(dataset(sentences(32, 1)), shuffle=True, collate_fn=collator, batch_size=8)
evaluation = DataLoader(dataset(sentences(12, 2)), collate_fn=collator, batch_size=4)
no_decay = ["bias", "layer_norm.weight", "LayerNorm.weight"]
groups = [
    {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)], "weight_decay": 0.01},
    {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)], "weight_decay": 0.0},
]
optimizer = torch.optim.AdamW(groups, lr=1e-3)
scheduler = transformers.get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0, num_training_steps=4)
model, optimizer, train, evaluation, scheduler = accelerator.prepare(model, optimizer, train, evaluation, scheduler)
model.train()
train_losses = []
for batch in train:
    loss = model(**batch).loss
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    train_losses.append(loss.item())
model.eval()
losses = []
for batch in evaluation:
    with torch.no_grad():
        loss = model(**batch).loss
    losses.append(accelerator.gather_for_metrics(loss.repeat(batch["input_ids"].shape[0])))
eval_loss = torch.mean(torch.cat(losses)).item()
results.update(train_losses=train_losses, eval_loss=eval_loss, perplexity=math.exp(eval_loss))
accelerator.wait_for_everyone()
accelerator.unwrap_model(model).save_pretrained(sys.argv[4], save_function=accelerator.save)
results["saved_auto_map"] = json.load(open(sys.argv[4] + "/config.json")).get("auto_map", {})
save()
"""


@pytest.mark.slow
def test_the_no_trainer_mlm_loop_runs_under_accelerate_without_kiln(folders, tmp_path):
    results = run_child(NO_TRAINER, tmp_path, folders / "encoder", tmp_path / "saved")
    assert len(results["train_losses"]) == 4 and all(math.isfinite(x) for x in results["train_losses"])
    assert math.isfinite(results["eval_loss"]) and math.isfinite(results["perplexity"])
    assert results["saved_auto_map"]["AutoModelForMaskedLM"].endswith("KilnEncoderForMaskedLM")
    assert (
        tmp_path / "saved" / "modeling_kiln_encoder.py"
    ).is_file()  # the saved folder still carries its code


# ------------------------------------------------------------------------------------------------------- PEFT
PEFT = r"""
decoder_dir, encoder_dir, adapter_dir = sys.argv[3:6]
model = loaded(transformers.AutoModelForCausalLM.from_pretrained(decoder_dir, **load))
import peft  # after the model code: Kiln's default LoRA targets must not depend on the import order
lora = peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8))
results["targets"] = sorted(lora.peft_config["default"].target_modules)
trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
results["only_adapters_train"] = bool(trainable) and all("lora_" in n for n in trainable)
ids = (torch.arange(40).view(4, 10) * 7 + 5) % 21 + 5
optimizer = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=1e-2)
losses = []
for _ in range(5):
    loss = lora(input_ids=ids, labels=ids).loss
    loss.backward(); optimizer.step(); optimizer.zero_grad()
    losses.append(loss.item())
results["losses"] = losses
lora.eval()
with torch.no_grad():
    adapted = lora(input_ids=ids).logits
lora.save_pretrained(adapter_dir)
base = loaded(transformers.AutoModelForCausalLM.from_pretrained(decoder_dir, **load))
with torch.no_grad():
    results["base_differs"] = (base(input_ids=ids).logits - adapted).abs().max().item()
    reloaded = peft.PeftModel.from_pretrained(base, adapter_dir).eval()
    results["reloaded_max_diff"] = (reloaded(input_ids=ids).logits - adapted).abs().max().item()
    merged = reloaded.merge_and_unload()
    results["merged_max_diff"] = (merged(input_ids=ids).logits - adapted).abs().max().item()
classifier = loaded(transformers.AutoModelForSequenceClassification.from_pretrained(encoder_dir, num_labels=2, **load))
seq_cls = peft.get_peft_model(classifier, peft.LoraConfig(task_type="SEQ_CLS", r=4))
results["classifier_targets"] = sorted(seq_cls.peft_config["default"].target_modules)
results["classifier_trainable"] = [n for n, p in seq_cls.named_parameters() if p.requires_grad and "lora_" not in n]
save()
"""


@pytest.mark.slow
@DECODERS
def test_peft_lora_defaults_train_save_and_reload_equal_without_kiln(folders, tmp_path, decoder):
    results = run_child(PEFT, tmp_path, folders / decoder, folders / "encoder", tmp_path / "adapter")
    assert results["targets"] == ["qkv"] and results["classifier_targets"] == ["qkv"]
    assert results["only_adapters_train"]
    assert results["losses"][-1] < results["losses"][0]
    assert results["base_differs"] > 1e-3  # the adapter changed the model...
    assert results["reloaded_max_diff"] < 1e-5 and results["merged_max_diff"] < 1e-4  # ...and reloads exactly
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    trainable_head = results["classifier_trainable"]  # PEFT's SEQ_CLS keeps the new head trainable
    assert trainable_head and all(".classifier." in name for name in trainable_head), trainable_head


# ------------------------------------------------------------------------------------- sentence-transformers
SENTENCE_TRANSFORMERS = r"""
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments, losses
encoder_dir, work = sys.argv[3:5]
model = SentenceTransformer(encoder_dir, trust_remote_code=True, device="cpu")
loaded(model[0].auto_model)
texts = sentences(4, 3)
before = model.encode(texts, convert_to_tensor=True)
results["embeddings"] = before.tolist()
train = Dataset.from_dict({"anchor": sentences(16, 4), "positive": sentences(16, 5)})
trainer = SentenceTransformerTrainer(
    model=model, train_dataset=train, loss=losses.MultipleNegativesRankingLoss(model),
    args=SentenceTransformerTrainingArguments(output_dir=work, max_steps=2, per_device_train_batch_size=8,
                                              report_to="none", save_strategy="no"),
)
output = trainer.train()
results["train_loss"] = output.training_loss
results["moved"] = (model.encode(texts, convert_to_tensor=True) - before).abs().max().item()
save()
"""


@pytest.mark.slow
def test_sentence_transformers_encodes_and_fits_without_kiln(folders, tmp_path):
    from pretrain.modeling import KilnEncoderModel

    results = run_child(SENTENCE_TRANSFORMERS, tmp_path, folders / "encoder", tmp_path / "work")
    assert math.isfinite(results["train_loss"]) and results["moved"] > 0
    # encode = the mean of the encoder's last hidden states over the real tokens (sentence-transformers' pooling)
    texts = sentences(4, 3)
    batch = tokenizer()(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        states = KilnEncoderModel.from_pretrained(folders / "encoder").eval()(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    expected = (states * mask).sum(1) / mask.sum(1)
    torch.testing.assert_close(torch.tensor(results["embeddings"]), expected, atol=1e-5, rtol=1e-4)


# -------------------------------------------------------------------------- torch.export and static caches
EXPORT = r"""
encoder_dir, decoder_dirs = sys.argv[3], sys.argv[4:]
ids = (torch.arange(24).view(2, 12) * 7 + 3) % 21 + 5
mask = torch.ones_like(ids); mask[1, 9:] = 0
other = (torch.arange(21).view(3, 7) * 5 + 1) % 21 + 5
other_mask = torch.ones_like(other); other_mask[0, 5:] = 0
batch, length = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("length", min=2, max=32)
shapes = {"input_ids": {0: batch, 1: length}, "attention_mask": {0: batch, 1: length}}

classifier = loaded(transformers.AutoModelForSequenceClassification.from_pretrained(encoder_dir, num_labels=3, **load)).eval()
program = torch.export.export(classifier, (ids,), {"attention_mask": mask}, dynamic_shapes=shapes)
with torch.no_grad():
    results["classifier_export_diff"] = max(
        (program.module()(x, attention_mask=m).logits - classifier(x, attention_mask=m).logits).abs().max().item()
        for x, m in ((ids, mask), (other, other_mask)))

for decoder_dir in decoder_dirs:
    name = decoder_dir.rsplit("/", 1)[-1]
    causal_lm = loaded(transformers.AutoModelForCausalLM.from_pretrained(decoder_dir, **load)).eval()
    program = torch.export.export(causal_lm, (ids,), {"attention_mask": mask, "use_cache": False}, dynamic_shapes={**shapes, "use_cache": None})
    with torch.no_grad():
        diffs = []
        for x, m in ((ids, mask), (other, other_mask)):
            real = m.bool()
            exported = program.module()(x, attention_mask=m, use_cache=False).logits
            diffs.append((exported - causal_lm(x, attention_mask=m, use_cache=False).logits)[real].abs().max().item())
        results[f"{name}/decoder_export_diff"] = max(diffs)

    prompt = ids[:, :6].clone(); prompt_mask = torch.ones_like(prompt); prompt_mask[1, :2] = 0  # left padding
    generated = {}
    for cache in ("dynamic", "static"):
        out = causal_lm.generate(prompt, attention_mask=prompt_mask, max_new_tokens=6, do_sample=False,
                                 cache_implementation=cache, output_scores=True, return_dict_in_generate=True)
        generated[cache] = (out.sequences, torch.stack(out.scores))
    results[f"{name}/static_equal_tokens"] = torch.equal(generated["static"][0], generated["dynamic"][0])
    results[f"{name}/static_scores_diff"] = (generated["static"][1] - generated["dynamic"][1]).abs().max().item()
    results[f"{name}/new_tokens"] = generated["static"][0].shape[1] - prompt.shape[1]
save()
"""


@pytest.mark.slow
def test_torch_export_and_static_cache_generate_without_kiln(folders, tmp_path):
    """In a fresh interpreter without Kiln: torch.export of the encoder's sequence classifier and of each decoder
    preset's causal LM (`decoder`, `decoder-llama`), with a dynamic batch and length, gives the eager logits; each
    decoder generates the same tokens and scores with a static cache as with the dynamic one. One child for both
    presets: the classifier is exported once, not once per decoder preset."""
    decoders = ["decoder", "decoder-llama"]
    results = run_child(EXPORT, tmp_path, folders / "encoder", *(folders / name for name in decoders))
    assert results["classifier_export_diff"] < 1e-5
    for name in decoders:
        assert results[f"{name}/decoder_export_diff"] < 1e-5, name
        assert results[f"{name}/static_equal_tokens"] and results[f"{name}/new_tokens"] == 6, name
        assert results[f"{name}/static_scores_diff"] < 1e-5, name
