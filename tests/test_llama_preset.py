"""The decoder's `llama` preset computes what transformers' LlamaForCausalLM computes: both-way conversion, logits
on shapes the code was not written against (grouped-query ratios, batch 1, length 1, left and right padding, the
last position), greedy generation with every cache, the classification heads, and the pieces one by one."""

import json

import pytest
import torch
import transformers

from pretrain.convert import decoder_family, from_transformers, main, to_transformers
from pretrain.modeling import (
    KilnDecoderConfig,
    KilnDecoderForCausalLM,
    KilnDecoderForSequenceClassification,
    KilnDecoderForTokenClassification,
    KilnDecoderModel,
)

ATOL = 1e-5
VOCAB, PAD, BOS, EOS = 211, 0, 1, 2


def llama_config(num_key_value_heads=2, **overrides) -> transformers.LlamaConfig:
    # initializer_range well above the default: pre-activations of order 1, so any slip shows in the logits
    settings = dict(
        vocab_size=VOCAB,
        hidden_size=48,
        intermediate_size=72,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=40,
        initializer_range=0.1,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        tie_word_embeddings=False,
    )
    return transformers.LlamaConfig(**{**settings, **overrides})


def batch(batch_size, length, padding=None, seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (batch_size, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    if padding == "left":
        attention_mask[0, : length // 2] = 0
    elif padding == "right":
        attention_mask[0, length - length // 3 :] = 0
    input_ids[attention_mask == 0] = PAD
    return input_ids, attention_mask


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


SHAPES = [  # (key/value heads, batch, length, padding): GQA ratios 1, 2, 4; batch 1; length 1; padding; the end
    (4, 3, 13, None),
    (2, 1, 9, None),
    (1, 2, 1, None),
    (2, 3, 17, "left"),
    (1, 3, 11, "right"),
    (4, 2, 40, "left"),  # the longest sequence: the last position's angles
]


@pytest.mark.parametrize("kv_heads, batch_size, length, padding", SHAPES)
@pytest.mark.parametrize("direction", ["from_transformers", "to_transformers"])
def test_logits_equal_llama(kv_heads, batch_size, length, padding, direction):
    if direction == "from_transformers":
        llama = transformers.LlamaForCausalLM(llama_config(kv_heads)).eval()
        kiln = from_transformers(llama)
    else:
        kiln_config = from_transformers(transformers.LlamaForCausalLM(llama_config(kv_heads))).config
        kiln = KilnDecoderForCausalLM(kiln_config).eval()
        with torch.no_grad():  # initializer_range as large as Llama's above, for the same sensitivity
            for parameter in kiln.parameters():
                if parameter.dim() == 2:
                    parameter.normal_(0, 0.1)
        llama = to_transformers(kiln)
    assert isinstance(llama, transformers.LlamaForCausalLM) and isinstance(kiln, KilnDecoderForCausalLM)
    assert kiln.config.preset == "llama" and kiln.config.num_key_value_heads == kv_heads
    input_ids, attention_mask = batch(batch_size, length, padding)
    real = attention_mask.bool()
    expected = llama(input_ids, attention_mask=attention_mask).logits
    actual = kiln(input_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(actual[real], expected[real], atol=ATOL, rtol=0)
    # scored from real positions only: a padded position's output carries no meaning (and differs)
    after_padding = torch.cat([torch.zeros_like(real[:, :1]), ~real[:, :-1]], dim=1)
    labels = input_ids.masked_fill(~real | after_padding, -100)
    torch.testing.assert_close(
        kiln(input_ids, attention_mask=attention_mask, labels=labels).loss,
        llama(input_ids, attention_mask=attention_mask, labels=labels).loss,
        atol=ATOL,
        rtol=0,
        equal_nan=length == 1,  # nothing to score: nan in both
    )


def test_conversion_keeps_every_weight_and_the_config():
    llama = transformers.LlamaForCausalLM(llama_config(1, attention_bias=True, tie_word_embeddings=True))
    kiln = from_transformers(llama)
    assert kiln.config.attention_bias and not kiln.config.mlp_bias and kiln.config.rope_theta == 500000.0
    assert (
        kiln.model.layers[0].attention.qkv.bias is not None and kiln.model.layers[0].mlp.fc_out.bias is None
    )
    assert kiln.lm_head.weight.data_ptr() == kiln.model.word_embeddings.weight.data_ptr()  # tied stays tied
    back = to_transformers(kiln)
    assert back.state_dict().keys() == llama.state_dict().keys()
    for key, value in llama.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key
    for name in ("num_key_value_heads", "rms_norm_eps", "attention_bias", "mlp_bias", "tie_word_embeddings"):
        assert getattr(back.config, name) == getattr(llama.config, name), name
    assert back.config.rope_parameters["rope_theta"] == 500000.0


def test_untied_embeddings_stay_untied():
    kiln = from_transformers(transformers.LlamaForCausalLM(llama_config()))
    assert not kiln.config.tie_word_embeddings
    assert kiln.lm_head.weight.data_ptr() != kiln.model.word_embeddings.weight.data_ptr()
    assert not torch.equal(kiln.lm_head.weight, kiln.model.word_embeddings.weight)


CACHES = [
    {},
    {"cache_implementation": "static"},
    {
        "cache_implementation": "quantized",
        "cache_config": {"backend": "quanto", "nbits": 4, "q_group_size": 12, "residual_length": 4},
    },
]


@pytest.mark.parametrize("cache", CACHES, ids=["dynamic", "static", "quantized"])
def test_greedy_generate_equals_llama(cache):
    if cache.get("cache_implementation") == "quantized":
        pytest.importorskip("optimum.quanto", reason="the quantized cache needs optimum-quanto (dev extras)")
    llama = transformers.LlamaForCausalLM(llama_config(2)).eval()
    kiln = from_transformers(llama).eval()
    input_ids, attention_mask = batch(3, 7, "left", seed=3)
    kwargs = dict(
        attention_mask=attention_mask, max_new_tokens=12, do_sample=False, pad_token_id=PAD, **cache
    )
    expected = llama.generate(input_ids, **kwargs)
    actual = kiln.generate(input_ids, **kwargs)
    assert actual.shape == (3, 19)
    assert torch.equal(actual, expected)


@pytest.mark.parametrize(
    "llama_class, kiln_class",
    [
        (transformers.LlamaModel, KilnDecoderModel),
        (transformers.LlamaForSequenceClassification, KilnDecoderForSequenceClassification),
        (transformers.LlamaForTokenClassification, KilnDecoderForTokenClassification),
    ],
    ids=lambda c: c.__name__,
)
@pytest.mark.parametrize("direction", ["from_transformers", "to_transformers"])
def test_bare_model_and_heads_equal_llama(llama_class, kiln_class, direction):
    config = llama_config(2, num_labels=3)
    if direction == "from_transformers":
        llama = llama_class(config).eval()
        kiln = from_transformers(llama)
    else:
        kiln = kiln_class(from_transformers(llama_class(config)).config).eval()
        llama = to_transformers(kiln)
    assert type(kiln) is kiln_class and type(llama) is llama_class
    input_ids, attention_mask = batch(3, 10, "right", seed=1)
    real = attention_mask.bool()
    labels = {}
    if llama_class is transformers.LlamaForSequenceClassification:
        labels = dict(labels=torch.tensor([0, 2, 1]))
    elif llama_class is transformers.LlamaForTokenClassification:
        labels = dict(labels=(input_ids % 3).masked_fill(~real, -100))
    expected = llama(input_ids, attention_mask=attention_mask, **labels)
    actual = kiln(input_ids, attention_mask=attention_mask, **labels)
    field = "last_hidden_state" if llama_class is transformers.LlamaModel else "logits"
    want, got = expected[field], actual[field]
    if want.dim() == 3:
        want, got = want[real], got[real]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    if labels:
        torch.testing.assert_close(actual.loss, expected.loss, atol=ATOL, rtol=0)


def test_training_step_gradients_equal_llama():
    """The training path (the chunked LM loss, train mode) gives Llama's loss and gradients."""
    llama = transformers.LlamaForCausalLM(llama_config(2)).train()
    kiln = from_transformers(llama).train()
    input_ids, _ = batch(2, 12, seed=4)
    llama(input_ids, labels=input_ids).loss.backward()
    out = kiln(input_ids, labels=input_ids)
    assert out.logits is None  # the chunked head
    out.loss.backward()
    theirs = llama.model.layers[1].self_attn.k_proj.weight.grad
    head = kiln.config.hidden_size // kiln.config.num_attention_heads
    ours = kiln.model.layers[1].attention.qkv.weight.grad[4 * head : 6 * head]
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(kiln.lm_head.weight.grad, llama.lm_head.weight.grad, atol=1e-6, rtol=1e-4)


def test_preset_sets_the_pieces_and_each_piece_is_its_own_choice():
    gpt2, llama = KilnDecoderConfig(), KilnDecoderConfig(preset="llama", hidden_size=768)
    assert (gpt2.position_embedding_type, gpt2.norm_type, gpt2.mlp_type) == ("learned", "layernorm", "mlp")
    assert (llama.position_embedding_type, llama.norm_type, llama.mlp_type) == ("rotary", "rmsnorm", "glu")
    assert llama.activation_function == "silu" and llama.resid_pdrop == 0.0 and not llama.attention_bias
    assert llama.intermediate_size == 2048 and gpt2.intermediate_size == 3072
    mixed = KilnDecoderConfig(
        preset="llama", norm_type="layernorm", activation_function="gelu", resid_pdrop=0.1
    )
    assert (mixed.norm_type, mixed.activation_function, mixed.resid_pdrop) == ("layernorm", "gelu", 0.1)
    reloaded = KilnDecoderConfig.from_dict(mixed.to_dict())
    assert (reloaded.norm_type, reloaded.mlp_type, reloaded.preset) == ("layernorm", "glu", "llama")
    with pytest.raises(ValueError, match="Unknown decoder preset='mistral'"):
        KilnDecoderConfig(preset="mistral")
    with pytest.raises(ValueError, match="Unknown norm_type='batchnorm'"):
        KilnDecoderConfig(norm_type="batchnorm")
    with pytest.raises(ValueError, match="num_key_value_heads=3 does not divide num_attention_heads=4"):
        KilnDecoderForCausalLM(
            KilnDecoderConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=3)
        )


@pytest.mark.parametrize(
    "pieces",
    [
        dict(
            preset="gpt2", position_embedding_type="rotary", num_key_value_heads=2
        ),  # GPT-2 blocks + RoPE + GQA
        dict(preset="llama", qk_norm=True),
        dict(preset="llama", norm_type="layernorm", mlp_type="mlp", mlp_bias=True),
    ],
    ids=["gpt2-rope-gqa", "llama-qk-norm", "llama-gpt2-mlp"],
)
def test_pieces_one_by_one_train_cache_and_refuse_conversion(pieces):
    config = KilnDecoderConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **pieces,
    )
    model = KilnDecoderForCausalLM(config).eval()
    input_ids, attention_mask = batch(2, 9, "left", seed=2)
    full = model(input_ids, attention_mask=attention_mask).logits
    # the cache gives the same logits as recomputing: the prompt, then one token at a time
    out = model(input_ids[:, :6], attention_mask=attention_mask[:, :6], use_cache=True)
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    for t in range(6, 9):
        step = model(
            input_ids[:, t : t + 1], attention_mask=attention_mask[:, : t + 1], cache=cache, use_cache=True
        )
        torch.testing.assert_close(step.logits[:, -1], full[:, t], atol=1e-5, rtol=0)
    model.train()
    model(input_ids, labels=input_ids).loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    if pieces.get("qk_norm"):
        assert "model.layers.0.attention.q_norm.weight" in model.state_dict()
    with pytest.raises(ValueError, match="transformers has no class computing it"):
        decoder_family(config)
    with pytest.raises(ValueError, match="transformers has no class computing it"):
        to_transformers(model)


def test_eager_and_sdpa_agree_with_grouped_query_attention():
    kiln = from_transformers(transformers.LlamaForCausalLM(llama_config(1))).eval()
    input_ids, attention_mask = batch(3, 12, "left", seed=6)
    real = attention_mask.bool()
    sdpa = kiln(input_ids, attention_mask=attention_mask).logits
    kiln.config._attn_implementation = "eager"
    eager = kiln(input_ids, attention_mask=attention_mask, output_attentions=True)
    assert eager.attentions[0].shape == (3, 4, 12, 12)
    torch.testing.assert_close(eager.logits[real], sdpa[real], atol=ATOL, rtol=0)


def test_cli_converts_a_llama_checkpoint_to_kiln_and_back(tmp_path, capsys):
    llama = transformers.LlamaForCausalLM(llama_config(2)).eval()
    llama.save_pretrained(tmp_path / "llama")
    main([str(tmp_path / "llama"), str(tmp_path / "kiln")])
    saved = json.loads((tmp_path / "kiln" / "config.json").read_text())
    assert saved["model_type"] == "kiln_decoder" and saved["preset"] == "llama"
    main([str(tmp_path / "kiln"), str(tmp_path / "back")])
    assert "wrote LlamaForCausalLM" in capsys.readouterr().out
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    kiln = KilnDecoderForCausalLM.from_pretrained(tmp_path / "kiln").eval()
    input_ids, attention_mask = batch(2, 8, "right", seed=7)
    real = attention_mask.bool()
    expected = llama(input_ids, attention_mask=attention_mask).logits[real]
    torch.testing.assert_close(
        back(input_ids, attention_mask=attention_mask).logits[real], expected, atol=ATOL, rtol=0
    )
    torch.testing.assert_close(
        kiln(input_ids, attention_mask=attention_mask).logits[real], expected, atol=ATOL, rtol=0
    )


def test_seq2seq_model_with_a_llama_decoder_trains_and_caches():
    """The llama preset as the decoder of the seq2seq model: cross-attention without biases, RMSNorm before it."""
    from pretrain.modeling import KilnEncoderConfig, KilnEncoderDecoderModel, KilnEncoderModel

    encoder = KilnEncoderModel(
        KilnEncoderConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=32,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        ),
        add_pooling_layer=False,
    )
    decoder = KilnDecoderForCausalLM(
        KilnDecoderConfig(
            preset="llama",
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=32,
            initializer_range=0.1,
            add_cross_attention=True,
            is_decoder=True,
            pad_token_id=PAD,
            bos_token_id=BOS,
            eos_token_id=EOS,
        )
    )
    layer = decoder.model.layers[0]
    assert layer.cross_attention.q.bias is None and type(layer.cross_attention_norm).__name__ == "KilnRMSNorm"
    model = KilnEncoderDecoderModel(encoder=encoder, decoder=decoder)
    model.config.decoder_start_token_id, model.config.pad_token_id = BOS, PAD
    source, source_mask = batch(2, 9, "right", seed=8)
    labels = batch(2, 6, seed=9)[0]
    loss = model(input_ids=source, attention_mask=source_mask, labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss) and decoder.model.layers[1].cross_attention.kv.weight.grad is not None
    model.eval()
    kwargs = dict(attention_mask=source_mask, max_new_tokens=6, do_sample=False)
    cached = model.generate(source, use_cache=True, **kwargs)
    assert torch.equal(cached, model.generate(source, use_cache=False, **kwargs))


def test_pretraining_with_the_preset_writes_a_checkpoint_llama_loads(tmp_path):
    """`--model.preset llama` through the pretraining runner (packed blocks masked by document, transformers'
    warmup-stable-decay schedule): the options left at their defaults take Llama's values, and the final checkpoint
    converts to a LlamaForCausalLM that generates what the Kiln model generates."""
    from kiln_testing import DEBUG, REPO, run_main

    from pretrain.run import main as pretrain

    run_main(
        pretrain,
        "--config",
        DEBUG,
        "--model.kind",
        "decoder",
        "--model.preset",
        "llama",
        "--model.num_key_value_heads",
        "1",
        "--data.data_files",
        str(REPO / "data/tinystories/*.txt"),
        "--training.max_steps",
        "3",
        "--training.save_steps",
        "0",
        "--training.eval_steps",
        "0",
        "--training.lr_scheduler_type",
        "warmup_stable_decay",
        "--training.output_dir",
        tmp_path / "run",
    )
    final = tmp_path / "run" / "final"
    saved = json.loads((final / "config.json").read_text())
    assert (
        saved["preset"] == "llama" and saved["activation_function"] == "silu" and saved["resid_pdrop"] == 0.0
    )
    assert saved["num_key_value_heads"] == 1 and saved["layer_norm_epsilon"] == 1e-5
    main([str(final), str(tmp_path / "llama")])
    llama = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "llama").eval()
    kiln = KilnDecoderForCausalLM.from_pretrained(final).eval()
    prompt = torch.tensor([[5, 17, 42, 8]])
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=kiln.config.eos_token_id)
    assert torch.equal(kiln.generate(prompt, **kwargs), llama.generate(prompt, **kwargs))
