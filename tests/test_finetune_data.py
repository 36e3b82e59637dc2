"""Task data helpers: CoNLL/CoNLL-U readers, label maps, word -> piece alignment, loaders and their errors, and
the shipped samples. CoNLL-2003 is never read here (its licence forbids shipping it): NER files are synthetic."""

import csv
import gzip
import json
from pathlib import Path

import pytest
from datasets import ClassLabel, Dataset, Features, Value
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from finetune.data import (
    IGNORE_INDEX,
    FinetuneDataError,
    align_labels_with_tokens,
    b_to_i_map,
    build_label_maps,
    collect_labels,
    encode_labels,
    is_regression,
    load_classification_data,
    load_seq2seq_data,
    load_tagging_data,
    read_conll,
    read_conllu,
    tokenize_and_align,
    words_from_predictions,
)

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "finetune"

CONLL_NER = """-DOCSTART- -X- -X- O

John NNP B-NP B-PER
Smith NNP I-NP I-PER
visited VBD B-VP O
Paris NNP B-NP B-LOC
. . O O

-DOCSTART- -X- -X- O

Acme NNP B-NP B-ORG
hired VBD B-VP O
Mary NNP B-NP B-PER
"""

CONLLU = """# sent_id = s1
# text = I don't know.
1\tI\tI\tPRON\tPRP\t_\t4\tnsubj\t_\t_
2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
2\tdo\tdo\tAUX\tVBP\t_\t4\taux\t_\t_
3\tn't\tnot\tPART\tRB\t_\t4\tadvmod\t_\t_
4\tknow\tknow\tVERB\tVB\t_\t0\troot\t_\t_
5\t.\t.\tPUNCT\t.\t_\t4\tpunct\t_\t_

# sent_id = s2
1\tGo\tgo\tVERB\tVB\t_\t0\troot\t_\t_
1.1\tgo\tgo\tVERB\tVB\t_\t_\t_\t0:root\t_
2\thome\thome\tADV\tRB\t_\t1\tadvmod\t_\t_

"""


def write(path: Path, text: str) -> str:
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode("utf-8")))
    else:
        path.write_text(text, encoding="utf-8")
    return str(path)


def write_csv(path: Path, rows: list[tuple], header=("sentence", "label")) -> str:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


def write_jsonl(path: Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return str(path)


def tiny_wordpiece_tokenizer() -> PreTrainedTokenizerFast:
    vocab = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "john",
        "smith",
        "visit",
        "##ed",
        "paris",
        "new",
        "york",
        "##s",
    ]
    backend = Tokenizer(models.WordPiece({token: i for i, token in enumerate(vocab)}, unk_token="[UNK]"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]"
    )


# --- readers ---------------------------------------------------------------------------------------------


def test_read_conll_skips_docstart_and_splits_sentences(tmp_path):
    dataset = read_conll(write(tmp_path / "ner.txt", CONLL_NER))
    assert dataset["tokens"] == [["John", "Smith", "visited", "Paris", "."], ["Acme", "hired", "Mary"]]
    assert dataset["tags"] == [["B-PER", "I-PER", "O", "B-LOC", "O"], ["B-ORG", "O", "B-PER"]]
    pos = read_conll(write(tmp_path / "ner.txt.gz", CONLL_NER), tag_column=1)
    assert pos["tags"][1] == ["NNP", "VBD", "NNP"]


def test_read_conll_names_the_line_without_the_tag_column(tmp_path):
    path = write(tmp_path / "bad.conll", "John B-PER\nSmith\n")
    with pytest.raises(FinetuneDataError, match=r"bad.conll:2 has 1 columns"):
        read_conll(path, tag_column=1)


def test_read_conllu_skips_comments_multiword_ranges_and_empty_nodes(tmp_path):
    for name in ("ud.conllu", "ud.conllu.gz"):
        dataset = read_conllu(write(tmp_path / name, CONLLU))
        assert dataset["tokens"] == [["I", "do", "n't", "know", "."], ["Go", "home"]]
        assert dataset["tags"] == [["PRON", "AUX", "PART", "VERB", "PUNCT"], ["VERB", "ADV"]]
    xpos = read_conllu(tmp_path / "ud.conllu", tag_field="xpos")
    assert xpos["tags"][0] == ["PRP", "VBP", "RB", "VB", "."]
    with pytest.raises(FinetuneDataError, match="use 'upos' or 'xpos'"):
        read_conllu(tmp_path / "ud.conllu", tag_field="deprel")


