"""Zero-shot BLiMP scoring (pretrain/zero_shot): right three ways, and the command that reports it.

(a) Kiln's batched scores equal a sentence-by-sentence computation with transformers' own GPT2LMHeadModel and
BertForMaskedLM converted from the same weights; (b) lm-evaluation-harness's `hf` model on a Kiln decoder folder,
with lm-eval's BLiMP tasks reading the shipped files, gives the same accuracies; (c) a model set to prefer one
token scores a hand-made set of pairs as constructed, ties counting as wrong.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from kiln_testing import REPO

from pretrain.zero_shot import BlimpEvaluation, MinimalPair, ZeroShotError, read_blimp, score_sentences
from pretrain.zero_shot.blimp import PARADIGMS, blimp_accuracies, blimp_files, lm_eval_group
from pretrain.zero_shot.models import load_model
from pretrain.zero_shot.scoring import TARGET_DELIMITER, plan_batches

SAMPLE = REPO / "data" / "blimp"
SENTENCES = [
    "The cats sleep on the mat.",
    "Who should Derek hug after shocking Richard?",
    "A dog barks.",
    "Many girls insulted themselves.",
    "These boys were not wearing the hats.",
]


def python(*args, check=True, env=None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env or {})}
    done = subprocess.run(
        [sys.executable, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=300, env=env
    )
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


# ----------------------------------------------------------------------------------------------------------
# (a) the same numbers as transformers' own models, one sentence at a time


def test_pll_word_l2r_masks_the_later_tokens_of_each_word(kiln_checkpoints):
    """PLL-word-l2r (Kauf & Ivanova 2023): a token is scored with the later tokens of its own word masked too; the
    first token of a word never sees the word's other pieces. Checked against the model run copy by copy."""
    model, tokenizer, _ = load_model(str(kiln_checkpoints[0]))
    sentences = ["Derek shocked the unbelievably xylophonic teachers.", "A dog barks."]
    words = [tokenizer(s).word_ids() for s in sentences]
    assert any(
        len([w for w in ids if w == word]) > 1 for ids in words[:1] for word in set(ids) - {None}
    )  # pieces
    l2r = score_sentences(model, tokenizer, "encoder", sentences, pll="word-l2r")
    original = score_sentences(model, tokenizer, "encoder", sentences)
    for sentence, word_ids, score in zip(sentences, words, l2r):
        ids = tokenizer(sentence)["input_ids"]
        direct = 0.0
        for p, word in enumerate(word_ids):
            if word is None:
                continue
            masked = [
                tokenizer.mask_token_id if q == p or (q > p and word_ids[q] == word) else t
                for q, t in enumerate(ids)
            ]
            with torch.no_grad():
                logits = model(torch.tensor([masked])).logits[0, p].double()
            direct += float(F.log_softmax(logits, -1)[ids[p]])
        assert score == pytest.approx(direct, abs=1e-4), sentence
    assert (
        l2r[0] != original[0]
    )  # a word of several pieces: other inputs, another score (this tiny model barely
    # reads its context, so the difference is small; the loop above checks what each score is)
    one_piece_words = all(len([w for w in words[1] if w == word]) == 1 for word in set(words[1]) - {None})
    assert not one_piece_words or l2r[1] == pytest.approx(original[1], abs=1e-6)  # nothing else to mask


def test_decoder_scores_equal_gpt2_sentence_by_sentence(kiln_checkpoints):
    from pretrain.convert import to_transformers

    model, tokenizer, kind = load_model(str(kiln_checkpoints[1]))
    assert kind == "decoder"
    gpt2 = to_transformers(model).eval()
    assert type(gpt2).__name__ == "GPT2LMHeadModel"
    ours = score_sentences(model, tokenizer, "decoder", SENTENCES)
    for sentence, score in zip(SENTENCES, ours):
        # lm-eval's empty-context continuation: BOS (this tokenizer's <|endoftext|>), then " " + sentence
        ids = [tokenizer.bos_token_id] + tokenizer.encode(" " + sentence, add_special_tokens=False)
        with torch.no_grad():
            log_probs = F.log_softmax(gpt2(torch.tensor([ids])).logits[0].double(), -1)
        direct = sum(log_probs[t - 1, ids[t]].item() for t in range(1, len(ids)))
        assert score == pytest.approx(direct, abs=1e-4), sentence
    assert len(set(ours)) == len(ours) and all(score < 0 for score in ours)


def test_encoder_scores_equal_bert_pseudo_log_likelihood(kiln_checkpoints):
    from pretrain.convert import to_transformers

    model, tokenizer, kind = load_model(str(kiln_checkpoints[0]))
    assert kind == "encoder" and type(model).__name__ == "KilnEncoderForMaskedLM"
    bert = to_transformers(model).eval()
    assert type(bert).__name__ == "BertForMaskedLM"
    ours = score_sentences(model, tokenizer, "encoder", SENTENCES)
    dense = score_sentences(bert, tokenizer, "encoder", SENTENCES)  # the dense path of a non-Kiln masked LM
    for sentence, score, other in zip(SENTENCES, ours, dense):
        ids = tokenizer(sentence)["input_ids"]
        direct = 0.0
        for position in range(1, len(ids) - 1):  # each token but [CLS] and [SEP], masked in its own copy
            masked = list(ids)
            masked[position] = tokenizer.mask_token_id
            with torch.no_grad():
                logits = bert(torch.tensor([masked])).logits[0, position].double()
            direct += F.log_softmax(logits, -1)[ids[position]].item()
        assert score == pytest.approx(direct, abs=1e-4), sentence
        assert other == pytest.approx(direct, abs=1e-4), sentence


def test_scores_do_not_depend_on_batching_or_the_number_of_processes(kiln_checkpoints):
    """Each sentence lies whole in one batch, planned from the sentences alone: any split across processes sums
    to the one-process scores exactly."""
    model, tokenizer, _ = load_model(str(kiln_checkpoints[0]))
    evaluation = BlimpEvaluation(read_blimp(SAMPLE, 4, PARADIGMS[:6]), tokenizer, "encoder", budget=200)
    whole = evaluation.scorer.score(model, evaluation.encoded)
    parts = [evaluation.scorer.score(model, evaluation.encoded, rank, 3) for rank in range(3)]
    assert all((part != 0).any() for part in parts)  # every process got some
    assert torch.equal(sum(parts), whole)
    assert plan_batches([(3, 5), (1, 9), (2, 5)], budget=10) == [
        [1],
        [0],
        [2],
    ]  # longest first; within budget


