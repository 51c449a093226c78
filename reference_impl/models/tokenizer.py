"""Text in, text out: a checkpoint directory's `tokenizer.json` through the `tokenizers` library (the `[text]`
extra). Encoding follows the file's own rules (its post-processor adds a BOS token where it says
so); no chat template is applied. Decoding drops special tokens.
"""

from __future__ import annotations

from pathlib import Path

TOKENIZER_FILE = "tokenizer.json"
INSTALL_HINT = "pip install 'reference-impl-conformance[text]' (or pip install tokenizers)"


class TokenizerError(ValueError):
    """Text was given but cannot be tokenized: no tokenizer.json, or the `tokenizers` package is missing."""


class TextTokenizer:
    """`encode(text) -> ids` and `decode(ids) -> text` of one tokenizer.json."""

    def __init__(self, path: Path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TokenizerError(f"text prompts need the 'tokenizers' package: {INSTALL_HINT}") from None
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:   # noqa: BLE001 - the library raises a bare Exception on bad files
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TokenizerError(f"{path}: not a readable tokenizer file ({first})") from None
        self.path = path

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        ids = self._tokenizer.encode(text).ids
        if not ids:
            raise TokenizerError(f"the text {text!r} encodes to no tokens")
        return ids

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)


def load_tokenizer(directory: str | Path) -> TextTokenizer:
    """The tokenizer of a checkpoint directory (TokenizerError naming what is missing)."""
    path = Path(directory) / TOKENIZER_FILE
    if not path.is_file():
        raise TokenizerError(f"checkpoint directory {directory} has no {TOKENIZER_FILE}: text prompts need one "
                             "(give token ids instead)")
    return TextTokenizer(path)