def test_read_conllu_rejects_other_column_layouts(tmp_path):
    path = write(tmp_path / "not.conllu", "1\tI\tPRON\n")
    with pytest.raises(FinetuneDataError, match="not.conllu:1 has 3 tab-separated columns, CoNLL-U needs 10"):
        read_conllu(path)


# --- labels ----------------------------------------------------------------------------------------------


def test_label_maps_are_sorted_and_keep_int_names():
    label2id, id2label = build_label_maps(["pos", "neg", "neutral", "neg"])
    assert label2id == {"neg": 0, "neutral": 1, "pos": 2}
    assert id2label == {0: "neg", 1: "neutral", 2: "pos"}
    label2id, id2label = build_label_maps([10, 2, 1, 2])  # numeric order, not "1" < "10" < "2"
    assert label2id == {1: 0, 2: 1, 10: 2}
    assert id2label == {0: 1, 1: 2, 2: 10}
    label2id, _ = build_label_maps([["O", "B-PER"], ["I-PER", "O"]])
    assert list(label2id) == ["B-PER", "I-PER", "O"]


def test_label_maps_reject_mixed_and_missing_labels():
    with pytest.raises(FinetuneDataError, match="all strings or all ints, found int, str"):
        build_label_maps(["neg", 1])
    with pytest.raises(FinetuneDataError, match="some labels are empty"):
        build_label_maps(["neg", None])


def test_is_regression_only_for_float_labels():
    assert is_regression([0.5, 3.0, 4.2])
    assert is_regression([1, 2.5])
    assert not is_regression([0, 1, 1])
    assert not is_regression(["1.5", "2"])
    assert not is_regression([True, False])


def test_b_to_i_map_pairs_each_begin_tag_with_its_inside_tag():
    label2id = {"B-LOC": 0, "B-MISC": 1, "B-PER": 2, "I-LOC": 3, "I-PER": 4, "O": 5}
    assert b_to_i_map(label2id) == {0: 3, 2: 4}  # B-MISC has no I-MISC in this tag set


# --- alignment -------------------------------------------------------------------------------------------


def test_first_piece_gets_the_label_and_the_rest_are_ignored():
    word_ids = [None, 0, 0, 1, 2, 2, 2, None]
    word_labels = [2, 5, 0]  # B-PER, O, B-LOC
    labels = align_labels_with_tokens(word_ids, word_labels, label_all_tokens=False)
    assert labels == [IGNORE_INDEX, 2, IGNORE_INDEX, 5, 0, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]


def test_label_all_tokens_turns_b_into_i_on_continuation_pieces():
    word_ids = [None, 0, 0, 1, 2, 2, 2, None]
    word_labels = [2, 5, 0]  # B-PER, O, B-LOC
    b_to_i = {0: 3, 2: 4}  # B-LOC -> I-LOC, B-PER -> I-PER
    labels = align_labels_with_tokens(word_ids, word_labels, label_all_tokens=True, b_to_i=b_to_i)
    assert labels == [IGNORE_INDEX, 2, 4, 5, 0, 3, 3, IGNORE_INDEX]
    without_map = align_labels_with_tokens(word_ids, word_labels, label_all_tokens=True)
    assert without_map == [IGNORE_INDEX, 2, 2, 5, 0, 0, 0, IGNORE_INDEX]


def test_words_from_predictions_takes_the_first_piece_and_skips_padding():
    word_ids = [None, 0, 0, 1, 2, 2, None, -1, -1]
    pred_ids = [9, 4, 7, 5, 1, 8, 9, 9, 9, 9]  # one longer: a padded batch row
    assert words_from_predictions(pred_ids, word_ids) == [4, 5, 1]


