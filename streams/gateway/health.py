"""What ``/healthz`` says of the partitions this node leads (a node of a cluster leads some).

    "node": "n1",
    "leading": {"0": {"epoch": 3145729, "lag_records": 0, "lag_s": 0.0, "caught_up": true}},

``caught_up``: the processor has applied every record its log is known to hold. A partition
this node does not lead is not listed: another node of the cluster leads it (``conveyor
cluster status`` shows which).
"""

from __future__ import annotations

from typing import Any

from conveyor.streams.node import Node


def leadership(node: Node) -> dict[str, Any]:
    leading = {
        str(p.partition): {
            "epoch": p.epoch,
            "lag_records": p.lag_records(),
            "lag_s": round(p.lag_s(), 3),
            "caught_up": p.lag_records() == 0,
        }
        for p in node.processors
        if p.leader
    }
    return {"node": node.node_id, "leading": leading}
