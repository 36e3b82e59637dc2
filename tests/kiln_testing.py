"""Helpers shared by test modules: run the pretraining entry point in-process on the debug config."""

import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEBUG = str(REPO / "configs/pretrain/debug.yaml")
DECODER = [
    "--model.kind", "decoder", "--model.hidden_act", "gelu_new", "--model.layer_norm_eps", "1e-5",
    "--data.data_files", str(REPO / "data/tinystories/*.txt"),
]  # fmt: skip


def free_port() -> int:
    """A TCP port free on this machine now, for launches that must agree on one (several nodes); a single-node
    launch takes `--main_process_port 0` and lets accelerate pick."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def reset_accelerate():
    """accelerate keeps process-wide singletons; each in-process run must start from a clean state."""
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    PartialState._reset_state()


def run(output_dir, *overrides):
    """`accelerate launch pretrain/run.py --config configs/pretrain/debug.yaml ...` in this process."""
    from pretrain.run import main

    reset_accelerate()
    try:
        return main(["--config", DEBUG, "--training.output_dir", str(output_dir), *map(str, overrides)])
    finally:
        reset_accelerate()


def losses(output_dir) -> dict[int, float]:
    rows = [json.loads(line) for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["train/loss"] for row in rows if "train/loss" in row}


def tiny_encoder_config(**overrides):
    """A KilnEncoderConfig small enough for unit tests (hidden 32, 2 layers, 4 heads), without dropout."""
    from pretrain.modeling import KilnEncoderConfig

    settings = dict(
        vocab_size=256,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return KilnEncoderConfig(**{**settings, **overrides})


def tiny_decoder_config(**overrides):
    """A KilnDecoderConfig small enough for unit tests (hidden 32, 2 layers, 4 heads), without dropout."""
    from pretrain.modeling import KilnDecoderConfig

    settings = dict(
        vocab_size=256,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=48,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        pad_token_id=0,
    )
    return KilnDecoderConfig(**{**settings, **overrides})