# ----------------------------------------------------------------------------------------------------------
# (b) lm-evaluation-harness on a Kiln decoder folder


@pytest.mark.slow
def test_lm_eval_on_a_kiln_decoder_folder_gives_the_same_accuracy(kiln_checkpoints, tmp_path):
    """docs/zero-shot.md's lm-eval command, as a user types it: lm-eval's own blimp_<paradigm> tasks reading the
    shipped files (configs/lm-eval/blimp-sample.yaml), through its `hf` model with trust_remote_code on a Kiln
    decoder folder. Every paradigm's accuracy, and the group's mean, equal ours."""
    folder = str(kiln_checkpoints[1])
    done = subprocess.run(
        [
            "lm_eval",
            "--model",
            "hf",
            "--model_args",
            f"pretrained={folder},trust_remote_code=True",
            "--include_path",
            "configs/lm-eval",
            "--tasks",
            "kiln_blimp_sample",
            "--limit",
            "4",
            "--batch_size",
            "64",
            "--device",
            "cpu",
            "--output_path",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (written,) = tmp_path.rglob("results_*.json")
    results = json.loads(written.read_text())["results"]
    model, tokenizer, _ = load_model(folder)
    ours = BlimpEvaluation(read_blimp(SAMPLE, 4), tokenizer, "decoder").evaluate(model)
    theirs = {name: results[f"blimp_{name}"]["acc,none"] for name in PARADIGMS}
    assert theirs == {name: entry["accuracy"] for name, entry in ours["paradigms"].items()}
    assert results["kiln_blimp_sample"]["acc,none"] == pytest.approx(ours["mean"])
    assert len(set(theirs.values())) > 1  # not a constant answer


def test_the_shipped_lm_eval_group_names_every_shipped_paradigm():
    from pretrain.zero_shot.blimp import LM_EVAL_HEADER

    shipped = (REPO / "configs" / "lm-eval" / "blimp-sample.yaml").read_text()
    files = {name: f"data/blimp/{name}.jsonl.gz" for name in PARADIGMS}
    assert shipped == lm_eval_group(files, "kiln_blimp_sample", LM_EVAL_HEADER), (
        "python data/blimp/make_sample.py"
    )


# ----------------------------------------------------------------------------------------------------------
# (c) answers known by construction


class PrefersOneToken(torch.nn.Module):
    """Whatever the context, the same distribution: `favoured` e^2 times as likely as every other token, which are
    all alike. A sentence's score then depends only on where its favoured tokens are."""

    def __init__(self, vocab_size: int, favoured: int):
        super().__init__()
        self.config = type("Config", (), {"max_position_embeddings": 64})()
        self.bias = torch.nn.Parameter(torch.zeros(vocab_size))
        with torch.no_grad():
            self.bias[favoured] = 2.0

    def forward(self, input_ids, attention_mask=None):
        return {"logits": self.bias.expand(*input_ids.shape, -1)}


def one_token_words(tokenizer, kind: str, favoured: str) -> list[str]:
    """Lowercase words of the vocabulary that the tokenizer keeps as one token (after a space, for byte-level
    BPE), other than `favoured`."""
    words = []
    for token in sorted(tokenizer.get_vocab()):
        word = token[1:] if kind == "decoder" and token.startswith("\u0120") else token
        if word != favoured and word.isalpha() and word.islower() and len(word) > 1:
            if tokenizer.tokenize(TARGET_DELIMITER + word if kind == "decoder" else word) == [token]:
                words.append(word)
    return words


@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_hand_made_pairs_score_as_constructed_and_ties_are_wrong(kind, kiln_checkpoints):
    """20 pairs of two one-token words each: 10 where only the good sentence has the favoured word (right), 5
    where only the bad one has it (wrong), 5 of the same two other words swapped: every token as likely as the
    other, the same score exactly, a tie, which counts as wrong."""
    _, tokenizer, _ = load_model(str(kiln_checkpoints[0 if kind == "encoder" else 1]))
    favoured = "the"
    words = one_token_words(tokenizer, kind, favoured)
    assert len(words) >= 30, words
    (token,) = tokenizer.tokenize(" the")  # "the" (WordPiece) or "\u0120the" (byte-level BPE)
    model = PrefersOneToken(len(tokenizer), tokenizer.convert_tokens_to_ids(token))
    right = [
        MinimalPair("right", "made", f"{favoured} {words[i]}", f"{words[i + 1]} {words[i]}")
        for i in range(10)
    ]
    wrong = [
        MinimalPair("wrong", "made", f"{words[i + 1]} {words[i]}", f"{favoured} {words[i]}")
        for i in range(10, 15)
    ]
    ties = [
        MinimalPair("tie", "made", f"{words[i]} {words[i + 15]}", f"{words[i + 15]} {words[i]}")
        for i in range(15, 20)
    ]
    pairs = right + wrong + ties
    assert len(pairs) == 20
    evaluation = BlimpEvaluation(pairs, tokenizer, kind)
    good, bad = evaluation.scores(model)
    assert (good[:10] > bad[:10]).all() and (good[10:15] < bad[10:15]).all()
    assert torch.equal(good[15:], bad[15:])  # the same likelihoods in the same places: the same score exactly
    result = evaluation.evaluate(model)
    assert {name: entry["accuracy"] for name, entry in result["paradigms"].items()} == {
        "right": 1.0,
        "wrong": 0.0,
        "tie": 0.0,
    }
    assert result["mean"] == pytest.approx(1 / 3) and result["correct"] == 10 and result["pairs"] == 20


def test_summary_is_the_mean_over_paradigms_and_phenomena():
    pairs = (
        [MinimalPair("p1", "x", "a", "b")] * 4
        + [MinimalPair("p2", "x", "a", "b")] * 2
        + [MinimalPair("p3", "y", "a", "b")] * 2
    )
    result = blimp_accuracies(pairs, [1, 1, 1, 0, 0, 0, 1, 0])
    assert result["paradigms"]["p1"]["accuracy"] == 0.75 and result["paradigms"]["p2"]["accuracy"] == 0.0
    assert result["phenomena"] == {"x": 0.375, "y": 0.5} and result["phenomena_mean"] == pytest.approx(0.4375)
    assert result["mean"] == pytest.approx((0.75 + 0.0 + 0.5) / 3) and result["correct"] == 4


# ----------------------------------------------------------------------------------------------------------
# the data


def test_the_shipped_sample_is_blimp_in_its_layout():
    files = blimp_files(SAMPLE)
    assert sorted(files) == sorted(PARADIGMS) and len(PARADIGMS) == 67
    pairs = read_blimp(SAMPLE)
    assert len(pairs) == 67 * 50
    assert (
        len({p.phenomenon for p in pairs}) == 12
    )  # the paper's phenomena (s-selection is argument_structure)
    first = pairs[0]
    assert first.paradigm == "adjunct_island" and first.good == "Who should Derek hug after shocking Richard?"
    assert len(read_blimp(SAMPLE, 3, ["wh_island", "causative"])) == 6
    assert "Attribution" in (SAMPLE / "SOURCE.md").read_text()


def test_plain_and_gzipped_files_in_a_data_subfolder_read_alike(tmp_path):
    rows = [
        {
            "sentence_good": f"Good {i}.",
            "sentence_bad": f"Bad {i}.",
            "linguistics_term": "binding",
            "UID": "p",
        }
        for i in range(5)
    ]
    text = "".join(json.dumps(row) + "\n" for row in rows)
    (tmp_path / "plain" / "data").mkdir(parents=True)
    (tmp_path / "plain" / "data" / "p.jsonl").write_text(text)
    (tmp_path / "plain" / "models_summary.jsonl").write_text(
        '{"UID": "p", "lstm": 0.5}\n'
    )  # as in BLiMP's repository
    (tmp_path / "zipped").mkdir()
    with gzip.open(tmp_path / "zipped" / "p.jsonl.gz", "wt") as f:
        f.write(text)
    assert read_blimp(tmp_path / "plain", 3) == read_blimp(tmp_path / "zipped", 3)
    assert [p.good for p in read_blimp(tmp_path / "plain")] == [f"Good {i}." for i in range(5)]


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json\n", "cannot read p.jsonl"),
        ('["a list"]\n', "not a JSON object"),
        ('{"sentence_good": "A.", "linguistics_term": "x"}\n', "no text in sentence_bad"),
        ("", "holds no minimal pairs"),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path, content, message):
    (tmp_path / "p.jsonl").write_text(content)
    with pytest.raises(ZeroShotError, match=message) as caught:
        read_blimp(tmp_path)
    assert "\n" not in str(caught.value)
    with pytest.raises(ZeroShotError, match="no wh_island.jsonl"):
        read_blimp(tmp_path, paradigms=["wh_island"])
    with pytest.raises(ZeroShotError, match="does not exist"):
        read_blimp(tmp_path / "nowhere")


def test_without_a_folder_and_offline_it_is_one_line():
    """No --data folder and no Hub to read nyu-mll/blimp from: the command says so in one line."""
    done = python(
        "-m",
        "pretrain.zero_shot",
        "blimp",
        "--model",
        "nowhere/model",
        check=False,
        env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "nyu-mll/blimp" in done.stderr and "--data" in done.stderr


# ----------------------------------------------------------------------------------------------------------
# the command


def blimp_command(capsys, *args) -> tuple[int, str, str]:
    """`python -m pretrain.zero_shot blimp ARGS` in this process: (exit status, stdout, stderr)."""
    from pretrain.zero_shot.__main__ import main

    try:
        main(["blimp", *map(str, args)])
        status = 0
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else 1
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("which", [0, 1])
def test_the_command_prints_and_writes_the_accuracies(kiln_checkpoints, tmp_path, capsys, which):
    out = tmp_path / "blimp.json"
    status, printed, progress = blimp_command(
        capsys, "--model", kiln_checkpoints[which], "--data", "data/blimp", "--pairs", 2, "--json", out
    )
    assert (
        status == 0 and "scoring: " in progress and "note:" not in progress
    )  # a progress bar, nothing short
    result = json.loads(out.read_text())
    assert result["kind"] == ["encoder", "decoder"][which] and result["pairs"] == 134
    assert len(result["paradigms"]) == 67 and len(result["phenomena"]) == 12
    mean = sum(entry["accuracy"] for entry in result["paradigms"].values()) / 67
    assert result["mean"] == pytest.approx(mean) and result["correct"] == round(mean * 134)
    assert f"BLiMP: {100 * mean:.1f} (mean over 67 paradigms" in printed
    assert "island_effects" in printed and "wh_vs_that_with_gap_long_distance" in printed
    # random weights of the same shape, drawn from the seed
    scratch = [
        blimp_command(
            capsys,
            "--model",
            kiln_checkpoints[which],
            "--data",
            "data/blimp",
            "--pairs",
            5,
            "--paradigms",
            "wh_island",
            "adjunct_island",
            "--from_scratch",
            "--seed",
            seed,
            "--json",
            tmp_path / f"random-{seed}.json",
        )
        for seed in (0, 0, 1)
    ]
    assert [status for status, _, _ in scratch] == [0, 0, 0]
    # more pairs asked than the shipped sample holds (50 per paradigm): said once, and the 50 are scored
    status, _, said = blimp_command(
        capsys,
        "--model",
        kiln_checkpoints[which],
        "--data",
        "data/blimp",
        "--pairs",
        60,
        "--paradigms",
        "wh_island",
        "--json",
        tmp_path / "short.json",
    )
    assert status == 0 and json.loads((tmp_path / "short.json").read_text())["pairs"] == 50
    assert (
        said.count("note:") == 1
        and "note: --pairs 60: 1 of 1 paradigms hold fewer pairs (at most 50); scoring the 50 pairs there are"
        in said
    ), said
    results = [json.loads((tmp_path / f"random-{seed}.json").read_text()) for seed in (0, 1)]
    assert results[0]["from_scratch"] is True and results[0]["pairs"] == 10
    assert scratch[0][1].split("\n")[:-2] == scratch[1][1].split("\n")[:-2]  # the same seed, the same report


def test_the_command_refuses_what_it_cannot_score_in_one_line(kiln_checkpoints, tmp_path, capsys):
    run_folder = kiln_checkpoints[0].parent
    status, _, err = blimp_command(capsys, "--model", run_folder, "--data", "data/blimp")
    assert status == 2 and err.count("\n") == 1 and f"{run_folder}/final" in err
    status, _, err = blimp_command(capsys, "--model", kiln_checkpoints[0], "--data", tmp_path)
    assert status == 2 and err.count("\n") == 1 and "holds no <paradigm>.jsonl" in err
    status, _, err = blimp_command(capsys, "--model", tmp_path / "nothing", "--data", "data/blimp")
    assert (
        status == 2
        and f"no model folder {tmp_path / 'nothing'}; train one first" in err
        and err.count("\n") == 1
    )
    done = python("-m", "pretrain.zero_shot", check=False)  # as a user types it
    assert (
        done.returncode == 2 and done.stderr.startswith("error: name a task") and done.stderr.count("\n") == 1
    )


def test_a_missing_model_folder_is_named_in_one_line_before_the_data_or_the_hub(capsys, monkeypatch):
    """A path that is not there (./, /, ~, runs/, more than one /, no Hub id's form) is named as a missing folder
    before BLiMP or the Hub is read; offline, a Hub id not in the cache says which flag or folder to use."""
    import huggingface_hub

    import pretrain.zero_shot.blimp

    def no_network(*args, **kwargs):
        raise AssertionError("the Hub was asked")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    read_blimp = pretrain.zero_shot.blimp.read_blimp
    monkeypatch.setattr(pretrain.zero_shot.blimp, "read_blimp", no_network)
    for spec in ("runs/decoder-tiny/final", "./nowhere", "/nowhere/model", "~/nowhere", "a/b/c", "not an id"):
        status, _, err = blimp_command(capsys, "--model", spec)
        assert status == 2 and err.count("\n") == 1, err
        assert (
            err.startswith(f"error: no model folder {spec}; train one first (") and "or give a Hub id" in err
        )
    monkeypatch.setattr(pretrain.zero_shot.blimp, "read_blimp", read_blimp)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    status, _, err = blimp_command(
        capsys,
        "--model",
        "nobody-kiln/never-cached",
        "--data",
        "data/blimp",
        "--pairs",
        1,
        "--paradigms",
        "wh_island",
    )
    assert status == 2 and err.count("\n") == 1, err
    assert "nobody-kiln/never-cached is not in the Hugging Face cache and HF_HUB_OFFLINE is set" in err


def test_a_folder_without_its_scoring_head_is_refused_naming_what_it_holds(tmp_path, capsys):
    """A fine-tuned classifier or tagger, an ELECTRA discriminator: their weights hold no masked-LM head, and
    scored through a random one they gave a BLiMP number that meant nothing (issue 48, item 4). Refused by the
    classes their config.json names, and, where it names none, by the weights the scoring model lacks."""
    from test_transformers_start import transformers_folder, wordpiece_tokenizer

    from pretrain.modeling import KilnEncoderConfig, KilnEncoderForSequenceClassification

    classifier = tmp_path / "classify-final"
    config = KilnEncoderConfig(
        vocab_size=wordpiece_tokenizer(classifier),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=37,
        num_labels=2,
    )
    KilnEncoderForSequenceClassification(config).save_pretrained(classifier)
    tagger, discriminator = tmp_path / "tag-final", tmp_path / "electra"
    transformers_folder(tagger, "BertForTokenClassification")
    transformers_folder(discriminator, "ElectraForPreTraining")
    fine_tuned = (
        "not a masked-LM or causal-LM head to score sentences with; score the pretrained model it was "
        "fine-tuned from (a pretraining run's final/) or another model"
    )
    refused = {
        (classifier,): f"{classifier} holds KilnEncoderForSequenceClassification (a sequence classification "
        f"head), {fine_tuned}",
        (tagger, "--kind", "encoder"): f"{tagger} holds BertForTokenClassification (a token classification "
        f"head), {fine_tuned}",
        (
            discriminator,
        ): f"{discriminator} is an ELECTRA discriminator (ElectraForPreTraining), which has no "
        f"masked-LM head to score sentences with; score its generator ({discriminator}/generator) or another model",
    }
    for args, line in refused.items():
        status, printed, err = blimp_command(capsys, "--model", *args, "--data", "data/blimp", "--pairs", 1)
        assert (status, err, printed) == (2, f"error: --model {line}\n", ""), err
    # a config.json that names no class: the weights the masked LM needs, missing, say it
    unnamed = tmp_path / "unnamed"
    shutil.copytree(classifier, unnamed)
    written = json.loads((unnamed / "config.json").read_text())
    del written["architectures"]
    (unnamed / "config.json").write_text(json.dumps(written))
    status, printed, err = blimp_command(capsys, "--model", unnamed, "--data", "data/blimp", "--pairs", 1)
    assert status == 2 and err.count("\n") == 1 and printed == "", err
    assert err.startswith(
        f"error: --model {unnamed} (kiln_encoder) lacks weights its masked-LM model needs (mlm_head."
    ), err
    # --from_scratch asks for random weights of its shape: not refused
    status, _, _ = blimp_command(
        capsys,
        "--model",
        classifier,
        "--data",
        "data/blimp",
        "--pairs",
        1,
        "--paradigms",
        "wh_island",
        "--from_scratch",
    )
    assert status == 0


def test_json_into_a_folder_that_cannot_take_it_is_refused_before_scoring(tmp_path, capsys, monkeypatch):
    import pretrain.zero_shot.models

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before --json was checked")

    monkeypatch.setattr(pretrain.zero_shot.models, "load_model", never)
    missing = tmp_path / "missing" / "blimp.json"
    said = (
        f"error: --json {missing}: its folder {missing.parent} does not exist; create it first or name "
        "another file\n"
    )
    model = ["--model", tmp_path / "model", "--data", "data/blimp"]
    assert blimp_command(capsys, *model, "--json", missing) == (2, "", said)
    status, _, err = blimp_command(capsys, *model, "--json", tmp_path)
    assert status == 2 and err.startswith(f"error: --json {tmp_path} is a folder; name a file to write")
    # as a user types it, in a fresh process
    done = python("-m", "pretrain.zero_shot", "blimp", *model, "--json", missing, check=False)
    assert (done.returncode, done.stderr) == (2, said)
    assert not missing.parent.exists()


# ----------------------------------------------------------------------------------------------------------
# in the pretraining loop: --eval.blimp


def final_blimp(output_dir) -> float:
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["eval/blimp"] for row in rows if "eval/blimp" in row][-1]


@pytest.mark.slow
def test_in_loop_blimp_on_two_processes_is_the_one_process_score_of_the_same_weights(tmp_path):
    """`--eval.blimp 3` on two CPU processes (each scoring its share of the batches): the final evaluation's
    eval/blimp is exactly what one process gives the saved final/ weights; on the progress line and the card."""
    from kiln_testing import launch_two_processes

    out = tmp_path / "two"
    done = launch_two_processes(
        out,
        "--eval.blimp",
        3,
        "--training.max_steps",
        2,
        "--training.eval_steps",
        2,
        "--training.save_steps",
        0,
    )
    two = final_blimp(out)
    assert f"eval/blimp {two:.4g}" in done.stdout + done.stderr
    model, tokenizer, _ = load_model(str(out / "final"))
    one = BlimpEvaluation(read_blimp(SAMPLE, 3), tokenizer, "encoder").evaluate(model)
    assert two == one["mean"]
    assert 0.3 < two < 0.7  # two steps: near chance
    assert "| blimp |" in (out / "final" / "README.md").read_text()


def test_in_loop_blimp_of_a_decoder_is_the_command_s_score(tmp_path, capsys):
    from kiln_testing import DECODER, run

    out = tmp_path / "dec"
    run(
        out,
        *DECODER,
        "--eval.blimp",
        2,
        "--training.max_steps",
        2,
        "--training.eval_steps",
        2,
        "--training.save_steps",
        0,
    )
    status, _, _ = blimp_command(
        capsys,
        "--model",
        out / "final",
        "--data",
        "data/blimp",
        "--pairs",
        2,
        "--json",
        tmp_path / "dec.json",
    )
    assert status == 0 and final_blimp(out) == json.loads((tmp_path / "dec.json").read_text())["mean"]


def test_in_loop_blimp_refuses_what_it_cannot_score_in_one_line(tmp_path, capsys):
    from kiln_testing import cli_in_process

    status, err = cli_in_process(
        capsys, "--eval.blimp", 5, "--model.objective", "electra", "--training.output_dir", tmp_path / "e"
    )
    assert status != 0 and len(err) == 1 and "ELECTRA's discriminator has none" in err[0]
    status, err = cli_in_process(
        capsys,
        "--eval.blimp",
        5,
        "--eval.blimp_data",
        tmp_path / "none",
        "--training.output_dir",
        tmp_path / "n",
    )
    assert status != 0 and len(err) == 1 and "eval.blimp" in err[0] and "does not exist" in err[0]
    status, err = cli_in_process(capsys, "--eval.blimp", -1, "--training.output_dir", tmp_path / "m")
    assert status != 0 and len(err) == 1 and err[0] == "error: --eval.blimp must be an integer >= 0, got -1"


# ----------------------------------------------------------------------------------------------------------
# the results


def test_the_blimp_table_of_results_md_is_the_records():
    """docs/results.md's BLiMP table is what experiments/blimp_results.py makes of docs/results/blimp.jsonl; each
    record's mean is the mean of its paradigms, and names a pretraining record of docs/results/runs.jsonl."""
    python("experiments/blimp_results.py", "update", "--check")
    records = [
        json.loads(line)
        for line in (REPO / "docs/results/blimp.jsonl").read_text().splitlines()
        if line.strip()
    ]
    runs = {
        json.loads(line)["tag"]
        for line in (REPO / "docs/results/runs.jsonl").read_text().splitlines()
        if line.strip()
    }
    assert records
    for record in records:
        assert len(record["paradigms"]) == 67 and len(record["phenomena"]) == 12, record["name"]
        assert record["mean"] == pytest.approx(sum(record["paradigms"].values()) / 67), record["name"]
        if record["kind"] in ("unigram", "bigram"):  # word counts of a corpus, no model and no pretraining
            assert record["pretraining"] == "none" and "experiments/blimp_frequency.py" in record["command"]
        else:
            assert record["pretraining"] in runs and "pretrain.zero_shot blimp" in record["command"], record[
                "name"
            ]
    text = (REPO / "docs/results.md").read_text()
    latest = {record["name"]: record for record in records}  # a rerun of a name replaces its earlier record
    for record in latest.values():
        phenomena = 100 * sum(record["phenomena"].values()) / 12
        assert f"| {100 * record['mean']:.1f} | {phenomena:.1f} | {record['pairs']:,} |" in text, record[
            "name"
        ]
    assert "| LSTM (paper) | | 69.8 |" in text and "| GPT-2 (124M, WebText) (paper) | | 83.0 |" in text


def test_the_targets_name_the_best_of_each_kind_on_all_pairs_and_the_gap():
    """The statement of the targets takes, per budget, the best decoder and encoder scored on all 67,000 pairs
    (a 6,700-pair screen does not count, however high), says by how much each misses or meets the target, and
    says so when a budget has no such model."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kiln_blimp_results", REPO / "experiments/blimp_results.py")
    blimp_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(blimp_results)

    def row(name, kind, mean, pairs=67_000, minutes=30.0):
        return {
            "name": name,
            "pretraining": name,
            "kind": kind,
            "mean": mean,
            "pairs": pairs,
            "minutes": minutes,
        }

    rows = [
        row("dec-a", "decoder", 0.590),
        row("dec-b", "decoder", 0.605),
        row("dec-screen", "decoder", 0.700, pairs=6_700),
        row("enc-a", "encoder", 0.630),
        row("enc-long", "encoder", 0.650, minutes=180.0),
    ]
    (said,) = [line for line in blimp_results.targets_said(rows, {}) if line]
    assert "the best decoder (`dec-b`) 60.5, short by 1.5" in said
    assert "the best encoder (`enc-a`) 63.0, meets it by 1.0" in said
    assert "3 CPU-hours, target 68: the best encoder (`enc-long`) 65.0, short by 3.0" in said
    assert "dec-screen" not in said
    (said,) = [line for line in blimp_results.targets_said(rows[:1], {}) if line]
    assert "3 CPU-hours: no model scored on all pairs yet, against a target of 68" in said
    # the best model's recipe at other seeds: their mean is read against the target too, a screen left out
    rows += [row("enc-a-s2", "encoder", 0.600), row("enc-a-s3", "encoder", 0.700, pairs=6_700)]
    (said,) = [line for line in blimp_results.targets_said(rows, {}) if line]
    assert (
        "(`enc-a`) 63.0, meets it by 1.0 (its recipe over 2 seeds: 63.0, 60.0; mean 61.5, short by 0.5)"
        in said
    )
    assert "(`dec-b`) 60.5, short by 1.5;" in said


def test_a_replica_is_set_beside_the_record_its_shipped_config_names():
    """A record named `<config>-replica` on all pairs is set beside the record its config's header names
    (`record `NAME``), with the difference and whether it lands within the 1-point tolerance; a replica scored
    on a 6,700-pair screen is not said, and a config naming no record is an error."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kiln_blimp_replica", REPO / "experiments/blimp_results.py")
    blimp_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(blimp_results)
    named = blimp_results.replicated_record(REPO / "configs/pretrain/best-30min-decoder.yaml")

    def row(name, mean, pairs=67_000):
        return {"name": name, "mean": mean, "pairs": pairs, "commit": "abc1234"}

    rows = {named: row(named, 0.602), "best-30min-decoder-replica": row("best-30min-decoder-replica", 0.596)}
    (said,) = [line for line in blimp_results.replications_said(rows) if line]
    assert f"59.6 against its record `{named}`'s 60.2 (-0.6, within the 1 point" in said
    rows["best-30min-decoder-replica"]["mean"] = 0.587
    (said,) = [line for line in blimp_results.replications_said(rows) if line]
    assert "(-1.5, outside the 1 point" in said
    rows["best-30min-decoder-replica"]["pairs"] = 6_700
    assert blimp_results.replications_said(rows) == []
    with pytest.raises(ValueError, match="names no BLiMP record"):
        blimp_results.replicated_record(REPO / "configs/pretrain/debug.yaml")


