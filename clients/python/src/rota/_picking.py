"""One pick from the client's side: the request, and whether rota's answer or the local fallback decides.

A :class:`PickAttempt` is made per :meth:`RotaClient.pick` call. It resolves the version (the
current one when none was given), and answers locally at once while the outage short-cut is on
(:class:`~rota.fallback.OutageState`) for a followed service. Otherwise the shell sends
:attr:`PickAttempt.request` and hands the answer to :meth:`~PickAttempt.answered`, or grpc's
error to :meth:`~PickAttempt.failed`, which falls back to the followed service's cache when rota
is unreachable or warming up (:func:`~rota.fallback.falls_back`) and raises otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NoReturn

import grpc

from . import _convert as convert
from ._convert import pb
from .errors import RotaError
from .fallback import SHORTCUT_ERROR, InstanceCache, OutageState, falls_back, local_no_eligible
from .model import PickResult
from .version import current_version


class PickAttempt:
    """The decisions of one pick of ``service``; ``cache`` is the service's followed cache, if any.

    ``local`` is set when the pick is answered without asking rota.
    """

    def __init__(
        self,
        outage: OutageState,
        cache: InstanceCache | None,
        service: str,
        rule: str,
        version: str | None,
        key: str,
        zone: str,
        exclude: Iterable[str],
    ) -> None:
        self._outage = outage
        self._cache = cache
        self.service = service
        self.version = (current_version() or "") if version is None else version
        self.exclude = list(exclude)
        self.local: PickResult | None = None
        if outage.shortcut() and self._followed():
            # rota failed several picks in a row: answer locally for a while without waiting.
            self.local = self._local_pick(SHORTCUT_ERROR)
        self.request: pb.PickRequest = convert.pick_request(service, rule, self.version, key, zone, self.exclude)

    def answered(self, response: pb.PickResponse) -> PickResult:
        """rota's answer as the pick's result."""
        picked = convert.pick_result(response)
        self._outage.answered()
        return picked

    def failed(self, rpc_error: grpc.RpcError) -> PickResult:
        """The local pick for a pick rota did not answer, or raises the :class:`RotaError`."""
        error = RotaError.from_rpc_error(rpc_error)
        if not falls_back(error):
            self._outage.answered()
            _raise(error)
        self._outage.unreachable()
        if not self._followed():
            _raise(error)
        return self._local_pick(error)

    def _followed(self) -> bool:
        return self._cache is not None and self._cache.synced

    def _local_pick(self, error: RotaError) -> PickResult:
        assert self._cache is not None
        picked = self._cache.pick(self.version, self.exclude)
        if picked is None:
            _raise(local_no_eligible(self.service, self.version, error))
        self._outage.picked_locally(self.service, str(error))
        return picked


def _raise(error: RotaError) -> NoReturn:
    # Raised while grpc's error is being handled; that one says nothing the RotaError does not.
    raise error from None
