"""Corpus tools: JSONL in, JSONL out; extract, validate, pairs, mix, eval, generate. No torch."""
