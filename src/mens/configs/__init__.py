"""Package data: YAML presets (train_presets.yaml)."""
