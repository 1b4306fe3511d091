"""Plans that clients sent a host ahead of their calls, so that each call carries only an id.

A client sends a host each new plan (``protocol.Plans``) and waits for the
answer *before* it submits a call that names the plan. Delivery therefore never
depends on the order in which messages and tasks arrive, and a registration never
waits for another to bring its plan: it finds the plan here, or fails at once.

Owner: the worker's event loop (handlers, calls and dispatch tasks run there); no lock.
"""

from __future__ import annotations

from collections import OrderedDict

from ..errors import PlanMissingError
from ..ops import PLANS_PER_CLIENT, HostPlan


class PlanCache:
    def __init__(self, address: str, per_client: int = PLANS_PER_CLIENT) -> None:
        self.address = address
        self.per_client = per_client
        self._plans: dict[str, OrderedDict[str, HostPlan]] = {}
        self._once: dict[str, str] = {}  # plan id -> client, of plans used once (puts, with data)

    def add(self, client: str, plans: list[HostPlan]) -> None:
        cache = self._plans.setdefault(client, OrderedDict())
        for plan in plans:
            if plan.once:
                self._once[plan.id] = client
            cache[plan.id] = plan
            cache.move_to_end(plan.id)
        while len(cache) > self.per_client:
            self._once.pop(cache.popitem(last=False)[0], None)

    def get(self, client: str, pid: str, plan_id: str) -> HostPlan:
        cache: OrderedDict[str, HostPlan] = self._plans.get(client, OrderedDict())
        plan = cache.get(plan_id)
        if plan is None:
            raise PlanMissingError(
                f"Host {self.address} has no plan {plan_id} for program {pid} of client {client}: "
                "this worker restarted since the client sent it, or the client closed. Call the "
                "program again from a live client on a new mesh"
            )
        if plan.once:
            self.discard(plan_id)
        else:
            cache.move_to_end(plan_id)
        return plan

    def peek(self, client: str, plan_id: str) -> HostPlan | None:
        """Plan ``plan_id`` of ``client`` if this host holds it, else ``None``; it stays unused."""
        cache = self._plans.get(client)
        return None if cache is None else cache.get(plan_id)

    def discard(self, plan_id: str) -> None:
        """Forget a plan used once (a put's, with its data), e.g. when its program is dropped."""
        client = self._once.pop(plan_id, None)
        cache = self._plans.get(client) if client is not None else None
        if cache is not None:
            cache.pop(plan_id, None)

    def drop_client(self, client: str) -> None:
        for plan_id in self._plans.pop(client, {}):
            self._once.pop(plan_id, None)

    def __len__(self) -> int:
        return sum(len(c) for c in self._plans.values())