def test_the_long_target_is_read_off_a_line_through_a_recipes_short_and_long_models():
    """The 3-hour target's prediction pairs a shipped long config's record with the record of the recipe its
    `_base_` stretches, reads the gain per doubling of steps from the two, and says how many doublings and
    CPU-hours the target lies past the long run; a long model without its short one on all pairs, or a line
    that does not rise, is said accordingly."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kiln_blimp_scaling", REPO / "experiments/blimp_results.py")
    blimp_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(blimp_results)
    short = blimp_results.scaled_from(REPO / "configs/pretrain/best-3h-decoder.yaml")
    assert short == blimp_results.replicated_record(REPO / "configs/pretrain/best-30min-decoder.yaml")
    assert blimp_results.scaled_from(REPO / "configs/pretrain/best-30min-decoder.yaml") is None

    def row(name, mean, minutes, pairs=67_000):
        return {
            "name": name,
            "pretraining": name,
            "kind": "decoder",
            "mean": mean,
            "pairs": pairs,
            "minutes": minutes,
        }

    records = {short: row(short, 0.60, 30.0), "best-3h-decoder": row("best-3h-decoder", 0.64, 180.0)}
    runs = {short: {"steps": 1000}, "best-3h-decoder": {"steps": 4000}}
    (said,) = [line for line in blimp_results.scaling_said(records, runs, []) if line]
    # 4 points over 2 doublings: 2 per doubling, 68 lies 2 doublings past 3 hours, 12 CPU-hours
    assert "gained 4.0 over 4× the steps" in said and "2.0 per doubling" in said
    assert "68 lies 2.0 doublings past 3 hours: about 12 CPU-hours of this model" in said
    curve = {
        "name": "best-3h-decoder",
        "points": [{"tokens": 2**k, "blimp": 0.5 + 0.01 * k} for k in (1, 2, 3)],
    }
    (said,) = [line for line in blimp_results.scaling_said(records, runs, [curve]) if line]
    assert "(`best-3h-decoder` 1.0, least squares)" in said
    records["best-3h-decoder"]["mean"] = 0.59
    (said,) = [line for line in blimp_results.scaling_said(records, runs, []) if line]
    assert "the line does not rise, so no budget reaches 68" in said
    records[short]["pairs"] = 6_700
    assert blimp_results.scaling_said(records, runs, []) == []
    assert blimp_results.two_figures(21_806.4) == "22,000" and blimp_results.two_figures(91.6) == "92"


def test_bf16_is_set_beside_its_fp32_twins_at_equal_steps_and_at_equal_minutes():
    """Records `<name>-fp32...` are said beside record `<name>` (BLiMP and each run's eval loss): at the same steps,
    or at the same minutes with the fp32 run's fewer steps; a twin on other pairs, or at neither the same steps nor
    the same minutes, is left out."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "kiln_blimp_precision", REPO / "experiments/blimp_results.py"
    )
    blimp_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(blimp_results)

    def row(name, mean, minutes, pairs=67_000):
        return {"name": name, "pretraining": name, "mean": mean, "pairs": pairs, "minutes": minutes}

    def run(loss, steps):
        return {"steps": steps, "eval_last": {"eval/loss": loss}}

    records = {
        "dec": row("dec", 0.602, 30.0),
        "dec-fp32": row("dec-fp32", 0.597, 43.0),
        "dec-fp32-30min": row("dec-fp32-30min", 0.580, 30.0),
        "other": row("other", 0.55, 30.0),
    }
    runs = {"dec": run(3.9861, 3600), "dec-fp32": run(3.9790, 3600), "dec-fp32-30min": run(4.1, 2555)}
    runs["other"] = run(4.0, 3600)
    (said,) = [line for line in blimp_results.precision_said(records, runs) if line]
    assert "`dec` in bf16 60.2 on 67,000 pairs (eval loss 3.986, 3,600 steps in 30 min)" in said
    assert (
        "at the same 3,600 steps (43 min) in fp32 (`dec-fp32`) 59.7 (eval loss 3.979), +0.5 for bf16" in said
    )
    assert (
        "at the same 30 minutes (2,555 steps) in fp32 (`dec-fp32-30min`) 58.0 (eval loss 4.100), +2.2" in said
    )
    assert "other" not in said
    runs["dec-fp32-30min"]["steps"], records["dec-fp32-30min"]["minutes"] = 3000, 36.0
    records["dec-fp32"]["pairs"] = 6_700
    assert blimp_results.precision_said(records, runs) == []


