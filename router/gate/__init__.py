"""The one gate every request body passes: read within the body budgets, decoded as the endpoint's
request type, and checked against that type's bounds, before anything else is done with it.

A handler that takes a body declares its gate (`opt={"gate": ...}`) and reads its body only by
passing that gate (`Gate.passed`); the app's request class refuses every other read
(`router.gate.gate.GatedRequest`). So an endpoint added later cannot forget the bounds: it cannot
read a body without naming the gate that bounds it.
"""

from router.gate.gate import Gate, GatedRequest, gate_of

__all__ = ["Gate", "GatedRequest", "gate_of"]
