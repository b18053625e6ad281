"""Stop strings (--stop_strings): a hypothesis stops where generate(stop_strings=..., tokenizer=...)
stops it, and its prediction is cut before the first stop string its text shows.

Where it stops is decided by transformers' own StopStringCriteria, built from the tokenizer and the
strings as generate() builds it, and asked of every row after every token, as generate() asks it.
It matches the vocabulary's token strings (byte-level and byte-fallback tokens as the bytes they
stand for) against the end of the row's token sequence: a stop string completed by the last token,
which may begin in the prompt (or, on an encoder-decoder, in the decoder start token) and may be a
special token's text; a token that completes only part of a multi-byte character is not the
character. In greedy search and sampling each row stops by itself; in beam search generate() marks
a candidate that meets the criterion finished, as one that ends with the end token is, and searches
on with the others, so the criterion also decides which hypotheses survive.

The one thing the engines add: a decoder-only model's batch is padded on the left, and the padding
is no part of the sequence generate() sees for that prompt alone. A row the criterion stops while
its padding lies within the criterion's reach (its longest stop string, in characters or bytes, as
tokens) is asked again on its sequence without the padding (which prompt a row continues is read
from its place among the rows generate() asks about); dropping tokens from the front of a sequence
can only take matches away, never add one, so rows it does not stop need no second look. An
encoder-decoder's batch pads only the encoder's input, which the criterion never reads (it reads
the decoder start token and the generated tokens): generate()'s criterion is handed over as it is.

After generation each returned sequence is cut at the first token on which the criterion stops it
(`Stops.ends`, asked of every prefix of the prompt and continuation), and the prediction is that
continuation's text, decoded as every prediction is (special tokens skipped, spaces not cleaned
up), cut before the first place it shows a stop string (`Stops.cut`). The text can show none (the
stop string began in the prompt, or was a special token's text, which decoding skips) or show one
where the criterion did not stop (a token that completes a multi-byte character only in part
decodes as U+FFFD): the cut is of the text, wherever generation stopped.

The score of a hypothesis that stopped (--num_return_sequences > 1) is generate()'s: its
log-probability up to the token that completed the stop string, normalised by that length.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from ..errors import ModelError

WINDOWS_AT_ONCE = 8192  # prefixes `Stops.ends` asks the criterion about in one call


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    """A continuation's text as predictions are decoded (before the outer spaces are stripped)."""
    return tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


def first_stop(text: str, strings: Sequence[str]) -> int:
    """Where the first stop string starts in `text`; -1 when there is none."""
    found = [i for i in (text.find(s) for s in strings) if i >= 0]
    return min(found) if found else -1


def string_criterion(tokenizer: Any, strings: Sequence[str]) -> Any:
    """transformers' StopStringCriteria, as generate() builds it from `stop_strings`. It raises
    ValueError where generate() would (no token of the vocabulary can end any of the strings)."""
    from transformers.generation.stopping_criteria import StopStringCriteria

    return StopStringCriteria(tokenizer=tokenizer, stop_strings=list(strings))


