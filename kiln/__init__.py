"""Kiln's engine, shared by its two apps (`pretrain/`, `finetune/`): its one entrance, where an app hands over a
training job (`kiln.job.run_job`), typed configuration (`kiln.config`), a command's run with its one-line errors
(`kiln.cli`), the one training loop with checkpoints and exact resume
(`kiln.trainer`), the callbacks that run the lifecycle around it (`kiln.callbacks`), the final export
(`kiln.export`) and the Hugging Face Hub (`kiln.hub`).

Imports nothing heavy here: `--help` of every entry point must answer without torch.
"""
