"""The Vox lab tokenizer: 3 control tokens, the 95 printable ASCII characters and 35 compound Vox tokens
(133 in all), greedy longest match, lossless on ASCII Vox source (newlines and indentation included).

Built as a standard `tokenizers` WordPiece model with an empty continuation prefix (WordPiece's
algorithm *is* greedy longest-match-first) and a Fuse decoder, so `AutoTokenizer` loads it without mens.
Non-ASCII characters are isolated first and become `<unk>` one by one instead of spoiling a whole run.
"""

from __future__ import annotations

from pathlib import Path

CONTROL_TOKENS = ("<pad>", "<unk>", "<eos>")
PRINTABLE_ASCII = tuple(chr(c) for c in range(32, 127))
COMPOUND_TOKENS = (
    "\n", "\t", "    ", "<|im_start|>", "<|im_end|>", "```", "// ",
    "fn ", "let ", "mut ", "return ", "if ", "else ", "match ", "for ", " in ", " to ", "type ", "pub ",
    "import ", "component ", "state ", "view: ", "@table ", "@test", "@endpoint(kind: ",
    "=>", "==", "!=", "<=", ">=", "|>", "->", "true", "false",
)
VOCAB = (*CONTROL_TOKENS, *PRINTABLE_ASCII, *COMPOUND_TOKENS)
assert len(VOCAB) == 133 and len(set(VOCAB)) == 133, "lab vocabulary must be 133 distinct tokens"

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_lab_tokenizer():
    """A `PreTrainedTokenizerFast` over the 133-token lab vocabulary, with a ChatML chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(VOCAB)}
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="<unk>", continuing_subword_prefix="",
                                     max_input_chars_per_word=1 << 30))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\x00-\x7f]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>",
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_lab_tokenizer(out_dir: str | Path):
    tok = build_lab_tokenizer()
    tok.save_pretrained(out_dir)
    return tok
