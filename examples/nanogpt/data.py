"""The example's data: a generated character corpus and a stateful batch source.

Nothing is downloaded. ``corpus()`` writes sentences of a small grammar
("the old fox sees a red ball near the river.") from a seeded generator:
every machine gets the same characters, and a tiny model has structure to
learn (spelling, word order, agreement of "a"/"an").

``BatchSource`` deals out the training split in epochs: each epoch a seeded
permutation of ``block_size``-long windows (shifted by a seeded offset, so
that the windows differ from epoch to epoch), of which replica ``rank`` of
``world`` takes every ``world``-th (``shard``). Its state is two ints, the
epoch and the position in it, the same on every replica (all draw the same
number of batches per step, and an epoch is as many batches long on each):
a replica that restores another replica's state goes on in its own shard
where that one goes on in its own. Everything follows from the seed.
"""

from __future__ import annotations

import random

import torch

_WORDS = {
    "det": ["the", "a", "every", "one", "that"],
    "adj": ["old", "red", "quick", "quiet", "small", "green", "odd", "brave", "empty", "tall"],
    "noun": ["fox", "ball", "river", "owl", "tree", "stone", "child", "apple", "house", "engine", "island", "road"],
    "verb": ["sees", "finds", "follows", "carries", "hides", "paints", "counts", "watches"],
    "prep": ["near", "under", "behind", "across", "beside", "over"],
}


def _noun_phrase(rng: random.Random) -> str:
    words = [rng.choice(_WORDS["adj"]) for _ in range(rng.choice((0, 0, 1, 1, 2)))] + [rng.choice(_WORDS["noun"])]
    det = rng.choice(_WORDS["det"])
    if det == "a" and words[0][0] in "aeiou":
        det = "an"
    return " ".join([det, *words])


def corpus(sentences: int = 8000, seed: int = 42) -> str:
    """Sentences of the grammar: noun phrase, verb, noun phrase, maybe a place."""
    rng = random.Random(seed)
    out = []
    for _ in range(sentences):
        s = f"{_noun_phrase(rng)} {rng.choice(_WORDS['verb'])} {_noun_phrase(rng)}"
        if rng.random() < 0.4:
            s += f" {rng.choice(_WORDS['prep'])} {_noun_phrase(rng)}"
        out.append(s + ".")
    return " ".join(out)


class CharData:
    """The corpus as token ids (one per character), split 90/10 into train and val."""

    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        self.vocab_size = len(self.chars)
        lookup = torch.zeros(256, dtype=torch.long)
        lookup[torch.tensor([ord(c) for c in self.chars])] = torch.arange(self.vocab_size)
        ids = lookup[torch.frombuffer(bytearray(text.encode("ascii")), dtype=torch.uint8).long()]
        n = int(0.9 * len(ids))
        self.train, self.val = ids[:n], ids[n:]

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)


class BatchSource:
    """Batches ``(x, y)`` of ``batch_size`` windows of ``data``, ``y`` one
    token ahead of ``x``, an epoch at a time: all of each epoch, or with
    ``shard(rank, world)`` (before the first batch) the part of replica
    ``rank`` of ``world``. ``state_dict()`` is ``{"epoch": int, "position": int}``."""

    def __init__(self, data: torch.Tensor, batch_size: int, block_size: int, seed: int = 0) -> None:
        self.data, self.batch_size, self.block_size, self.seed = data, batch_size, block_size, seed
        self.windows = (len(data) - 1) // block_size - 1  # room for a shift of up to block_size - 1
        self.epoch, self.position = 0, 0
        self._shard: tuple[int, torch.Tensor] | None = None  # (epoch, window starts of this replica)
        self.shard(0, 1)

    def shard(self, rank: int, world: int) -> BatchSource:
        """Deal this replica's part: every ``world``-th window of each epoch, from the ``rank``-th."""
        if not 0 <= rank < world:
            raise ValueError(f"replica {rank} of {world}")
        self.rank, self.world, self._shard = rank, world, None
        self.batches_per_epoch = self.windows // world // self.batch_size  # the same for every rank
        if self.batches_per_epoch < 1:
            raise ValueError(f"{len(self.data)} tokens are not one batch of {self.batch_size}x{self.block_size} "
                             f"for each of {world} replicas")
        return self

    def _starts(self) -> torch.Tensor:
        if self._shard is None or self._shard[0] != self.epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            shift = int(torch.randint(self.block_size, (1,), generator=g))
            order = torch.randperm(self.windows, generator=g)
            self._shard = (self.epoch, shift + self.block_size * order[self.rank :: self.world])
        return self._shard[1]

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.position == self.batches_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
        i = self._starts()[self.position * self.batch_size : (self.position + 1) * self.batch_size]
        self.position += 1
        offsets = i[:, None] + torch.arange(self.block_size + 1)
        chunk = self.data[offsets]
        return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
