"""BERT WordPiece tokenizer read from tokenizer.json with the `tokenizers` library."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer as _HFTokenizer


class Tokenizer:
    def __init__(self, path: str | Path):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer not found: {path} (expected a tokenizers `tokenizer.json`)")
        try:
            self._tok = _HFTokenizer.from_file(str(path))
        except Exception as e:  # the tokenizers library raises a bare Exception on bad JSON
            raise ValueError(f"cannot read tokenizer {path}: {e}. Replace it with a valid tokenizer.json") from e
        self._tok.no_padding()
        self._tok.no_truncation()
        self.path = path
        self.pad_id = self._tok.token_to_id("[PAD]") or 0

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def has(self, token: str) -> bool:
        return self._tok.token_to_id(token) is not None

    def encode(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """-> ids (B, T) long and attention mask (B, T) bool, left-padded like ChatTTS."""
        seqs = [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]
        T = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), T), self.pad_id, dtype=torch.long)
        mask = torch.zeros(len(seqs), T, dtype=torch.bool)
        for i, s in enumerate(seqs):
            if s:
                ids[i, T - len(s) :] = torch.tensor(s)
                mask[i, T - len(s) :] = True
        return ids, mask

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


CONTROL_TOKENS = [
    "[Stts]",
    "[Ptts]",
    "[spk_emb]",
    "[empty_spk]",
    "[Sbreak]",
    "[Pbreak]",
    "[laugh]",
    "[uv_break]",
    "[v_break]",
    "[lbreak]",
    "[pure]",
] + [f"[{k}_{i}]" for k, n in (("speed", 10), ("oral", 10), ("laugh", 3), ("break", 8), ("music", 3)) for i in range(n)]


def build_char_tokenizer(chars: str, path: str | Path) -> Tokenizer:
    """A BERT WordPiece tokenizer over single characters (and ##-continuations), plus ChatTTS's control tokens.
    For ttsq's own small voices, where a 21k-word vocabulary would dwarf the model."""
    from tokenizers import decoders, models, normalizers, pre_tokenizers

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab: dict[str, int] = {t: i for i, t in enumerate(specials)}
    for c in sorted(set(chars) - set(" \t\n")):
        for piece in (c, "##" + c):
            vocab.setdefault(piece, len(vocab))
    tok = _HFTokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(CONTROL_TOKENS)
    tok.save(str(path))
    return Tokenizer(path)
