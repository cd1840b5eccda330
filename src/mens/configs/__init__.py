"""Package data: training presets (train/<name>.yaml, indexed by train_presets.yaml) and dogfood's presets
(dogfood/<name>.yaml)."""
