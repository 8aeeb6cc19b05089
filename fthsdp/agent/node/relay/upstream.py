"""The relay's one connection per coordinator address, and which one answers.

Calls go to the coordinator that answered last; one that is unreachable, or
sheds the call, or follows another (UNAVAILABLE, DEADLINE_EXCEEDED,
CANCELLED: ``fthsdp.client.MOVE_ON``) makes the next call go to the next
address, as ``CoordinatorClient`` does for a process of its own. The
channels carry the agent's token and, with TLS, its certificate: a rank's
call is made with the agent's credentials, which are the ones it was given.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from fthsdp.client import CHANNEL_OPTIONS, MOVE_ON
from fthsdp.core.credentials import TlsFiles, bearer_metadata

SERVICE = "/fthsdp.v1.Coordinator/"
"""The prefix of every method the relay forwards."""


class Upstream:
    """The agent's channels to the coordinators (made on the relay's event loop)."""

    def __init__(self, addresses: Sequence[str], token: str, tls: TlsFiles | None) -> None:
        if not addresses:
            raise ValueError("the relay needs at least one coordinator address")
        self.addresses = list(addresses)
        self.metadata = bearer_metadata(token)
        self._credentials = None
        if tls is not None and tls.enabled:
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=tls.read("ca"), private_key=tls.read("key"), certificate_chain=tls.read("cert"))
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._current = 0

    @property
    def secure(self) -> bool:
        """It reaches the coordinators over TLS."""
        return self._credentials is not None

    def channel(self, k: int = 0) -> tuple[int, grpc.aio.Channel]:
        """The channel ``k`` addresses after the one that answered last, with its index."""
        index = (self._current + k) % len(self.addresses)
        address = self.addresses[index]
        channel = self._channels.get(address)
        if channel is None:
            if self._credentials is not None:
                channel = grpc.aio.secure_channel(address, self._credentials, options=CHANNEL_OPTIONS)
            else:
                channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            self._channels[address] = channel
        return index, channel

    def answered(self, index: int) -> None:
        """The coordinator at ``index`` answered: the next calls go there."""
        self._current = index

    def failed(self, index: int, code: grpc.StatusCode | None) -> None:
        """A call to ``index`` ended with ``code``: move on if it says to."""
        if code in MOVE_ON and index == self._current:
            self._current = (index + 1) % len(self.addresses)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
