"""`python -m pretrain.export_onnx`: every Kiln head exports to ONNX and onnxruntime computes PyTorch's outputs."""

import json

import pytest
import torch
from kiln_testing import tiny_decoder_config, tiny_encoder_config

import pretrain.modeling as modeling
from pretrain.export_onnx import OUTPUTS, example_inputs, main

onnxruntime = pytest.importorskip("onnxruntime", reason="pip install onnx onnxruntime (dev extras)")


@pytest.mark.parametrize("class_name", list(OUTPUTS))
def test_every_head_exports_and_onnxruntime_matches_pytorch(class_name, tmp_path, capsys):
    torch.manual_seed(0)
    dropout = dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, classifier_dropout=0.2)
    config = (
        tiny_encoder_config(**dropout)
        if "Encoder" in class_name
        else tiny_decoder_config(resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)
    )  # (dropout on: the graph must be the inference one)
    model = getattr(modeling, class_name)(config).eval()
    model.save_pretrained(tmp_path / "model")
    (tmp_path / "model" / "tokenizer.json").write_text("{}")
    main([str(tmp_path / "model"), str(tmp_path / "onnx")])
    assert "largest difference" in capsys.readouterr().out
    assert (tmp_path / "onnx" / "tokenizer.json").is_file()
    assert json.loads((tmp_path / "onnx" / "config.json").read_text())["architectures"] == [class_name]

    session = onnxruntime.InferenceSession(
        str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    inputs = example_inputs(model, batch_size=4, seq_len=13, seed=7)  # not the traced shape
    inputs["attention_mask"][2, ..., 5:] = 0  # more padding than traced
    names = [output.name for output in session.get_outputs()]
    assert set(names) <= set(OUTPUTS[class_name]) and names
    got = session.run(names, {name: tensor.numpy() for name, tensor in inputs.items()})
    with torch.no_grad():
        expected = model(**inputs)
    real = inputs["attention_mask"].bool()
    for name, value in zip(names, got):
        reference, actual = expected[name], torch.from_numpy(value)
        assert actual.shape == reference.shape, name
        if reference.shape[: real.dim()] == real.shape:  # per token: padded positions carry no meaning
            reference, actual = reference[real], actual[real]
        torch.testing.assert_close(actual, reference, atol=1e-4, rtol=0)


def test_a_folder_that_does_not_export_names_what_does(tmp_path):
    (tmp_path / "s2s").mkdir()
    (tmp_path / "s2s" / "config.json").write_text(json.dumps({"architectures": ["KilnEncoderDecoderModel"]}))
    with pytest.raises(
        SystemExit, match="holds a KilnEncoderDecoderModel model; ONNX export supports KilnEncoderModel"
    ):
        main([str(tmp_path / "s2s"), str(tmp_path / "out")])
