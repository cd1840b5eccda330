"""HTTP serving: an OpenAI- and Ollama-shaped API over a generation engine, optional Vox-constrained decoding."""
