"""``conveyor cluster status``: the nodes of a cluster on Kafka, the partitions, their owners,
epochs and lag, as the nodes' cards in ``<cluster>-nodes`` say (``streams/cluster/directory.py``).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated, Any

import typer

from conveyor.cli.common import console, fail

StatusKafkaOpt = Annotated[
    str,
    typer.Option("--kafka", envvar="CONVEYOR_KAFKA", help="Bootstrap servers of the cluster"),
]


def status(
    kafka: StatusKafkaOpt,
    cluster: Annotated[str, typer.Option("--cluster", help="The cluster's name")] = "conveyor",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document")] = False,
    cluster_secret: Annotated[
        str | None,
        typer.Option(
            "--cluster-secret",
            envvar="CONVEYOR_CLUSTER_SECRET",
            help="The nodes' secret: only the cards signed with it are shown (the others are "
            "counted as refused) [default: every card, unchecked]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Nodes (URL, age of their last card), and every partition: owner, epoch, lag."""
    from aiokafka.errors import KafkaError

    from conveyor.streams.cluster.directory import read_cards
    from conveyor.streams.cluster.signing import ClusterSecret

    key = None
    if cluster_secret is not None:
        try:
            key = ClusterSecret(cluster_secret).card_key(cluster)
        except ValueError as exc:  # its message gives the length, never the value
            raise fail(f"CONVEYOR_CLUSTER_SECRET / --cluster-secret: {exc}") from None
    try:
        cards, refused = asyncio.run(read_cards(kafka, cluster, key))
    except (KafkaError, OSError, TimeoutError) as exc:
        raise fail(f"cannot read the cluster {cluster!r} from Kafka at {kafka}: {exc!r}") from None
    report = summary(cards, int(time.time() * 1000))
    report["cards_checked"] = key is not None
    report["refused_cards"] = refused
    if as_json:
        print(json.dumps(report))
        return
    _print(cluster, report)


def summary(cards: dict[str, dict[str, Any]], now_ms: int) -> dict[str, Any]:
    from conveyor.streams.cluster.directory import owners

    nodes = {
        node_id: {
            "url": card["url"],
            "age_s": round((now_ms - int(card["ts_ms"])) / 1000, 1),
            "leading": sorted(int(p) for p in card.get("leading", {})),
        }
        for node_id, card in sorted(cards.items())
    }
    partitions = {
        str(p): {
            "owner": card["node_id"],
            "epoch": card["leading"][str(p)]["epoch"],
            "lag_records": card["leading"][str(p)]["lag_records"],
        }
        for p, card in sorted(owners(cards).items())
    }
    return {"nodes": nodes, "partitions": partitions}


def _print(cluster: str, report: dict[str, Any]) -> None:
    console.print(f"[bold]cluster {cluster}[/]: {len(report['nodes'])} nodes")
    for node_id, node in report["nodes"].items():
        led = ",".join(map(str, node["leading"])) or "-"
        console.print(
            f"  {node_id:<12} {node['url']:<28} card {node['age_s']:>5} s old  leads {led}"
        )
    console.print("  partition  owner        epoch        lag")
    for p, info in report["partitions"].items():
        console.print(f"  {p:>9}  {info['owner']:<12} {info['epoch']:<12} {info['lag_records']}")
    if not report["partitions"]:
        console.print("  no partition is led (no node has joined, or they all left)")
    if not report["cards_checked"]:
        console.print("  cards not checked: give CONVEYOR_CLUSTER_SECRET to check their signatures")
    for node_id in report["refused_cards"]:
        console.print(
            f"  [red]refused[/]: the card under {node_id!r} is not signed with the secret"
        )
