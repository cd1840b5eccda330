"""After training: plots, a one-page HTML report and a Hugging Face model card, from a run directory's files."""