def test_tokenize_and_align_with_a_fast_tokenizer():
    tokenizer = tiny_wordpiece_tokenizer()
    examples = {
        "tokens": [["John", "visited", "New", "Yorks"]],
        "tags": [[2, 5, 0, 3]],
    }  # B-PER O B-LOC I-LOC
    encoding = tokenize_and_align(examples, tokenizer, label_all_tokens=False, return_word_ids=True)
    pieces = tokenizer.convert_ids_to_tokens(encoding["input_ids"][0])
    assert pieces == ["[CLS]", "john", "visit", "##ed", "new", "york", "##s", "[SEP]"]
    assert encoding["labels"][0] == [IGNORE_INDEX, 2, 5, IGNORE_INDEX, 0, 3, IGNORE_INDEX, IGNORE_INDEX]
    assert encoding["word_ids"][0] == [None, 0, 1, 1, 2, 3, 3, None]

    all_pieces = tokenize_and_align(examples, tokenizer, label_all_tokens=True, b_to_i={0: 3, 2: 4})
    assert all_pieces["labels"][0] == [IGNORE_INDEX, 2, 5, 5, 0, 3, 3, IGNORE_INDEX]

    piece_predictions = [0, 2, 5, 1, 0, 3, 4, 0]
    assert words_from_predictions(piece_predictions, encoding["word_ids"][0]) == [2, 5, 0, 3]

    truncated = tokenize_and_align(examples, tokenizer, max_length=5, return_word_ids=True)
    assert truncated["labels"][0] == [IGNORE_INDEX, 2, 5, IGNORE_INDEX, IGNORE_INDEX]
    assert words_from_predictions([0, 2, 5, 1, 0], truncated["word_ids"][0]) == [2, 5]  # "New Yorks" cut off


def test_tokenize_and_align_maps_over_a_dataset():
    dataset = Dataset.from_dict({"tokens": [["John", "Smith"], ["Paris"]], "tags": [[0, 1], [2]]})
    mapped = dataset.map(
        tokenize_and_align,
        batched=True,
        fn_kwargs={"tokenizer": tiny_wordpiece_tokenizer()},
        remove_columns=dataset.column_names,
    )
    assert mapped["labels"] == [[IGNORE_INDEX, 0, 1, IGNORE_INDEX], [IGNORE_INDEX, 2, IGNORE_INDEX]]


# --- classification loading ------------------------------------------------------------------------------


def test_classification_from_csv_with_a_carved_validation_split(tmp_path):
    rows = [(f"sentence {i}", "pos" if i % 2 else "neg") for i in range(40)]
    dataset = load_classification_data(train_file=write_csv(tmp_path / "train.csv", rows), seed=0)
    assert set(dataset) == {"train", "validation"}
    assert (len(dataset["train"]), len(dataset["validation"])) == (36, 4)
    assert dataset["train"].column_names == ["text", "label"]
    assert not set(dataset["train"]["text"]) & set(dataset["validation"]["text"])
    assert collect_labels(dataset) == ["neg", "pos"]


def test_classification_sentence_pairs_and_unlabelled_tsv_test(tmp_path):
    train = tmp_path / "train.tsv"
    train.write_text(
        'sentence1\tsentence2\tlabel\nA "quoted" one\tB\t1\nC\tD\t0\nE\tF\t1\n', encoding="utf-8"
    )
    test = tmp_path / "test.tsv"
    test.write_text("index\tsentence1\tsentence2\n0\tG\tH\n", encoding="utf-8")
    dataset = load_classification_data(train_file=str(train), validation_file=str(train), test_file=str(test))
    assert dataset["train"].column_names == ["text", "text_pair", "label"]
    assert dataset["train"][0] == {"text": 'A "quoted" one', "text_pair": "B", "label": 1}
    assert dataset["test"].column_names == ["text", "text_pair"]


