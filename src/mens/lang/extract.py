"""Pull the code out of a model's answer: the fenced block(s) if any, else the bare text.

Run: `extract_code(output, fence_tags=("vox",))`.
"""

from __future__ import annotations

import re

# ``` or ~~~ fences with an optional info string; the closing fence may be missing (truncated output).
_FENCE = re.compile(r"^[ \t]*(```|~~~)[ \t]*([\w.+-]*)[^\n]*\n(.*?)(?:^[ \t]*\1[ \t]*$|\Z)", re.S | re.M)
_CHAT_MARKERS = ("<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>")


def extract_code(output: str, fence_tags: tuple[str, ...] = ("vox",)) -> str:
    """The code in `output`.

    Preference: fences tagged with one of `fence_tags`, then untagged fences, then any fence; when the
    answer has no fence at all, the whole text (models often answer with bare code). Chat end markers
    that leaked into the text are cut.
    """
    for marker in _CHAT_MARKERS:
        cut = output.find(marker)
        if cut >= 0:
            output = output[:cut]
    blocks = [(m.group(2).lower(), m.group(3)) for m in _FENCE.finditer(output)]
    if not blocks:
        return output.strip("\n") + "\n" if output.strip() else ""
    tagged = [body for tag, body in blocks if tag in fence_tags]
    untagged = [body for tag, body in blocks if not tag]
    chosen = tagged or untagged or [body for _, body in blocks]
    return "\n".join(b.rstrip("\n") for b in chosen) + "\n"
