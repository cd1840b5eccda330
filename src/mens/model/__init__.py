"""Base models, tokenizers, quantization and adapters (imports nothing else of mens except errors).

Run dirs are loaded for inference with `mens.model.inference.load_for_inference(run_dir)`.
"""
