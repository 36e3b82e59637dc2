"""The local evaluate metric modules, checked against values computed by hand (formulas written out here)."""

import math

import pytest

from finetune.metrics import available_metrics, load_metric


def confusion(predictions, references, positive=1):
    tp = sum(p == positive and r == positive for p, r in zip(predictions, references))
    fp = sum(p == positive and r != positive for p, r in zip(predictions, references))
    fn = sum(p != positive and r == positive for p, r in zip(predictions, references))
    tn = len(references) - tp - fp - fn
    return tp, fp, fn, tn


def test_every_metric_folder_loads_by_path():
    assert available_metrics() == [
        "classification",
        "regression",
        "rouge_summary",
        "seqeval_tags",
        "translation",
    ]
    for name in available_metrics():
        assert load_metric(name).name == name


def test_unknown_metric_lists_the_local_ones():
    with pytest.raises(ValueError, match="available local metrics: classification, regression"):
        load_metric("accuracy")


def test_binary_classification_matches_confusion_matrix_formulas():
    references = [1, 1, 1, 0, 0, 0, 0, 1, 0, 1]
    predictions = [1, 0, 1, 0, 1, 0, 0, 1, 1, 1]
    tp, fp, fn, tn = confusion(predictions, references)
    assert (tp, fp, fn, tn) == (4, 2, 1, 3)
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))

    result = load_metric("classification").compute(predictions=predictions, references=references)
    assert result["accuracy"] == pytest.approx(7 / 10)
    assert result["f1"] == pytest.approx(2 * tp / (2 * tp + fp + fn))  # binary F1 of class 1: 8/11
    assert result["matthews_correlation"] == pytest.approx(mcc)


def test_multiclass_f1_is_macro_by_default_and_average_can_be_chosen():
    references = [0, 0, 1, 1, 2, 2, 2]
    predictions = [0, 1, 1, 1, 2, 0, 2]
    per_class_f1 = []
    for label in (0, 1, 2):
        tp, fp, fn, _ = confusion(predictions, references, positive=label)
        per_class_f1.append(2 * tp / (2 * tp + fp + fn))
    metric = load_metric("classification")

    macro = metric.compute(predictions=predictions, references=references)
    assert macro["f1"] == pytest.approx(sum(per_class_f1) / 3)
    micro = metric.compute(predictions=predictions, references=references, average="micro")
    assert micro["f1"] == pytest.approx(5 / 7)  # micro F1 = accuracy for single-label classification
    with pytest.raises(ValueError, match="average='samples' is not supported"):
        metric.compute(predictions=predictions, references=references, average="samples")


def test_regression_matches_pearson_and_spearman_formulas():
    references = [1.0, 2.0, 3.0, 4.0, 5.0]
    predictions = [1.5, 1.0, 3.5, 5.0, 4.0]
    n = len(references)
    mean_r, mean_p = sum(references) / n, sum(predictions) / n
    covariance = sum((r - mean_r) * (p - mean_p) for r, p in zip(references, predictions))
    pearson = covariance / math.sqrt(
        sum((r - mean_r) ** 2 for r in references) * sum((p - mean_p) ** 2 for p in predictions)
    )
    ranks_p = [sorted(predictions).index(p) + 1 for p in predictions]  # no ties
    ranks_r = [sorted(references).index(r) + 1 for r in references]
    spearman = 1 - 6 * sum((a - b) ** 2 for a, b in zip(ranks_p, ranks_r)) / (n * (n * n - 1))

    result = load_metric("regression").compute(predictions=predictions, references=references)
    assert result["pearson"] == pytest.approx(pearson)
    assert result["spearmanr"] == pytest.approx(spearman)  # 0.8
    assert result["combined_score"] == pytest.approx((pearson + spearman) / 2)


def test_seqeval_entity_counts_overall_and_per_type():
    references = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O", "B-PER"]]
    predictions = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O", "O"]]
    # gold entities: PER x2, LOC x1, ORG x1; predicted: PER x1, ORG x2; correct: PER (0-1), ORG (sentence 2)
    result = load_metric("seqeval_tags").compute(predictions=predictions, references=references)
    assert result["precision"] == pytest.approx(2 / 3)
    assert result["recall"] == pytest.approx(2 / 4)
    assert result["f1"] == pytest.approx(2 * (2 / 3) * (2 / 4) / (2 / 3 + 2 / 4))
    assert result["accuracy"] == pytest.approx(5 / 7)
    assert (result["PER_precision"], result["PER_recall"], result["PER_number"]) == (1.0, 0.5, 2)
    assert (result["ORG_precision"], result["ORG_recall"], result["ORG_number"]) == (0.5, 1.0, 1)
    assert (result["LOC_f1"], result["LOC_number"]) == (0.0, 1)