def test_classification_errors_name_the_problem(tmp_path):
    train = write_csv(tmp_path / "train.csv", [("good", "pos"), ("bad", "neg")])
    with pytest.raises(
        FinetuneDataError,
        match="label column 'sentiment' not found in the train split, whose columns are: sentence, label; set --data.label_column to one of them",
    ):
        load_classification_data(train_file=train, label_column="sentiment")
    unseen = write_csv(tmp_path / "dev.csv", [("meh", "neutral"), ("ok", "pos"), ("hm", "mixed")])
    with pytest.raises(FinetuneDataError, match="validation split not found in train: 'mixed', 'neutral'"):
        load_classification_data(train_file=train, validation_file=unseen)
    empty = write_csv(tmp_path / "empty.csv", [])
    with pytest.raises(FinetuneDataError, match="empty.csv is empty: it has no data rows"):
        load_classification_data(train_file=train, validation_file=empty)
    with pytest.raises(FinetuneDataError, match="train split not found in the given label_list: 'neg'"):
        load_classification_data(train_file=train, label_list=["pos", "negative"])
    with pytest.raises(FinetuneDataError, match="file not found: .*missing.csv"):
        load_classification_data(train_file=str(tmp_path / "missing.csv"))


def test_classification_float_labels_are_regression_without_label_checks(tmp_path):
    train = write_csv(tmp_path / "train.csv", [("a", 0.5), ("b", 3.0), ("c", 4.5)])
    dev = write_csv(tmp_path / "dev.csv", [("d", 2.25)])
    dataset = load_classification_data(train_file=train, validation_file=dev)
    assert is_regression(dataset["train"]["label"])
    assert dataset["validation"]["label"] == [2.25]


def test_classification_from_a_dataset_folder_turns_class_ids_into_names(tmp_path):
    # a folder of parquet files written by `datasets` keeps its ClassLabel feature, as Hub datasets do
    features = Features({"sentence": Value("string"), "label": ClassLabel(names=["negative", "positive"])})
    Dataset.from_dict(
        {"sentence": ["good", "bad", "fine"], "label": [1, 0, 1]}, features=features
    ).to_parquet(tmp_path / "train.parquet")
    Dataset.from_dict({"sentence": ["meh"], "label": [0]}, features=features).to_parquet(
        tmp_path / "validation.parquet"
    )
    Dataset.from_dict({"sentence": ["?", "!"], "label": [-1, -1]}, features=features).to_parquet(
        tmp_path / "test.parquet"
    )
    dataset = load_classification_data(dataset_name=str(tmp_path))
    assert dataset["train"]["label"] == ["positive", "negative", "positive"]
    assert dataset["validation"]["label"] == ["negative"]
    assert dataset["test"].column_names == ["text"]  # GLUE-style test set without labels


def test_encode_labels_turns_names_into_ids(tmp_path):
    train = write_csv(tmp_path / "train.csv", [("good", "pos"), ("bad", "neg"), ("fine", "pos")])
    dataset = load_classification_data(train_file=train, validation_file=train)
    label2id, _ = build_label_maps(collect_labels(dataset))
    assert encode_labels(dataset, label2id)["train"]["label"] == [1, 0, 1]
    with pytest.raises(FinetuneDataError, match="train split not found in the label maps .*: 'neg'"):
        encode_labels(dataset, {"pos": 0})


# --- tagging loading -------------------------------------------------------------------------------------


def test_tagging_from_synthetic_conll_files(tmp_path):
    train = write(tmp_path / "train.txt", CONLL_NER)
    dev = write(tmp_path / "dev.txt", "Mary NNP B-NP B-PER\nsmiled VBD B-VP O\n")
    dataset = load_tagging_data(train_file=train, validation_file=dev)
    assert dataset["validation"][0] == {"tokens": ["Mary", "smiled"], "tags": ["B-PER", "O"]}
    label2id, _ = build_label_maps(collect_labels(dataset))
    assert list(label2id) == ["B-LOC", "B-ORG", "B-PER", "I-PER", "O"]
    assert encode_labels(dataset, label2id)["validation"]["tags"] == [[2, 4]]


