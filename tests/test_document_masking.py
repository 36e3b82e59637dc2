"""Packed pretraining never attends across documents: the CLM collator restarts position ids after every EOS, and
the decoder (GPT-2 blocks and the llama preset, every kernel whose masks it builds) reads them as packed documents,
so each document's logits in a packed row equal those of the document run alone."""

import pytest
import torch
import transformers
from kiln_testing import tiny_decoder_config

from pretrain.convert import from_transformers
from pretrain.data.collator import CLMCollator, document_positions, real_tokens
from pretrain.modeling import KilnDecoderForCausalLM
from pretrain.run import masks_documents

EOS, PAD = 2, 0


class _Tokenizer:
    pad_token_id, eos_token_id = PAD, EOS


def test_positions_restart_after_every_eos():
    input_ids = torch.tensor([[5, 6, EOS, 7, EOS, 8, 9, 10], [EOS, 3, 4, 5, 6, 7, EOS, 9]])
    expected = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2], [0, 0, 1, 2, 3, 4, 5, 0]])
    assert torch.equal(document_positions(input_ids, EOS), expected)


def test_collator_writes_position_ids_only_with_document_masking():
    features = [{"input_ids": [5, 6, EOS, 7, 8]}, {"input_ids": [9, EOS, 3]}]
    masked = CLMCollator(_Tokenizer(), pad_to_multiple_of=None, document_masking=True)(features)
    assert masked["position_ids"].tolist() == [[0, 1, 2, 0, 1], [0, 1, 0, 1, 2]]
    assert masked["labels"].tolist()[1] == [9, EOS, 3, -100, -100]
    assert (
        "attention_mask" not in masked
    )  # packed rows carry no padding mask: their padding is where labels are -100
    assert real_tokens(masked).tolist()[1] == [True, True, True, False, False]
    plain = CLMCollator(_Tokenizer(), pad_to_multiple_of=None)(features)
    assert "position_ids" not in plain and plain["attention_mask"].tolist()[1] == [1, 1, 1, 0, 0]


def packed_and_alone(vocab_size, seed=0):
    """A batch of two packed rows (three documents, then two and padding) and each document on its own."""
    generator = torch.Generator().manual_seed(seed)

    def document(length):
        return torch.randint(3, vocab_size, (length,), generator=generator).tolist() + [EOS]

    rows = [[document(4), document(6), document(5)[:3]], [document(3), document(5)]]
    features = [{"input_ids": [token for doc in row for token in doc]} for row in rows]
    return CLMCollator(_Tokenizer(), pad_to_multiple_of=8, document_masking=True)(features), rows


MODELS = {
    "gpt2": lambda: KilnDecoderForCausalLM(tiny_decoder_config(initializer_range=0.2)),
    "llama": lambda: KilnDecoderForCausalLM(
        tiny_decoder_config(preset="llama", num_key_value_heads=2, initializer_range=0.2)
    ),
}


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("preset", list(MODELS))
def test_each_document_in_a_packed_row_equals_the_document_alone(preset, implementation):
    torch.manual_seed(0)
    model = MODELS[preset]().eval()
    model.config._attn_implementation = implementation
    batch, rows = packed_and_alone(model.config.vocab_size)
    packed = model(batch["input_ids"], position_ids=batch["position_ids"])
    crossing = model(batch["input_ids"], attention_mask=real_tokens(batch).long()).logits
    for r, row in enumerate(rows):
        start = 0
        for doc in row:
            alone = model(torch.tensor([doc])).logits[0]
            got = packed.logits[r, start : start + len(doc)]
            torch.testing.assert_close(got, alone, atol=1e-5, rtol=0)
            if start:  # without the positions the same tokens read the earlier documents: other logits
                assert not torch.allclose(crossing[r, start : start + len(doc)], alone, atol=1e-3)
            start += len(doc)
    # the loss of the packed batch is the loss over the documents, each scored on its own
    loss = model(**batch).loss
    assert torch.isfinite(loss)


def test_packed_rows_equal_llama_reading_the_same_position_ids():
    """transformers reads restarting position ids (without a padding mask) as packed sequences too."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        initializer_range=0.2,
    )
    llama = transformers.LlamaForCausalLM(config).eval()
    kiln = from_transformers(llama).eval()
    batch, _ = packed_and_alone(97, seed=1)
    input_ids, position_ids = batch["input_ids"][:1, :16], batch["position_ids"][:1, :16]  # a full row
    expected = llama(input_ids, position_ids=position_ids, use_cache=False).logits  # as in training
    torch.testing.assert_close(kiln(input_ids, position_ids=position_ids).logits, expected, atol=1e-5, rtol=0)
    assert not torch.allclose(kiln(input_ids).logits, expected, atol=1e-3)  # the documents matter here


def test_document_masking_needs_a_kernel_whose_masks_kiln_builds():
    model = MODELS["gpt2"]()
    assert masks_documents(model)
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)
    )
    assert not masks_documents(gpt2)  # code Kiln does not know (trust_remote_code, other classes)


def reference_decoder(family: str):
    if family == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=97,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            initializer_range=0.2,
        )
        return transformers.GPT2LMHeadModel(config).eval()
    config = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.2,
    )
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("padding", ["holes", "left", "right"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_padding_mask_makes_position_ids_positions_only(family, padding):
    """Given a padding mask, position ids that repeat or restart are positions, as transformers reads them (it
    looks for packed documents only without a mask): masks with holes (position ids `[0 1 1 2 3]`, as `generate`
    derives them), left and right padding give the logits of GPT-2 / Llama on the same weights."""
    torch.manual_seed(0)
    reference = reference_decoder(family)
    kiln = from_transformers(reference).eval()
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, 97, (3, 12), generator=generator)
    if padding == "holes":
        attention_mask = torch.randint(0, 2, (3, 12), generator=generator)
        attention_mask[:, -1] = 1
    else:
        lengths = torch.tensor([12, 7, 3])[:, None]
        attention_mask = (torch.arange(12)[None] < lengths).long()
        attention_mask = attention_mask.flip(-1) if padding == "left" else attention_mask
    position_ids = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
    assert bool((position_ids[:, 1:] != position_ids[:, :-1] + 1).any())  # ids a packed batch would restart
    with torch.no_grad():
        expected = reference(
            input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).logits
        got = kiln(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    real = attention_mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)
