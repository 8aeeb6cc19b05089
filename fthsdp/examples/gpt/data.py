"""The example's corpus and batches.

The corpus is generated, not downloaded: sentences of arithmetic facts
("seventeen plus four is twenty-one.") from a seeded generator, so a small
model has real structure to learn and every machine gets the same bytes.

Batches are a pure function of (step, replica rank): replica ``r`` trains on
batch ``(step, r)``. A replica that is out skips its own batches (the global
batch shrinks while it is out); no other replica skips or repeats data.
"""

from __future__ import annotations

import random

import torch

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
         "seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def number(n: int) -> str:
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens] + ("" if ones == 0 else "-" + _ONES[ones])


def corpus(sentences: int = 20000, seed: int = 1234) -> str:
    rng = random.Random(seed)
    out = []
    for _ in range(sentences):
        a, b = rng.randrange(50), rng.randrange(50)
        if rng.random() < 0.5:
            out.append(f"{number(a)} plus {number(b)} is {number(a + b)}.")
        else:
            a, b = max(a, b), min(a, b)
            out.append(f"{number(a)} minus {number(b)} is {number(a - b)}.")
    return " ".join(out)


class Dataset:
    def __init__(self, text: str, block_size: int) -> None:
        self.chars = sorted(set(text))
        self.stoi = {ch: i for i, ch in enumerate(self.chars)}
        self.data = torch.tensor([self.stoi[ch] for ch in text], dtype=torch.long)
        self.block_size = block_size
        split = int(0.9 * len(self.data))
        self.train, self.val = self.data[:split], self.data[split:]

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def batch(self, step: int, replica_rank: int, batch_size: int, seed: int = 0, split: str = "train"):
        """Batch ``(step, replica_rank)``: the same on every machine and every run."""
        data = self.train if split == "train" else self.val
        g = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 1009 + replica_rank) & 0x7FFFFFFF)
        ix = torch.randint(len(data) - self.block_size - 1, (batch_size,), generator=g)
        x = torch.stack([data[i : i + self.block_size] for i in ix])
        y = torch.stack([data[i + 1 : i + 1 + self.block_size] for i in ix])
        return x, y

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)
