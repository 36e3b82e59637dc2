"""Kiln's engine, shared by its two apps (`pretrain/`, `finetune/`): its one entrance, where an app hands over a
training job (`kiln.job.run_job`), typed configuration (`kiln.config`), a command's run with its one-line errors
(`kiln.cli`), the one training loop (`kiln.trainer`) and its parts (checkpoints and exact resume:
`kiln.checkpoint_manager`; the loss guard: `kiln.loss_guard`; evaluation: `kiln.evaluation`), the callbacks that
run the lifecycle around it (`kiln.callbacks`), the final export (`kiln.export`) and the Hugging Face Hub
(`kiln.hub`).

Imports nothing heavy here: `--help` of every entry point must answer without torch.
"""
