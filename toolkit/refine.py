"""ChatTTS's refine_text: before synthesis, the GPT's text head rewrites each sentence, adding `[uv_break]`,
`[laugh]` and oral tokens, steered by a prompt such as `[oral_2][laugh_0][break_6]`.

As chattts 0.2.5 does it (Chat._refine_text, RefineTextParams): the prompt `[Sbreak]{text}[Pbreak]{prompt}`, text
embeddings only; each step samples one token from the text head over the whole text vocabulary at temperature 0.7,
top-p 0.7, top-k 20 (at least 3 kept), no repetition penalty, at most 384 tokens, and stops at `[Ebreak]`. Of the
tokens before it, those from `[break_0]` on (the prompt-style tokens `[break_N]`, `[laugh_N]`, `[oral_N]`,
`[speed_N]`) are dropped, and the rest decoded to the text the code stage reads. A repetition penalty, if asked
for, is applied as in the code stage (the package's own fails in text mode: its penalty reads (B, n, 1) ids).

Torch-free: the torch Synthesizer and the edge runtime run their own engines around these pieces.
"""

from __future__ import annotations

import re
import warnings
from typing import Callable, Sequence

from .params import SamplingParams
from .text import STRUCTURAL

# RefineTextParams' defaults (chattts 0.2.5), in ttsq's names
REFINE_DEFAULTS = dict(
    temperature=0.7, top_p=0.7, top_k=20, repetition_penalty=1.0, max_new_tokens=384, min_new_tokens=0
)
NEEDED = ("[Sbreak]", "[Pbreak]", "[Ebreak]", "[break_0]")  # the layout, the end token, the first dropped id
EOS = "[Ebreak]"
PROMPT = re.compile(r"(?:\[[a-z]+_\d+\])*")  # control tokens only, e.g. [oral_2][laugh_0][break_6]


class RefineError(ValueError):
    pass


def refine_params(**overrides) -> SamplingParams:
    """ChatTTS's refine sampling settings, with any of them replaced."""
    return SamplingParams(**{**REFINE_DEFAULTS, **overrides})


def check_refinable(tokenizer, text_head: bool = True, no_head: str | None = None) -> None:
    """Raise RefineError unless the model has a text head trained to refine (a ChatTTS checkpoint's).
    text_head False: the model says its head was never trained; no_head: why this model has none at all."""
    missing = [t for t in NEEDED if not tokenizer.has(t)]
    if not text_head:
        why = "its GPT's text head was never trained (manifest text_head: false)"
    elif missing:
        why = f"its tokenizer lacks {', '.join(missing)}"
    elif no_head:
        raise RefineError(f"cannot refine text: {no_head}")
    else:
        return
    raise RefineError(
        f"this model cannot refine text: {why}. Refine needs the trained text head of a ChatTTS "
        "checkpoint (--model with an official ChatTTS folder, or a ttsq folder or export made from "
        "one); ttsq's own voices, the shipped one included, have none. Synthesize without --refine"
    )


def check_prompt(tokenizer, prompt: str) -> str:
    if not PROMPT.fullmatch(prompt):
        raise RefineError(
            f"refine prompt {prompt!r} is not a run of control tokens; write it like [oral_2][laugh_0][break_6]"
        )
    unknown = [t for t in re.findall(r"\[[^\]]+\]", prompt) if not tokenizer.has(t)]
    if unknown:
        raise RefineError(
            f"refine prompt tokens {', '.join(unknown)} are not in this model's vocabulary; "
            "ChatTTS has [oral_0-9], [laugh_0-2], [break_0-7] and [speed_0-9]"
        )
    return prompt


def refine_prompt(sentence: str, prompt: str = "") -> str:
    return f"[Sbreak]{sentence}[Pbreak]{prompt}"


def refined_text(tokenizer, ids: Sequence[int]) -> str:
    """The tokens a refine generated before its end token -> the text the code stage reads. Structural tokens
    ([Stts], [spk_emb], ...) are dropped too: the code prompt places its own."""
    cut = tokenizer.token_id("[break_0]")
    text = tokenizer.decode([i for i in ids if i < cut])
    return re.sub(r"\s+", " ", STRUCTURAL.sub("", text)).strip()


def refined_texts(
    tokenizer, sentences: Sequence[str], rows: Sequence[Sequence[int]], finished: Sequence[bool], max_new_tokens: int
) -> list[str]:
    """Each sentence's generated tokens (before [Ebreak]) -> its refined text; RefineError where one is empty."""
    out = []
    for sentence, ids, done in zip(sentences, rows, finished):
        if not done:
            warnings.warn(
                f"refine of {sentence[:40]!r} reached {max_new_tokens} tokens without {EOS}; its refined "
                "text may be cut",
                stacklevel=3,
            )
        text = refined_text(tokenizer, ids)
        if not text:
            raise RefineError(
                f"refine produced no text for {sentence[:60]!r} (the model ended it at once): try "
                "another --seed, another --refine-prompt, or synthesize without --refine"
            )
        out.append(text)
    return out


def refine_plan(plan, refine_batch: Callable[[list[str], int], list[str]]) -> list[str]:
    """Every text of a Plan refined batch by batch (refine_batch(sentences, b), seeded seed + b by the caller,
    as synthesize() refines them) -> one string per text, its refined sentences joined by spaces."""
    refined: dict[int, str] = {}
    for b, idx in plan.batches():
        refined.update(zip(idx, refine_batch([plan.pieces[k][1] for k in idx], b)))
    return [" ".join(refined[k] for k in ks) for ks in plan.per_text(dict.fromkeys(refined, False))]
