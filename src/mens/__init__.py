"""mens: turn a language's own sources and docs into a fine-tuned code assistant that writes code that parses."""

__version__ = "0.1.0"
