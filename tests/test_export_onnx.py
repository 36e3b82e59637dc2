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


def refused(capsys, *argv) -> str:
    """`python -m pretrain.export_onnx ARGV` refusing its input: exit status 2 and its one line on stderr."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1 and not out.strip(), (exit_info.value.code, out, err)
    return lines[0]


def test_a_folder_that_does_not_export_names_what_does(tmp_path, capsys):
    (tmp_path / "s2s").mkdir()
    (tmp_path / "s2s" / "config.json").write_text(json.dumps({"architectures": ["KilnEncoderDecoderModel"]}))
    assert refused(capsys, tmp_path / "s2s", tmp_path / "out").startswith(
        f"error: {tmp_path / 's2s'} holds a KilnEncoderDecoderModel model; ONNX export supports KilnEncoderModel"
    )
    assert not (tmp_path / "out").exists()


def test_what_export_cannot_read_is_refused_with_status_2(tmp_path, capsys):
    """A user's input refused, as every Kiln command's: exit status 2, one line `error: ...`, nothing written."""
    out = tmp_path / "out"
    assert refused(capsys, tmp_path / "nothing", out) == (
        f"error: FOLDER {tmp_path / 'nothing'} does not exist; point it at a model folder written by Kiln"
    )
    (tmp_path / "run" / "final").mkdir(parents=True)
    assert refused(capsys, tmp_path / "run", out) == (
        f"error: FOLDER {tmp_path / 'run'} holds no config.json, so it is not a saved model; point it at the model "
        f"inside: {tmp_path / 'run' / 'final'}"
    )
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    assert refused(capsys, tmp_path / "broken", out).startswith(
        f"error: FOLDER {tmp_path / 'broken'}: cannot read config.json: "
    )
    model = modeling.KilnEncoderForMaskedLM(tiny_encoder_config())
    model.config.architectures = ["KilnEncoderForMaskedLM"]
    model.config.save_pretrained(tmp_path / "bare")  # its config alone
    assert refused(capsys, tmp_path / "bare", out) == (
        f"error: {tmp_path / 'bare'} holds no weights (no model.safetensors); point it at a model folder written "
        "by Kiln"
    )
    model.save_pretrained(tmp_path / "model")
    line = refused(capsys, tmp_path / "model", out, "--opset", 99)
    assert line.startswith("error: --opset 99: torch's ONNX exporter does not write it (") and line.endswith(
        "; pick an older opset (the default is 17)"
    )
    assert not out.exists()
