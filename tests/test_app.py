"""The App facade's declarations: mistakes are refused where they are written."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from streamkit import App, ConfigError, Record


class Order(Record):
    customer: str
    amount: int


@pytest.fixture
def shop() -> App:
    return App("shop", redis_url="redis://127.0.0.1:1")


def test_a_misspelt_processor_setting_is_refused_like_on_app(shop: App) -> None:
    orders = shop.stream("orders", record=Order, partition_by="customer")
    with pytest.raises(ConfigError, match=r"^batchsize: unknown setting.*did you mean batch_size"):
        shop.processor(orders, batchsize=5)


def test_processor_settings_are_validated_at_declaration(shop: App) -> None:
    orders = shop.stream("orders", record=Order, partition_by="customer")
    with pytest.raises(ConfigError, match=r"^batch_size: must be"):
        shop.processor(orders, batch_size=0)


def test_a_sync_processor_is_refused(shop: App) -> None:
    orders = shop.stream("orders", record=Order, partition_by="customer")

    def printer(events: Any) -> None:
        pass

    with pytest.raises(ConfigError, match="'printer' must be an async function"):
        shop.processor(orders)(printer)  # type: ignore[arg-type]
    assert not shop.processors


def test_an_async_generator_processor_is_refused(shop: App) -> None:
    orders = shop.stream("orders", record=Order, partition_by="customer")

    async def printer(events: Any) -> Any:
        yield

    with pytest.raises(ConfigError, match="async generator"):
        shop.processor(orders)(printer)


def test_a_non_function_processor_is_refused(shop: App) -> None:
    orders = shop.stream("orders", record=Order, partition_by="customer")
    with pytest.raises(ConfigError, match=r"expected an async function.*got 42"):
        shop.processor(orders)(42)  # type: ignore[arg-type]


def test_an_object_with_an_async_call_is_accepted(shop: App) -> None:
    orders = shop.stream("orders", record=Order, partition_by="customer")

    class Printer:
        async def __call__(self, events: Any) -> None:
            pass

    shop.processor(orders, name="printer")(Printer())
    assert list(shop.processors) == ["printer"]


def test_a_stream_of_another_app_is_refused(shop: App) -> None:
    other = App("other", redis_url="redis://127.0.0.1:1")
    theirs = other.stream("orders", record=Order, partition_by="customer")
    with pytest.raises(ConfigError, match="belongs to another app"):
        shop.processor(theirs)


def test_sync_background_functions_are_refused(shop: App) -> None:
    def tick() -> None:
        pass

    with pytest.raises(ConfigError, match="'tick' must be an async function"):
        shop.task(tick)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="'tick' must be an async function"):
        shop.timer(interval=1)(tick)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="'tick' must be an async function"):
        shop.crontab("* * * * *")(tick)  # type: ignore[arg-type]


def test_a_partition_count_past_what_a_worker_holds_is_warned_about(
    shop: App, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="streamkit.app"):
        shop.stream("orders", record=Order, partition_by="customer", partition_count=1024)
        assert not caplog.records
        shop.stream("big", record=Order, partition_by="customer", partition_count=10_000)
    [record] = caplog.records
    assert "'big' has 10000 partitions" in record.message
    assert "run at least 10 workers" in record.message
