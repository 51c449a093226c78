"""A word-level tokenizer for the sampling family's tiny checkpoint, so that vLLM can turn `bad_words` (strings) into
token ids: vLLM tokenizes bad words only when it has a tokenizer (`SamplingParams.update_from_tokenizer`, called by
the input processor; with `skip_tokenizer_init` bad words are silently ignored), and the engine family's
checkpoints come without one.

Token 0 is `<unk>`, 1 `<s>`, 2 `</s>` (the checkpoint's config says bos 1, eos 2); every other id `i` is the word
`w<i>`, split on whitespace. So the bad word "w17 w42" is the token ids [17, 42] whatever vLLM does with a leading
space (its second, space-prefixed encoding gives the same ids and is not added). Written with the `tokenizers`
library as tokenizer.json plus a tokenizer_config.json that transformers' AutoTokenizer (vLLM's loader) reads.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL = ("<unk>", "<s>", "</s>")
EOS_ID = 2


def word(token_id: int) -> str:
    """The text of token `token_id` (a word for ids past the special tokens)."""
    if token_id < 0:
        raise ValueError(f"token id {token_id} is negative")
    return SPECIAL[token_id] if token_id < len(SPECIAL) else f"w{token_id}"


def words(token_ids) -> str:
    """The text of a run of word tokens, as a bad word: 'w17 w42'."""
    ids = [int(t) for t in token_ids]
    special = [t for t in ids if t < len(SPECIAL)]
    if special:
        raise ValueError(f"token ids {special} are special tokens ({', '.join(SPECIAL)}), not words")
    return " ".join(word(t) for t in ids)


def encode(text: str, vocab: int) -> list[int]:
    """The ids the written tokenizer gives `text` (whitespace-split words `w<i>`, i below `vocab`); a word outside
    the vocabulary is refused, not mapped to <unk>, so an oracle never grades a bad word vLLM would read otherwise."""
    ids = []
    for piece in text.split():
        index = SPECIAL.index(piece) if piece in SPECIAL else None
        if index is None:
            if not (piece.startswith("w") and piece[1:].isdigit() and len(SPECIAL) <= int(piece[1:]) < vocab):
                raise ValueError(f"{piece!r} is not a word of the tokenizer (w{len(SPECIAL)} to w{vocab - 1})")
            index = int(piece[1:])
        ids.append(index)
    return ids


def write_tokenizer(directory: Path, vocab: int) -> Path:
    """tokenizer.json and tokenizer_config.json for a vocabulary of `vocab` ids, in `directory` (beside a
    checkpoint); returns `directory`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if vocab <= len(SPECIAL):
        raise ValueError(f"a vocabulary of {vocab} ids has no room for words after {len(SPECIAL)} special tokens")
    table = {word(i): i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(vocab=table, unk_token=SPECIAL[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)   # joins words with a space
    tok.add_special_tokens(list(SPECIAL))
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": SPECIAL[0], "bos_token": SPECIAL[1],
              "eos_token": SPECIAL[2], "model_max_length": 2048, "clean_up_tokenization_spaces": False}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return directory
