"""Kiln models under graph capture and transformers' other generation paths: `torch.compile(fullgraph=True)`,
`torch.export`, the dynamo ONNX exporter, every cache implementation `generate` offers on CPU, flex attention."""

import pytest
import torch
from kiln_testing import tiny_decoder_config, tiny_encoder_config

from pretrain.modeling import (
    KilnDecoderForCausalLM,
    KilnDecoderForSequenceClassification,
    KilnEncoderForMaskedLM,
    KilnEncoderForPreTraining,
    KilnEncoderForSequenceClassification,
    KilnEncoderForTokenClassification,
)

HEADS = [
    (KilnEncoderForSequenceClassification, lambda: tiny_encoder_config(num_labels=3)),
    (KilnEncoderForTokenClassification, lambda: tiny_encoder_config(num_labels=5)),
    (KilnEncoderForMaskedLM, tiny_encoder_config),
    (KilnEncoderForPreTraining, tiny_encoder_config),
    (KilnDecoderForCausalLM, lambda: tiny_decoder_config(use_cache=False)),
    (KilnDecoderForSequenceClassification, lambda: tiny_decoder_config(num_labels=2, use_cache=False)),
]
IDS = [head.__name__ for head, _ in HEADS]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def batch(batch_size=2, length=8, seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, 200, (batch_size, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[-1, length - 2 :] = 0
    return input_ids, attention_mask


def first_output(output):
    return output[0] if isinstance(output, tuple) else next(iter(output.values()))


def assert_same(got, expected, attention_mask):
    """Per-token outputs are compared at the real tokens (eager may skip the padding: `unpad_inputs`)."""
    if got.dim() == 3:
        got, expected = got[attention_mask.bool()], expected[attention_mask.bool()]
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("head, config", HEADS, ids=IDS)
def test_fullgraph_compile_and_export_run_and_equal_eager(head, config):
    model = head(config()).eval()
    input_ids, attention_mask = batch()
    with torch.no_grad():
        eager = first_output(model(input_ids, attention_mask=attention_mask))
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        assert_same(first_output(compiled(input_ids, attention_mask=attention_mask)), eager, attention_mask)
        # a graph captured on one batch, run on another shape with and without padding
        length = torch.export.Dim("length", min=2, max=32)
        program = torch.export.export(
            model,
            (input_ids,),
            {"attention_mask": attention_mask},
            dynamic_shapes={"input_ids": {1: length}, "attention_mask": {1: length}},
        )
        other_ids, other_mask = batch(length=5, seed=1)
        for mask in (other_mask, torch.ones_like(other_mask)):
            exported = first_output(program.module()(other_ids, attention_mask=mask))
            assert_same(exported, first_output(model(other_ids, attention_mask=mask)), mask)


@pytest.mark.parametrize("head, config", [HEADS[0], HEADS[4]], ids=[IDS[0], IDS[4]])
def test_the_dynamo_onnx_exporter_gives_the_eager_outputs(head, config, tmp_path):
    import onnxruntime

    model = head(config()).eval()
    input_ids, attention_mask = batch()
    axes = {0: "batch", 1: "length"}
    program = torch.onnx.export(
        model,
        (input_ids,),
        kwargs={"attention_mask": attention_mask},
        dynamo=True,
        input_names=["input_ids", "attention_mask"],
        dynamic_shapes={"input_ids": axes, "attention_mask": axes},
    )
    program.save(tmp_path / "model.onnx")
    session = onnxruntime.InferenceSession(tmp_path / "model.onnx", providers=["CPUExecutionProvider"])
    other_ids, other_mask = batch(batch_size=3, length=5, seed=2)
    got = session.run(None, {"input_ids": other_ids.numpy(), "attention_mask": other_mask.numpy()})[0]
    with torch.no_grad():
        expected = first_output(model(other_ids, attention_mask=other_mask))
    torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-5, rtol=1e-4)


def test_the_input_id_check_still_runs_in_eager_mode():
    model = KilnEncoderForMaskedLM(tiny_encoder_config()).eval()
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        model(torch.tensor([[3, 999]]))


# ------------------------------------------------------------------------------------ generate's caches
def generate(model, cache_implementation=None, **kwargs):
    input_ids, attention_mask = batch(length=6, seed=3)
    attention_mask = attention_mask.flip(1)  # left padding, as for generation
    out = model.generate(
        input_ids,
        attention_mask=attention_mask,
        max_new_tokens=6,
        do_sample=False,
        pad_token_id=0,
        cache_implementation=cache_implementation,
        output_scores=True,
        return_dict_in_generate=True,
        **kwargs,
    )
    return out.sequences, torch.stack(out.scores)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_a_static_cache_generates_what_the_dynamic_cache_does(implementation):
    model = KilnDecoderForCausalLM(tiny_decoder_config(bos_token_id=1, eos_token_id=2)).eval()
    model.set_attn_implementation(implementation)
    tokens, scores = generate(model, "dynamic")
    static_tokens, static_scores = generate(model, "static")
    assert torch.equal(static_tokens, tokens)
    torch.testing.assert_close(static_scores, scores, atol=1e-5, rtol=0)


def test_the_seq2seq_model_generates_with_a_static_cache_what_it_does_with_the_dynamic_one():
    from pretrain.modeling import KilnEncoderDecoderModel, KilnEncoderModel

    encoder = KilnEncoderModel(tiny_encoder_config())
    decoder = KilnDecoderForCausalLM(
        tiny_decoder_config(add_cross_attention=True, bos_token_id=1, eos_token_id=2)
    )
    model = KilnEncoderDecoderModel(encoder=encoder, decoder=decoder).eval()
    model.config.decoder_start_token_id, model.config.pad_token_id = 1, 0
    input_ids, attention_mask = batch(length=6, seed=5)  # right padding in the source
    outputs = [
        model.generate(
            input_ids,
            attention_mask=attention_mask,
            max_new_tokens=5,
            cache_implementation=cache,
            output_scores=True,
            return_dict_in_generate=True,
        )
        for cache in ("dynamic", "static")
    ]
    assert torch.equal(outputs[1].sequences, outputs[0].sequences)
    torch.testing.assert_close(
        torch.stack(outputs[1].scores), torch.stack(outputs[0].scores), atol=1e-5, rtol=0
    )


@pytest.mark.parametrize("backend", ["fp8", "quanto"])
def test_a_quantized_cache_generates_what_the_dynamic_cache_does(backend):
    model = KilnDecoderForCausalLM(tiny_decoder_config(bos_token_id=1, eos_token_id=2)).eval()
    tokens, scores = generate(model, "dynamic")
    # residual_length=2: all but the last two cached positions are held quantized
    config = {"backend": backend, "residual_length": 2} if backend != "fp8" else {"backend": backend}
    quantized_tokens, quantized_scores = generate(model, "quantized", cache_config=config)
    assert torch.equal(quantized_tokens, tokens)
    torch.testing.assert_close(quantized_scores, scores, atol=0.05, rtol=0)  # lossy by design, not by much


def test_a_manual_static_cache_loop_with_a_2d_mask_matches_the_dynamic_cache():
    from transformers import DynamicCache, StaticCache

    model = KilnDecoderForCausalLM(tiny_decoder_config()).eval()
    input_ids, attention_mask = batch(length=6, seed=4)
    steps = []
    for cache in (DynamicCache(), StaticCache(config=model.config, max_cache_len=12)):
        ids, mask, logits = input_ids, attention_mask, []
        with torch.no_grad():
            for _ in range(3):
                out = model(ids, attention_mask=mask, cache=cache, use_cache=True)
                logits.append(out.logits[:, -1])
                ids = out.logits[:, -1:].argmax(-1)
                mask = torch.cat([mask, torch.ones_like(ids)], 1)
        steps.append(torch.stack(logits))
    torch.testing.assert_close(steps[1], steps[0], atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------ flex attention
def test_flex_attention_gives_the_sdpa_outputs():
    for head, config in (HEADS[2], HEADS[4]):
        model = head(config()).eval()
        input_ids, attention_mask = batch()
        with torch.no_grad():
            expected = model(input_ids, attention_mask=attention_mask).logits
            model.set_attn_implementation("flex_attention")
            got = model(input_ids, attention_mask=attention_mask).logits
        real = attention_mask.bool()
        torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)
        with pytest.raises(
            ValueError, match="output_attentions=True needs attn_implementation 'eager' or 'sdpa'"
        ):
            model(input_ids, output_attentions=True)