def test_tagging_errors_name_the_problem(tmp_path):
    train = write(tmp_path / "train.txt", CONLL_NER)
    dev = write(tmp_path / "dev.txt", "Berlin NNP B-NP B-GPE\n")
    with pytest.raises(FinetuneDataError, match="validation split not found in train: 'B-GPE'"):
        load_tagging_data(train_file=train, validation_file=dev)
    with pytest.raises(
        FinetuneDataError, match="train split not found in the given label_list: 'B-LOC', 'B-ORG'"
    ):
        load_tagging_data(train_file=train, validation_file=train, label_list=["O", "B-PER", "I-PER"])
    empty = write(tmp_path / "empty.txt", "-DOCSTART- -X- -X- O\n\n")
    with pytest.raises(FinetuneDataError, match="no sentences found in .*empty.txt"):
        load_tagging_data(train_file=train, validation_file=empty)
    ragged = write_jsonl(tmp_path / "ragged.jsonl", [{"tokens": ["a", "b"], "tags": ["O"]}])
    with pytest.raises(FinetuneDataError, match="row 0 of the train split has 2 tokens but 1 tags"):
        load_tagging_data(train_file=ragged)
    words = write_jsonl(tmp_path / "words.jsonl", [{"words": ["a"], "ner": ["O"]}])
    with pytest.raises(
        FinetuneDataError,
        match="tokens column 'tokens' not found in the train split, whose columns are: words, ner; set --data.tokens_column to one of them",
    ):
        load_tagging_data(train_file=words)


# --- seq2seq loading -------------------------------------------------------------------------------------


def test_seq2seq_from_parallel_text_files(tmp_path):
    write(tmp_path / "train.en", "A dog runs.\nTwo men talk.\n")
    write(tmp_path / "train.de", "Ein Hund rennt.\nZwei Männer reden.\n")
    dataset = load_seq2seq_data(
        train_file=str(tmp_path / "train.en"),
        validation_file=str(tmp_path / "train.en"),
        source_lang="en",
        target_lang="de",
    )
    assert dataset["train"][1] == {"source": "Two men talk.", "target": "Zwei Männer reden."}
    write(tmp_path / "short.de", "Ein Hund rennt.\n")
    write(tmp_path / "short.en", "A dog runs.\nTwo men talk.\n")
    with pytest.raises(FinetuneDataError, match="short.en has 2 lines but .*short.de has 1"):
        load_seq2seq_data(train_file=str(tmp_path / "short.en"), source_lang="en", target_lang="de")


def test_seq2seq_joins_list_sources_and_keeps_every_reference(tmp_path):
    records = [
        {"source": ["First sentence.", "Second one."], "target": ["tldr a", "tldr b"], "paper_id": "x"}
    ]
    path = write_jsonl(tmp_path / "dev.jsonl", records)
    dataset = load_seq2seq_data(train_file=path, validation_file=path)
    assert dataset["validation"][0] == {
        "source": "First sentence. Second one.",
        "target": "tldr a",
        "references": ["tldr a", "tldr b"],
    }


def test_seq2seq_reads_a_translation_column_and_reports_missing_columns(tmp_path):
    records = [
        {"translation": {"en": "Hello.", "de": "Hallo."}},
        {"translation": {"en": "Yes.", "de": "Ja."}},
    ]
    path = write_jsonl(tmp_path / "wmt.jsonl", records)
    dataset = load_seq2seq_data(train_file=path, validation_file=path, source_lang="en", target_lang="de")
    assert dataset["train"][0] == {"source": "Hello.", "target": "Hallo."}
    with pytest.raises(FinetuneDataError, match="source/target column 'source', 'target' not found"):
        load_seq2seq_data(train_file=path)


# --- shipped samples -------------------------------------------------------------------------------------


def test_shipped_samples_fit_the_size_budget_and_name_their_source():
    data_files = [path for path in SAMPLES.rglob("*") if path.is_file() and "__pycache__" not in path.parts]
    assert sum(path.stat().st_size for path in data_files) <= 1_500_000
    source_notes = (SAMPLES / "SOURCE.md").read_text(encoding="utf-8")
    for license_name in ("CC BY-SA 4.0", "Apache-2.0", "public domain"):
        assert license_name in source_notes