class Stops:
    """A run's stop strings with the criterion that stops at them."""

    def __init__(self, tokenizer: Any, strings: Sequence[str]) -> None:
        self.strings = tuple(strings)
        self.criterion = string_criterion(tokenizer, strings)
        # The criterion moves its tables to the device of what it is asked; the host-side copy
        # (`ends`) keeps its own, so that a GPU run does not move them back and forth each batch.
        self._host = copy.copy(self.criterion)
        self.reach = int(self.criterion.maximum_token_len)  # the most tokens a match can span

    def cut(self, text: str) -> str:
        """`text` before the first place it shows a stop string (all of it where it shows none)."""
        at = first_stop(text, self.strings)
        return text if at < 0 else text[:at]

    def ends(self, sequences: Sequence[Sequence[int]], begins: Sequence[int]) -> list[int | None]:
        """For each sequence (prompt, or decoder start, then generated tokens; no padding), how many
        generated tokens (those from `begins[i]` on) it has up to and including the first one on
        which the criterion stops it; None where it stops on none."""
        import torch

        found: list[int | None] = [None] * len(sequences)
        windows, owners = [], []  # the last `reach` tokens of every prefix at least that long
        short: dict[int, tuple[list[int], list[Sequence[int]]]] = {}  # shorter prefixes, by length
        for i, (seq, begin) in enumerate(zip(sequences, begins)):
            first_full = max(begin + 1, self.reach)
            for end in range(begin + 1, min(first_full, len(seq) + 1)):
                short.setdefault(end, ([], []))[0].append(i)
                short[end][1].append(seq[:end])
            if len(seq) >= first_full:
                t = torch.tensor(list(seq[first_full - self.reach:]), dtype=torch.long)
                windows.append(t.unfold(0, self.reach, 1))
                owners.extend((i, end) for end in range(first_full, len(seq) + 1))
        hits: list[tuple[int, int]] = []
        for rows, prefixes in short.values():
            stopped = self._host(torch.tensor([list(p) for p in prefixes], dtype=torch.long), None)
            hits.extend((i, len(prefixes[0])) for i, s in zip(rows, stopped.tolist()) if s)
        if windows:
            every = torch.cat(windows)
            # In blocks: the criterion's tables for each window grow with the strings' lengths.
            for at in range(0, every.shape[0], WINDOWS_AT_ONCE):
                stopped = self._host(every[at:at + WINDOWS_AT_ONCE], None)
                hits.extend(owners[at + k] for k in stopped.nonzero()[:, 0].tolist())
        for i, end in hits:
            n = end - begins[i]
            if found[i] is None or n < found[i]:  # type: ignore[operator]
                found[i] = n
        return found

    def generate_criteria(self, padded: Any = None, pads: Sequence[int] = ()) -> Any:
        """generate()'s `stopping_criteria` for one batch. A decoder-only model's: `padded` the
        input ids handed to generate() (its prompts padded on the left, on the model's device),
        `pads` how many padding tokens each of its rows starts with. An encoder-decoder's (no
        arguments): the criterion reads the decoder's tokens, which begin with the decoder start
        token and hold no padding, and the encoder's input is no part of what it reads; the
        criterion is then generate()'s own, as it is, and so is a batch that no row pads."""
        from transformers import StoppingCriteria, StoppingCriteriaList

        criterion, reach, most = self.criterion, self.reach, max(pads, default=0)
        if padded is None or most == 0:
            return StoppingCriteriaList([criterion])
        width = padded.shape[1]

        class Unpadded(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                hits = criterion(input_ids, scores)
                outside = input_ids.shape[1] - reach  # positions before it are beyond the criterion's reach
                if most <= outside or not bool(hits.any()):
                    return hits
                # generate() asks about each prompt's rows together and in the batch's order (one
                # each in greedy search, num_return_sequences when sampling, the candidates of a
                # beam-search step): the row's prompt comes from its place. Not from its tokens: a
                # prompt that starts with the padding token reads the same as a shorter one padded.
                per, rest = divmod(input_ids.shape[0], len(pads))
                rows = hits.nonzero()[:, 0]
                examples = rows // max(per, 1)
                if rest or per == 0 or not bool((input_ids[rows, :width] == padded[examples]).all()):
                    raise ModelError(f"generate() asked the stop-string criterion about {input_ids.shape[0]} rows for "
                                     f"{len(pads)} prompts, not each prompt's rows together in the batch's order, so "
                                     "their left padding cannot be kept out of the match; expected a transformers "
                                     "whose generate() keeps them so")
                for row, example in zip(rows.tolist(), examples.tolist()):
                    if pads[example] > outside:
                        hits[row] = criterion(input_ids[row:row + 1, pads[example]:], scores)[0]
                return hits

        return StoppingCriteriaList([Unpadded()])