def test_the_grid_table_has_every_declared_run_with_its_change_and_its_best_scored_record():
    """Every run of experiments/grid.yaml is a row of the grid table (or named as not finished); a row says the
    settings its config makes over its base, marks the run a shipped recipe names, and takes BLiMP from the run's
    record with the most pairs."""
    import importlib.util

    import yaml

    spec = importlib.util.spec_from_file_location("kiln_blimp_grid", REPO / "experiments/blimp_results.py")
    blimp_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(blimp_results)
    assert blimp_results.config_change(
        {
            "_base_": "a.yaml",
            "data": {"mlm_probability": 0.3},
            "training": {"output_dir": "runs/x", "seed": 2},
        }
    ) == ["data.mlm_probability: 0.3", "training.seed: 2"]
    # an encoder's loss is its MLM loss, without the sentence-pair head's that MLM+SOP or MLM+NSP adds to its total
    both = {"eval_last": {"eval/loss": 4.2, "eval/mlm_loss": 3.6, "eval/nsp_loss": 0.6}}
    assert blimp_results.model_loss(both) == 3.6
    assert blimp_results.model_loss({"eval_last": {"eval/loss": 3.9}}) == 3.9
    records = blimp_results.read_records()
    text = blimp_results.grid_table(records)
    for job in yaml.safe_load((REPO / "experiments/grid.yaml").read_text())["pretrain"]:
        assert f"| `{job['name']}`" in text or f"`{job['name']}`," in text or f"`{job['name']}`." in text, job
    shipped = blimp_results.replicated_record(REPO / "configs/pretrain/best-30min-decoder.yaml")
    (row,) = [line for line in text.splitlines() if line.startswith(f"| `{shipped}`")]
    assert "(ships as `best-30min-decoder`)" in row
    scored = [r for r in records if r["pretraining"] == shipped]
    best = max(scored, key=lambda r: r["pairs"])
    assert f"| {100 * best['mean']:.1f} | {best['pairs']:,} |" in row
    base = yaml.safe_load((REPO / "configs/experiments" / f"{shipped}.yaml").read_text())
    assert all(change in row for change in blimp_results.config_change(base))
    # a screen reads against its base's screen on the same pairs; the base's own row keeps its most pairs
    screens = [
        {"name": "grid-decoder-lr2e3-p100", "pretraining": "grid-decoder-lr2e3", "pairs": 6_700, "mean": 0.6},
        {"name": "grid-decoder-p100", "pretraining": "grid-decoder", "pairs": 6_700, "mean": 0.5},
        {"name": "grid-decoder", "pretraining": "grid-decoder", "pairs": 67_000, "mean": 0.55},
    ]
    rows = blimp_results.grid_table(screens).splitlines()
    assert any(
        line.startswith("| `grid-decoder-lr2e3` |") and "| 60.0 (base 50.0) | 6,700 |" in line
        for line in rows
    )
    assert any(line.startswith("| `grid-decoder` |") and "| 55.0 | 67,000 |" in line for line in rows)
    seed_two = [r for r in records if r["pretraining"] == f"{shipped}-s2" and r["pairs"] == best["pairs"]]
    if seed_two:  # a seed-only change is set beside its base, on the same pairs
        assert (
            f"`{shipped}` {100 * best['mean']:.1f} and `{shipped}-s2` {100 * seed_two[-1]['mean']:.1f}"
            in text
        )


