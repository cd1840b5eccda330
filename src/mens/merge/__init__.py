"""Adapter -> full weights, and the hand-off to vLLM and Ollama."""
