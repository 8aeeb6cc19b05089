"""A quorum's group on its way: what ``Transport.prepare`` returns and ``join`` finishes."""

from __future__ import annotations


class Built:
    """A group built whole by ``prepare`` (a new group per quorum): ``join`` hands it over."""

    def __init__(self, group: object) -> None:
        self.group = group

    def join(self) -> object:
        return self.group

    def drop(self) -> None:
        """Not used (a newer quorum came first): the caller retires the group itself."""


__all__ = ["Built"]