def test_a_grid_row_takes_its_fine_tuning_from_the_run_trained_again_marked_with_both_losses(monkeypatch):
    """A grid run whose model was not kept for fine-tuning: the UD UPOS of its config trained again
    (`NAME-retrained`) fills its row, marked ‡, and the note under the table sets that run's eval loss and CPU beside
    the first's; a row fine-tuned from its own model is not marked, and its own score wins over a retrained one."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "kiln_blimp_retrained", REPO / "experiments/blimp_results.py"
    )
    blimp_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(blimp_results)
    runs = dict(blimp_results.pretraining_records())
    first = runs["grid-decoder"]
    runs["grid-decoder-retrained"] = {
        **first,
        "eval_last": {"eval/loss": 4.0412},
        "cpu": "Intel(R) Xeon(R) Processor",
    }
    folder = "runs/ft/ud-pos-pretrained-lr4e-3-s1-"
    tuned = [
        {"run": folder + "grid-decoder-retrained", "best_accuracy": 0.8512},
        {"run": folder + "grid-encoder-retrained", "best_accuracy": 0.5},  # loses to the encoder's own model
    ]
    monkeypatch.setattr(blimp_results, "pretraining_records", lambda: runs)
    recorded = blimp_results.run_records()
    monkeypatch.setattr(blimp_results, "run_records", lambda: recorded + tuned)
    text = blimp_results.grid_table(blimp_results.read_records())
    (row,) = [line for line in text.splitlines() if line.startswith("| `grid-decoder` |")]
    assert row.endswith("| 85.12‡ |")
    own = {row["run"]: row for row in recorded}[folder + "grid-encoder"]["best_accuracy"]
    (encoder,) = [line for line in text.splitlines() if line.startswith("| `grid-encoder` |")]
    assert encoder.endswith(f"| {100 * own:.2f} |")
    assert (
        f"`grid-decoder` 4.041 on Intel Xeon (first {first['eval_last']['eval/loss']:.3f})" in text
        and "‡ fine-tuned from the run's config trained again" in text
    )


def test_a_runs_learning_curve_is_recorded_at_its_token_counts_and_said_under_the_table(
    tmp_path, monkeypatch
):
    """`blimp_results.py curve NAME` reads each in-loop evaluation of a run (step, eval loss, BLiMP sample) and
    counts its tokens from the batch layout of the run's last checkpoint; a run recorded again as it continues
    replaces its earlier points; the table's block states each point and whether the run has ended; a run without
    in-loop BLiMP is refused in one line."""
    import importlib.util

    import yaml

    spec = importlib.util.spec_from_file_location("kiln_blimp_curve", REPO / "experiments/blimp_results.py")
    blimp_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(blimp_results)
    monkeypatch.setattr(blimp_results, "LEARNING", tmp_path / "learning-curves.jsonl")
    run = tmp_path / "run"
    (run / "checkpoints" / "step-00000400").mkdir(parents=True)
    layout = {"num_processes": 2, "per_device_train_batch_size": 16, "gradient_accumulation_steps": 3}
    (run / "checkpoints" / "step-00000400" / "trainer_state.json").write_text(json.dumps(layout))
    config = {
        "model": {"kind": "encoder"},
        "data": {"max_seq_length": 64},
        "training": {"max_steps": 600},
        "eval": {"blimp": 50},
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))

    def evaluations(*steps):
        rows = [{"step": 10, "train/loss": 9.0}]
        rows += [{"step": s, "eval/loss": 5.0 - s / 1000, "eval/blimp": 0.5 + s / 10_000} for s in steps]
        (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    evaluations(200, 400)
    blimp_results.main(["curve", "enc-curve", "--run", str(run)])
    (curve,) = blimp_results.learning_curves()
    assert curve["global_batch"] == 96 and curve["pairs"] == 3_350 and curve["kind"] == "encoder"
    assert [p["tokens"] for p in curve["points"]] == [200 * 96 * 64, 400 * 96 * 64]
    assert [p["blimp"] for p in curve["points"]] == [0.52, 0.54]
    said = "\n".join(blimp_results.learning_said([curve]))
    assert "| `enc-curve` (at step 400 of 600) | 2 | 1M 52.0, 2M 54.0 |" in said

    evaluations(200, 400, 600)  # the run continued to its end and is recorded again
    blimp_results.main(["curve", "enc-curve", "--run", str(run)])
    (curve,) = blimp_results.learning_curves()
    said = "\n".join(blimp_results.learning_said([curve]))
    assert "| `enc-curve` | 3 | 1M 52.0, 2M 54.0, 4M 56.0 |" in said
    assert "3,350 pairs, so a point moves about ±0.9 by chance" in said

    evaluations()
    with pytest.raises(SystemExit, match="no in-loop BLiMP"):
        blimp_results.main(["curve", "enc-curve", "--run", str(run)])


def test_the_babylm_baselines_are_rows_of_the_blimp_table_from_their_pinned_sources():
    """Each line of docs/results/blimp-published.jsonl is a row of the BLiMP table: its BLiMP mean as given, or the
    mean of its 12 phenomena computed from the per-phenomenon accuracies its source prints; every source is pinned
    to a commit, and the phenomena are BLiMP's own 12 (the names the Kiln records use)."""
    import importlib.util
    import re

    spec = importlib.util.spec_from_file_location(
        "kiln_blimp_published", REPO / "experiments/blimp_results.py"
    )
    blimp_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(blimp_results)
    published = blimp_results.published_rows()
    assert len(published) >= 5
    names = set(blimp_results.read_records()[-1]["phenomena"])
    text = blimp_results.table(blimp_results.read_records())
    for row in published:
        assert re.search(r"/blob/[0-9a-f]{40}/", row["source"]), row["source"]
        (line,) = [line for line in text.splitlines() if line.startswith(f"| {row['name']} (")]
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if row["phenomena"]:
            assert set(row["phenomena"]) == names
            assert cells[3] == f"{sum(row['phenomena'].values()) / 12:.1f}" and cells[2] == ""
        else:
            assert cells[2] == f"{row['blimp']:.1f}" and cells[3] == ""
    assert "§ the BabyLM challenges' baselines" in text
    page = (REPO / "docs/results.md").read_text()
    assert text in page, "run `python experiments/blimp_results.py update`"


