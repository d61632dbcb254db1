"""The README's example app does what its docstring says, in ``conveyor.testing.Engine``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import conveyor
from conveyor.testing import Engine
from examples import shop

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def engine() -> Iterator[Engine]:
    with Engine(shop.app, durable=False) as e:
        yield e


def test_charge_card_succeeds_on_its_third_attempt(engine: Engine) -> None:
    handle = engine.client.enqueue(shop.charge_card, {"order": 1, "amount": 1999})
    engine.drain()
    assert handle.result()["attempts"] == 3


def test_send_receipt_runs_a_minute_later(engine: Engine) -> None:
    handle = engine.client.enqueue(
        shop.send_receipt, {"order": 1, "email": "ada@example.com"}, delay="1m"
    )
    engine.run_until_idle()
    assert handle.status() == "ENQUEUED"
    engine.advance("1m")
    assert handle.result() == {"sent_to": "ada@example.com"}


def test_import_catalog_fails_at_once(engine: Engine) -> None:
    handle = engine.client.enqueue(shop.import_catalog, {"url": "s3://feeds/catalog.csv"})
    engine.drain()
    with pytest.raises(conveyor.TaskFailed) as err:
        handle.result()
    assert err.value.error_class == "FatalError" and handle.get().attempt == 1


def test_fulfil_order_charges_once_packs_in_parallel_and_sleeps(engine: Engine) -> None:
    order = {"order": 2, "amount": 4200, "items": ["MUG", "TEE"]}
    handle = engine.client.enqueue(shop.fulfil_order, order)
    engine.run_until_idle()
    assert handle.status() in ("WAITING", "SLEEPING")
    engine.advance("2s")
    engine.drain()
    result = handle.result()
    assert result["charge"] == {"amount": 4200, "key": f"{handle.id}:charge#0"}
    assert [b["box"] for b in result["boxes"]] == ["box-mug", "box-tee"]
    assert result["receipt"] == "order 2: 2 boxes"
