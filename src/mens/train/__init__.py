"""Fine-tuning: presets, preflight, text policy, packing, the training loop, checkpoints, telemetry.

Entry: `mens.train.run.run_training(TrainConfig)`; the CLI builds the config with `resolve_config`.
"""