def test_seqeval_strict_iob2_rejects_spans_that_lenient_mode_accepts():
    metric = load_metric("seqeval_tags")
    references, predictions = [["B-PER", "I-PER", "O"]], [["I-PER", "I-PER", "O"]]
    assert metric.compute(predictions=predictions, references=references)["f1"] == 1.0
    strict = metric.compute(predictions=predictions, references=references, mode="strict", scheme="IOB2")
    assert strict["f1"] == 0.0


def test_seqeval_pos_tags_give_token_accuracy_only():
    references = [["DET", "NOUN", "VERB"], ["PRON", "VERB"]]
    predictions = [["DET", "VERB", "VERB"], ["PRON", "VERB"]]
    result = load_metric("seqeval_tags").compute(predictions=predictions, references=references)
    assert result == {"accuracy": pytest.approx(4 / 5)}


def test_seqeval_needs_one_prediction_per_word():
    with pytest.raises(ValueError, match="sentence 0 has 1 predicted tags but 2 reference tags"):
        load_metric("seqeval_tags").compute(predictions=[["O"]], references=[["O", "O"]])


def test_bleu_and_chrf_of_identical_and_disjoint_text():
    metric = load_metric("translation")
    same = metric.compute(predictions=["the cat sat on the mat"], references=[["the cat sat on the mat"]])
    assert same["bleu"] == pytest.approx(100.0)
    assert same["chrf"] == pytest.approx(100.0)
    disjoint = metric.compute(predictions=["xyz qqq"], references=["abc def"])
    assert disjoint["bleu"] == 0.0
    assert disjoint["chrf"] == 0.0


def test_bleu_matches_the_formula_on_a_hand_counted_example():
    # hypothesis 6 tokens, reference 7; matched n-grams: 6/6 unigrams, 4/5 bigrams, 3/4 trigrams, 2/3 4-grams
    result = load_metric("translation").compute(
        predictions=["the cat sat on the mat"], references=["the cat sat on the red mat"]
    )
    precisions = [6 / 6, 4 / 5, 3 / 4, 2 / 3]
    brevity_penalty = math.exp(1 - 7 / 6)
    bleu = 100 * brevity_penalty * math.exp(sum(math.log(p) for p in precisions) / 4)
    assert result["bleu"] == pytest.approx(bleu)
    assert result["bleu_precisions"] == pytest.approx([100 * p for p in precisions])
    assert (result["hyp_len"], result["ref_len"]) == (6, 7)


def test_translation_takes_a_varying_number_of_references():
    result = load_metric("translation").compute(
        predictions=["a dog runs in the park", "two men talk to each other"],
        references=[["a dog runs in the park"], ["someone speaks", "two men talk to each other"]],
    )
    assert result["bleu"] == pytest.approx(100.0)


def test_rouge_matches_hand_counted_overlaps():
    # prediction 3 tokens, reference 6: unigram P=3/3 R=3/6, bigram P=2/2 R=2/5, LCS = 3
    result = load_metric("rouge_summary").compute(
        predictions=["the cat sat"], references=["the cat sat on the mat"]
    )

    def f1(p, r):
        return 2 * p * r / (p + r)

    assert result["rouge1"] == pytest.approx(f1(1, 3 / 6))
    assert result["rouge2"] == pytest.approx(f1(1, 2 / 5))
    assert result["rougeL"] == pytest.approx(f1(1, 3 / 6))
    assert result["rougeLsum"] == pytest.approx(f1(1, 3 / 6))


def test_rouge_stemming_option_and_best_of_several_references():
    metric = load_metric("rouge_summary")
    stemmed = metric.compute(predictions=["cats running"], references=["cat runs"])
    assert stemmed["rouge1"] == pytest.approx(1.0)
    exact = metric.compute(predictions=["cats running"], references=["cat runs"], use_stemmer=False)
    assert exact["rouge1"] == 0.0
    best = metric.compute(predictions=["a b c. d e."], references=[["x y", "a b c. d e."]])
    assert best == {key: pytest.approx(1.0) for key in ("rouge1", "rouge2", "rougeL", "rougeLsum")}
