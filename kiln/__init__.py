"""Kiln's engine, shared by its two apps (`pretrain/`, `finetune/`): typed configuration and the command line
(`kiln.config`), the one training loop with checkpoints and exact resume (`kiln.trainer`), the callbacks that
run the lifecycle around it (`kiln.callbacks`), the final export (`kiln.export`) and the Hugging Face Hub
(`kiln.hub`).

Imports nothing heavy here: `--help` of every entry point must answer without torch.
"""
