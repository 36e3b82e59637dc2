"""One gate for every command that reads a model folder or Hub id: pretraining's `--model.init_from`, fine-tuning's
`--model.checkpoint` (and `adapt`, GLUE), `python -m pretrain.zero_shot`, `python -m pretrain.convert` and
`python -m pretrain.export_onnx` call `check_model_folder` before anything is built.

It reads the config.json as data and the safetensors headers as JSON (a Hub id's by range requests; no tensor is
loaded) and checks, in this order: the weight files are plain files inside the folder (`kiln.model_files`: no shard
named `../x` or by an absolute path, no link leading out, none truncated); the config's sizes are whole numbers in
range that a model can be built with; its depth is the number of blocks the weights hold; the embedding tables and
first block's projections have the shapes its widths, heads and vocabulary give (a message naming the fields); and
then every tensor has the shape the config gives it, by building the model the config names on the `meta` device
(no memory: only possible once the depth is known to match, so a config claiming a million blocks never gets
there). A refusal is one line, `OPTION SPEC: what is wrong; the fix`, a ConfigError (exit status 2).

Here, not in the engine (`kiln/`): the sizes of a Kiln config are read by Kiln's own config classes, which the
engine may not import; the file checks it builds on are the engine's (`kiln.model_files`).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from kiln.errors import ConfigError, first_line
from kiln.model_files import carries_code, read_model_config
from pretrain.modeling import KilnDecoderConfig, KilnEncoderConfig
from pretrain.modeling.modeling_kiln_encoder import embedding_width

WRONG = "; point it at a folder written by save_pretrained"

# transformers model_type -> (the family's name, the kind of Kiln model it converts to, the Kiln model_type)
CONVERTIBLE = {
    "bert": ("BERT", "encoder", "kiln_encoder"),
    "electra": ("ELECTRA", "encoder", "kiln_encoder"),
    "gpt2": ("GPT-2", "decoder", "kiln_decoder"),
    "llama": ("Llama", "decoder", "kiln_decoder"),
}
# the whole-number fields of each family's config.json whose values size the model: checked before anything is built
SHAPE_FIELDS = {
    "bert": (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "type_vocab_size",
    ),
    "electra": (
        "vocab_size",
        "embedding_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
        "type_vocab_size",
    ),
    "gpt2": ("vocab_size", "n_embd", "n_layer", "n_head", "n_positions"),
    "llama": (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
    ),
}
# the names of a model type's block weights (group 1: the block's index, after any prefix) and its depth field
BLOCK_NAMES = {
    "bert": (r"(?:^|\.)encoder\.layer\.(\d+)\.", "num_hidden_layers"),
    "electra": (r"(?:^|\.)encoder\.layer\.(\d+)\.", "num_hidden_layers"),
    "gpt2": (r"(?:^|\.)h\.(\d+)\.", "n_layer"),
    "llama": (r"(?:^|\.)layers\.(\d+)\.", "num_hidden_layers"),
    "kiln_encoder": (r"(?:^|\.)layers\.(\d+)\.", "num_hidden_layers"),
    "kiln_decoder": (r"(?:^|\.)layers\.(\d+)\.", "num_hidden_layers"),
}
# a model type Kiln knows no table for (a Hub RoBERTa scored by zero_shot, a ModernBERT converted): its blocks are
# found by the usual names of a block list, its depth by the usual fields
ANY_BLOCKS = r"(?:^|\.)(?:layers?|h|blocks?)\.(\d+)\."
DEPTH_FIELDS = ("num_hidden_layers", "n_layer", "num_layers")


def check_model_folder(
    spec: str,
    option: str,
    config: dict | None = None,
    folder: str | Path | None = None,
    revision: str | None = None,
    trust_pickles: bool = False,
    pickle_fix: str | None = None,
) -> set[str]:
    """The gate (see the module's docstring) for the model folder or Hub id `spec`, named by the command-line
    option `option` in its one-line ConfigError; `config`: its config.json when the caller has read it already;
    `folder`: where its files are, when not at `spec` (a Hub download); `revision`: a Hub id's. Returns the
    weights' names (empty when there are no weights to read so: loading them says why).

    Weights only in torch's pickle format (pytorch_model.bin or its shards, no safetensors): refused in one line
    ending in `pickle_fix` (default: convert them first with `python -m pretrain.convert --trust_pickles`), since
    unpickling a file can run code; with `trust_pickles` (the user's opt-in: convert's `--trust_pickles`) their
    shapes are read from the files, loaded by torch's restricted unpickler (`weights_only`, memory-mapped), and
    checked as safetensors headers are."""
    folder = spec if folder is None else folder
    if config is None:
        try:
            config = read_model_config(str(folder), revision)
        except OSError as err:
            raise ConfigError(
                f"{_name(option, spec)}: cannot read a model from it ({err}); point it at a folder written by "
                "save_pretrained or a Hub id (user/name)"
            ) from None
    from kiln.model_files import weight_shapes

    try:
        shapes = weight_shapes(folder, revision)
        if shapes is None:
            shapes = _pickled_shapes(spec, option, str(folder), revision, trust_pickles, pickle_fix)
    except OSError as err:
        raise ConfigError(f"{_name(option, spec)}: its {err}; copy or save it again") from None
    _check_against(spec, option, config, shapes)
    # an encoder-decoder: each part's config.json section against its part of the weights
    for part in ("encoder", "decoder"):
        if isinstance(config.get(part), dict) and config[part].get("model_type"):
            named = {
                key[len(part) + 1 :]: shape
                for key, shape in (shapes or {}).items()
                if key.startswith(part + ".")
            }
            _check_against(spec, option, config[part], named if shapes is not None else None, f"{part} ")
    return set(shapes or ())


def _pickled_shapes(
    spec: str, option: str, folder: str, revision: str | None, trust: bool, fix: str | None
) -> dict[str, tuple[int, ...]] | None:
    """A folder or Hub repo without safetensors weights: the shapes of its pickled weights when the user opted in
    (`trust`: a local folder's, read by `pickle_weight_shapes`), a one-line refusal naming `fix` when it holds
    pickled weights and the user did not, None when it holds none (or the Hub cannot say)."""
    import os

    from kiln.model_files import hub_pickle_only, pickle_weight_files, pickle_weight_shapes

    if os.path.isdir(folder):
        files = pickle_weight_files(folder)
        if files is None:
            return None
        if trust:
            return pickle_weight_shapes(folder)
        found = os.path.basename(files[0])
        found = f"the shards {found} names" if found.endswith(".index.json") else found
    elif hub_pickle_only(folder, revision):
        found = "pytorch_model.bin"
    else:
        return None
    if fix is None:
        point = f"point {option} at DST" if option else "use DST"
        fix = (
            f"convert them to safetensors first with `python -m pretrain.convert {spec} DST --trust_pickles` (only "
            f"for a file you trust) and {point}"
        )
    raise ConfigError(
        f"{_name(option, spec)}: its weights are only in {found}, torch's pickle format, which Kiln does not "
        f"unpickle unless you opt in (unpickling can run code); {fix}"
    )


def _check_against(
    spec: str, option: str, config: dict, shapes: dict[str, tuple[int, ...]] | None, part: str = ""
) -> None:
    """A config.json (or an encoder-decoder's `part` of it) against the shapes of its weights (None: not known)."""
    model_type = config.get("model_type")
    sizes = _start_sizes(spec, option, config) if model_type in BLOCK_NAMES else dict(config)
    if shapes is None:
        return
    pattern, depth_field = BLOCK_NAMES.get(model_type, (ANY_BLOCKS, None))
    blocks = {int(found.group(1)) for name in shapes if (found := re.search(pattern, name))}
    if depth_field is None:  # another model type: only a depth beyond the blocks found is refused
        depth_field = next((field for field in DEPTH_FIELDS if type(config.get(field)) is int), None)
        if depth_field is not None and blocks and config[depth_field] > len(blocks):
            _refuse_depth(spec, option, part + depth_field, config[depth_field], blocks)
    elif blocks != set(range(sizes[depth_field])):
        _refuse_depth(spec, option, part + depth_field, sizes[depth_field], blocks)
    for what, name, expected, fields in (
        _expected_tensors(model_type, sizes) if model_type in BLOCK_NAMES else []
    ):
        found = [shape for key, shape in shapes.items() if key == name or key.endswith("." + name)]
        if expected not in found:
            raise ConfigError(
                f"{_name(option, spec)}: its weights' {part}{what} are {found[0] if found else 'missing'} but its "
                f"config.json gives {expected} ({fields}){WRONG}"
            )
    _check_every_tensor(spec, option, config, shapes)


def _name(option: str, spec: str) -> str:
    """How a refusal names the model: by the option that gave it, or alone (a command's positional argument)."""
    return f"{option} {spec}" if option else str(spec)


def _refuse_depth(spec: str, option: str, field: str, depth: int, blocks: set[int]) -> None:
    raise ConfigError(
        f"{_name(option, spec)}: its config.json's {field} is {depth} but its weights hold {len(blocks)} blocks{WRONG}"
    )


def _check_every_tensor(spec: str, option: str, config: dict, shapes: dict[str, tuple[int, ...]]) -> None:
    """Every tensor of the weights against the shape the model their config.json names gives it, that model built
    on the `meta` device (shapes without memory; its depth already checked). A tensor the model lacks (another
    head) or the weights lack (a head to be trained, tied weights) is for the loader to judge; a model type
    without a class here (code of its own, unknown to transformers) is not built."""
    import torch

    from kiln.export import quiet_transformers

    model_class = _named_class(config)
    if model_class is None:
        return
    try:
        with quiet_transformers(), torch.device("meta"):
            model = model_class(model_class.config_class.from_dict(config))
    except Exception:  # values its class cannot build with: the load that follows says why, in its own words
        return
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    prefix = f"{model.base_model_prefix}." if model.base_model_prefix else ""
    for key, shape in sorted(shapes.items()):
        # a checkpoint saved from the bare model or with its heads: the loader adds or drops the prefix; old
        # BERT checkpoints name LayerNorm parameters gamma and beta
        plain = key.removesuffix(".gamma") + ".weight" if key.endswith(".gamma") else key
        plain = plain.removesuffix(".beta") + ".bias" if plain.endswith(".beta") else plain
        names = (plain, plain.removeprefix(prefix), prefix + plain)
        name = next((name for name in names if name in expected), None)
        if name is not None and tuple(shape) != expected[name]:
            raise ConfigError(
                f"{_name(option, spec)}: its weights' {key} is {tuple(shape)} but its config.json gives "
                f"{expected[name]} ({model_class.__name__}){WRONG}"
            )


def _named_class(config: dict):
    """The class the config.json names (its first architecture; a Kiln type's pretraining class by default), or
    None: code of its own, a class transformers does not have, or one of another model type."""
    import transformers

    from pretrain import modeling

    model_type, architecture = config.get("model_type"), (config.get("architectures") or [None])[0]
    if model_type in ("kiln_encoder", "kiln_decoder"):
        default = "KilnEncoderForPreTraining" if model_type == "kiln_encoder" else "KilnDecoderForCausalLM"
        named = architecture if isinstance(architecture, str) and architecture.startswith("Kiln") else default
        model_class = getattr(modeling, named, None) or getattr(modeling, default)
    elif carries_code(config) or not isinstance(architecture, str):
        return None
    else:
        model_class = getattr(transformers, architecture, None)
    config_class = getattr(model_class, "config_class", None)
    if config_class is None or getattr(config_class, "model_type", None) != model_type:
        return None
    return model_class


def _start_sizes(spec: str, option: str, config: dict) -> dict:
    """The sizes of a start model's config.json (read as data), checked without building anything: whole numbers
    in range, heads that divide the width (and key-value heads the heads), positive rotary bases. A Kiln config is
    read by its own class (its defaults filled in) and checks itself (`check_values`)."""
    model_type = config["model_type"]
    if model_type in ("kiln_encoder", "kiln_decoder"):
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "embedding_size",
            "num_key_value_heads",
            "type_vocab_size",
        ):
            if isinstance(config.get(name), int) and config[name] > 10**7:  # checked before any loop over it
                raise ConfigError(
                    f"{_name(option, spec)}: its config.json's {name} is {config[name]}, not a size a Kiln model has; "
                    "point it at a folder written by save_pretrained"
                )
        config_class = KilnEncoderConfig if model_type == "kiln_encoder" else KilnDecoderConfig
        try:
            kiln = config_class.from_dict(config)
            kiln.check_values()
        except Exception as err:  # whatever its values make the class raise (ValueError, TypeError, ...)
            raise ConfigError(
                f"{_name(option, spec)}: its config.json: {first_line(err)[:300].rstrip('.')}; point it at a folder "
                "written by save_pretrained"
            ) from None
        names = [
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "position_embedding_type",
            "mlp_type",
        ]
        if model_type == "kiln_encoder":
            names += ["type_vocab_size"]
        sizes = {name: getattr(kiln, name) for name in names}
        if model_type == "kiln_encoder":
            sizes["embedding_size"] = embedding_width(kiln)
        else:
            sizes["num_key_value_heads"] = kiln.num_key_value_heads or kiln.num_attention_heads
        return sizes
    family = CONVERTIBLE[model_type][0]
    sizes = dict(config)
    for field in SHAPE_FIELDS[model_type]:
        value = config.get(field, config.get("hidden_size") if field == "embedding_size" else None)
        if type(value) is not int or not 0 < value <= 10**7:
            raise ConfigError(
                f"{_name(option, spec)}: its config.json's {field} is {value!r}, not a size a {family} model has; "
                "point it at a folder written by save_pretrained"
            )
        sizes[field] = value
    width, heads = ("n_embd", "n_head") if model_type == "gpt2" else ("hidden_size", "num_attention_heads")
    optional = {"n_inner": 4 * sizes["n_embd"]} if model_type == "gpt2" else {}
    if model_type == "llama":
        optional = {"num_key_value_heads": sizes[heads], "head_dim": sizes[width] // sizes[heads]}
    for field, default in optional.items():
        value = sizes[field] = default if config.get(field) is None else config[field]
        if type(value) is not int or not 0 < value <= 10**7:
            raise ConfigError(
                f"{_name(option, spec)}: its config.json's {field} is {value!r}, not a size a {family} model has; "
                "point it at a folder written by save_pretrained"
            )
    if sizes[width] % sizes[heads] or (model_type == "llama" and sizes[heads] % sizes["num_key_value_heads"]):
        divided, by = (width, heads) if sizes[width] % sizes[heads] else (heads, "num_key_value_heads")
        raise ConfigError(
            f"{_name(option, spec)}: its config.json's {by} {sizes[by]} does not divide its {divided} "
            f"{sizes[divided]}, so no {family} model has that shape; point it at a folder written by "
            "save_pretrained"
        )
    if model_type == "llama":
        rope = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else {}
        theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < math.inf:
            where = "rope_parameters' rope_theta" if "rope_theta" in rope else "rope_theta"
            raise ConfigError(
                f"{_name(option, spec)}: its config.json's {where} is {theta!r}, not a finite positive number (the base of "
                "the rotary frequencies); point it at a folder written by save_pretrained"
            )
    return sizes


def _expected_tensors(model_type: str, s: dict) -> list[tuple[str, str, tuple[int, ...], str]]:
    """(what, name after any prefix, shape, the fields that give it) of the tensors whose shapes a model type's
    sizes `s` decide: its embedding tables and its first block's projections."""
    if model_type in ("bert", "electra"):
        h, i = s["hidden_size"], s["intermediate_size"]
        width_field = "embedding_size" if model_type == "electra" else "hidden_size"
        width = s[width_field]
        tensors = [
            (
                "word embeddings",
                "embeddings.word_embeddings.weight",
                (s["vocab_size"], width),
                f"vocab_size, {width_field}",
            ),
            (
                "segment embeddings",
                "embeddings.token_type_embeddings.weight",
                (s["type_vocab_size"], width),
                f"type_vocab_size, {width_field}",
            ),
            (
                "first block's query projection",
                "encoder.layer.0.attention.self.query.weight",
                (h, h),
                "hidden_size",
            ),
            (
                "first block's feed-forward projection",
                "encoder.layer.0.intermediate.dense.weight",
                (i, h),
                "intermediate_size, hidden_size",
            ),
        ]
        if s.get("position_embedding_type", "absolute") == "absolute":
            positions = (s["max_position_embeddings"], width)
            tensors.append(
                (
                    "position embeddings",
                    "embeddings.position_embeddings.weight",
                    positions,
                    f"max_position_embeddings, {width_field}",
                )
            )
        return tensors
    if model_type == "gpt2":
        h = s["n_embd"]
        return [
            ("word embeddings", "wte.weight", (s["vocab_size"], h), "vocab_size, n_embd"),
            ("position embeddings", "wpe.weight", (s["n_positions"], h), "n_positions, n_embd"),
            ("first block's query-key-value projection", "h.0.attn.c_attn.weight", (h, 3 * h), "n_embd"),
            (
                "first block's feed-forward projection",
                "h.0.mlp.c_fc.weight",
                (h, s["n_inner"]),
                "n_embd, n_inner",
            ),
        ]
    h, heads = s["hidden_size"], s["num_attention_heads"]
    if model_type == "llama":
        head = s["head_dim"]
        return [
            ("word embeddings", "embed_tokens.weight", (s["vocab_size"], h), "vocab_size, hidden_size"),
            (
                "first block's query projection",
                "layers.0.self_attn.q_proj.weight",
                (heads * head, h),
                "num_attention_heads, head_dim, hidden_size",
            ),
            (
                "first block's key projection",
                "layers.0.self_attn.k_proj.weight",
                (s["num_key_value_heads"] * head, h),
                "num_key_value_heads, head_dim, hidden_size",
            ),
            (
                "first block's feed-forward projection",
                "layers.0.mlp.gate_proj.weight",
                (s["intermediate_size"], h),
                "intermediate_size, hidden_size",
            ),
        ]
    # Kiln's own: one fused query-key-value projection, a plain or gated (gate and up fused) feed-forward
    head, kv_heads, glu = h // heads, s.get("num_key_value_heads", heads), s["mlp_type"] == "glu"
    encoder = model_type == "kiln_encoder"
    width = s["embedding_size"] if encoder else h
    prefix = "embeddings." if encoder else ""
    tensors = [
        (
            "word embeddings",
            f"{prefix}word_embeddings.weight",
            (s["vocab_size"], width),
            "vocab_size, embedding_size or hidden_size" if encoder else "vocab_size, hidden_size",
        ),
        (
            "first block's query-key-value projection",
            "layers.0.attention.qkv.weight",
            ((heads + 2 * kv_heads) * head, h),
            "hidden_size, num_attention_heads, num_key_value_heads",
        ),
        (
            "first block's feed-forward projection",
            f"layers.0.mlp.{'gate_up' if glu else 'fc_in'}.weight",
            ((2 if glu else 1) * s["intermediate_size"], h),
            "intermediate_size, hidden_size",
        ),
    ]
    if encoder and s["type_vocab_size"]:
        tensors.append(
            (
                "segment embeddings",
                "embeddings.token_type_embeddings.weight",
                (s["type_vocab_size"], width),
                "type_vocab_size",
            )
        )
    if s["position_embedding_type"] == "learned":
        tensors.append(
            (
                "position embeddings",
                f"{prefix}position_embeddings.weight",
                (s["max_position_embeddings"], width),
                "max_position_embeddings",
            )
        )
    return tensors


__all__ = ["check_model_folder"]