def test_a_budget_is_stated_in_minutes_of_the_cpu_its_config_was_timed_on(tmp_path, monkeypatch):
    """A run trained on another CPU than the one its config's budget was timed on states its minutes on the
    config's CPU (the `Budget:` line, wrapped over header lines or not); a config without one takes the nearest of
    its `_base_` files' (its own line wins; a loop ends), and with none in its chain the CPU the run trained on."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "kiln_blimp_budget_cpu", REPO / "experiments/blimp_results.py"
    )
    blimp_results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(blimp_results)
    monkeypatch.setattr(blimp_results, "REPO", tmp_path)
    (tmp_path / "timed.yaml").write_text(
        "# Budget: 3,531 steps = the base's 3,600 x the tokens/s ratio on one core of an AMD EPYC with\n"
        "# avx512_bf16 (measured beside another run)\n_base_: base.yaml\n"
    )
    (tmp_path / "untimed.yaml").write_text("# a config without a budget line\n_base_: base.yaml\n")
    # a config changing only the rate keeps its base's steps, so its base's budget line times them
    (tmp_path / "rate.yaml").write_text(
        "# the base at another peak rate\n_base_: [untimed.yaml, timed.yaml]\n"
    )
    (tmp_path / "own.yaml").write_text(
        "# Budget: 900 steps = 30 minutes on one core of an Intel Xeon with amx_bf16\n_base_: timed.yaml\n"
    )
    (tmp_path / "loop-a.yaml").write_text("_base_: loop-b.yaml\n")
    (tmp_path / "loop-b.yaml").write_text("_base_: loop-a.yaml\n")
    # the same loop through `../`, each turn a longer spelling of the same two files
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "loop-c.yaml").write_text("_base_: ../up/loop-d.yaml\n")
    (tmp_path / "up" / "loop-d.yaml").write_text("_base_: ../up/loop-c.yaml\n")
    xeon = "Intel(R) Xeon(R) Processor"
    runs = {
        name: {"cpu": xeon, "command": f"accelerate launch pretrain/run.py --config {name}.yaml --x y"}
        for name in ("timed", "untimed", "rate", "own", "loop-a", "up/loop-c")
    }
    runs["gone"] = {"cpu": xeon, "command": "accelerate launch pretrain/run.py --config missing.yaml"}
    assert blimp_results.budget_cpu({"pretraining": "timed"}, runs) == "AMD EPYC"
    assert blimp_results.budget_cpu({"pretraining": "untimed"}, runs) == "Intel Xeon"
    assert blimp_results.budget_cpu({"pretraining": "rate"}, runs) == "AMD EPYC"
    assert blimp_results.budget_cpu({"pretraining": "own"}, runs) == "Intel Xeon"
    assert blimp_results.budget_cpu({"pretraining": "loop-a"}, runs) == "Intel Xeon"
    assert blimp_results.budget_cpu({"pretraining": "up/loop-c"}, runs) == "Intel Xeon"
    assert blimp_results.budget_cpu({"pretraining": "gone"}, runs) == "Intel Xeon"
    assert blimp_results.budget_cpu({"pretraining": "old", "cpu": xeon}, runs) == "Intel Xeon†"