def test_shipped_authorship_sample_is_balanced_with_disjoint_splits():
    folder = SAMPLES / "authorship"
    dataset = load_classification_data(
        train_file=str(folder / "train.csv"),
        validation_file=str(folder / "validation.csv"),
        test_file=str(folder / "test.csv"),
    )
    assert {split: len(rows) for split, rows in dataset.items()} == {
        "train": 2000,
        "validation": 304,
        "test": 304,
    }
    assert collect_labels(dataset) == ["Charles Dickens", "H. G. Wells", "Jane Austen", "Mark Twain"]
    assert dataset["train"]["label"].count("Jane Austen") == 500
    train_sentences = set(dataset["train"]["text"])
    assert not train_sentences & set(dataset["validation"]["text"])
    assert not train_sentences & set(dataset["test"]["text"])


def test_shipped_ud_sample_has_the_full_upos_and_xpos_tag_sets():
    folder = SAMPLES / "ud-english-ewt"
    files = {
        "train_file": str(folder / "en_ewt-ud-train-sample.conllu.gz"),
        "validation_file": str(folder / "en_ewt-ud-dev-sample.conllu.gz"),
        "test_file": str(folder / "en_ewt-ud-test-sample.conllu.gz"),
    }
    upos = load_tagging_data(**files)
    assert {split: len(rows) for split, rows in upos.items()} == {
        "train": 1501,
        "validation": 300,
        "test": 300,
    }
    assert len(collect_labels(upos)) == 17
    assert len(collect_labels(load_tagging_data(**files, tag_field="xpos"))) == 49


def test_shipped_scitldr_sample_is_source_target_text():
    folder = SAMPLES / "scitldr"
    dataset = load_seq2seq_data(
        train_file=str(folder / "train.jsonl.gz"),
        validation_file=str(folder / "dev.jsonl.gz"),
        test_file=str(folder / "test.jsonl.gz"),
    )
    assert {split: len(rows) for split, rows in dataset.items()} == {
        "train": 400,
        "validation": 100,
        "test": 100,
    }
    example = dataset["train"][0]
    assert example["source"].startswith("Due to the success of deep learning")
    assert example["target"].startswith("We provide necessary and sufficient analytical forms")


@pytest.mark.parametrize("revision", [None, "refs/convert/parquet"])
def test_the_dataset_revision_reaches_load_dataset(monkeypatch, revision):
    """`data.dataset_revision` is `load_dataset(..., revision=...)` for every task's loader (left out when unset)."""
    from datasets import DatasetDict

    import finetune.data

    calls = []
    rows = {
        "tokens": [["a", "b"]],
        "tags": [["O", "O"]],
        "text": ["a b"],
        "label": ["x"],
        "source": ["a"],
        "target": ["b"],
    }

    def load_dataset(name, config, **options):
        calls.append((name, config, options))
        return DatasetDict({"train": Dataset.from_dict(rows), "validation": Dataset.from_dict(rows)})

    monkeypatch.setattr(finetune.data, "load_dataset", load_dataset)
    for loader in (load_tagging_data, load_classification_data, load_seq2seq_data):
        loader(dataset_name="someone/data", dataset_config="cfg", dataset_revision=revision)
    expected = {"revision": revision} if revision else {}
    assert calls == [("someone/data", "cfg", expected)] * 3


def test_a_dataset_with_only_a_loading_script_is_a_data_error_naming_the_parquet_export(monkeypatch):
    import finetune.data

    def load_dataset(name, config, **options):
        raise RuntimeError("Dataset scripts are no longer supported, but found data.py")

    monkeypatch.setattr(finetune.data, "load_dataset", load_dataset)
    with pytest.raises(
        FinetuneDataError,
        match=r"^someone/data has only a loading script, which datasets no longer "
        r"runs: give --data.dataset_revision refs/convert/parquet",
    ):
        load_tagging_data(dataset_name="someone/data")
    with pytest.raises(FinetuneDataError, match=r"^someone/data \(revision v1\) has only a loading script"):
        load_tagging_data(dataset_name="someone/data", dataset_revision="v1")
