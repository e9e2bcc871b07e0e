"""Settings: defaults, environment variables, keyword arguments and validation."""

from __future__ import annotations

import logging
import re

import pytest

from streamkit import App, ConfigError, Settings, _settings as settings_module
from streamkit._cli._supervisor import LIFELINE_VARIABLE, WORKER_INDEX_VARIABLE, worker_environment
from streamkit.lowlevel import MembershipSettings, RebalancerSettings


def test_defaults() -> None:
    settings = Settings.from_env({})
    assert settings.partition_count == 16
    assert settings.max_len is None
    assert (settings.metrics_port, settings.metrics_host) == (None, "127.0.0.1")


def test_component_defaults_are_the_settings_defaults() -> None:
    settings = Settings.from_env({})
    rebalancer = RebalancerSettings()
    membership = MembershipSettings(partitions=1)
    assert settings.grace_period == rebalancer.grace == 5.0
    assert settings.lease_ttl == rebalancer.lease_ttl
    assert settings.heartbeat_interval == membership.heartbeat_interval
    assert settings.session_timeout == membership.session_timeout
    assert settings.static_grace == membership.static_grace


def test_environment_overrides_defaults_and_keywords_override_environment() -> None:
    env = {"STREAMKIT_PARTITION_COUNT": "8", "STREAMKIT_REDIS_URL": "redis://h:1/2"}
    assert Settings.from_env(env).partition_count == 8
    assert Settings.from_env(env, partition_count=4).partition_count == 4
    assert Settings.from_env(env).redis_url == "redis://h:1/2"


def test_zero_is_honoured_not_replaced_by_a_default() -> None:
    settings = Settings.from_env({"STREAMKIT_CONNECT_GIVE_UP_AFTER": "0"})
    assert settings.connect_give_up_after == 0
    assert Settings.from_env({}, connect_timeout=0).connect_timeout == 0


def test_nullable_setting_can_be_unset_from_the_environment() -> None:
    env = {"STREAMKIT_CONNECT_GIVE_UP_AFTER": "none"}
    assert Settings.from_env(env).connect_give_up_after is None


def test_a_setting_without_a_validator_comes_from_the_environment_too() -> None:
    # STREAMKIT_MEMBER_ID (deployment.md's systemd unit) used to raise a TypeError.
    assert Settings.from_env({"STREAMKIT_MEMBER_ID": "host-shop-1"}).member_id == "host-shop-1"
    assert Settings.from_env({"STREAMKIT_MEMBER_ID": ""}).member_id is None


def test_the_worker_index_variable_is_no_unknown_setting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="streamkit.settings"):
        Settings.from_env({"STREAMKIT_WORKER_INDEX": "1"})
    assert not caplog.records


def test_the_variables_a_supervisor_gives_its_workers_are_no_unknown_settings(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # streamkit worker --processes N: every worker warned that STREAMKIT_SUPERVISOR_FD
    # "is not a streamkit setting".
    monkeypatch.setattr(settings_module, "_warned", set())
    env = worker_environment(1, {"STREAMKIT_MEMBER_ID": "host"})
    env[LIFELINE_VARIABLE] = "7"
    env[WORKER_INDEX_VARIABLE] = "1"
    env["STREAMKIT_SUPERVISOR_DF"] = "7"
    with caplog.at_level(logging.WARNING, logger="streamkit.settings"):
        assert Settings.from_env(env).member_id == "host-1"
    # A real typo is still warned about, and only it.
    [record] = caplog.records
    assert "STREAMKIT_SUPERVISOR_DF" in record.message


@pytest.mark.parametrize(
    ("env", "overrides", "named"),
    [
        ({"STREAMKIT_PARTITION_COUNT": "many"}, {}, "STREAMKIT_PARTITION_COUNT"),
        ({"STREAMKIT_PARTITION_COUNT": "0"}, {}, "STREAMKIT_PARTITION_COUNT"),
        ({"STREAMKIT_LEASE_TTL": "-1"}, {}, "STREAMKIT_LEASE_TTL"),
        ({"STREAMKIT_COMPRESSION": "gzip"}, {}, "STREAMKIT_COMPRESSION"),
        ({"STREAMKIT_REDIS_URL": "localhost"}, {}, "STREAMKIT_REDIS_URL"),
        ({}, {"partition_count": -1}, "partition_count"),
        ({}, {"compression": "gzip"}, "compression"),
        ({}, {"lease_ttl": float("inf")}, "lease_ttl"),
        ({}, {"grace_period": float("nan")}, "grace_period"),
        ({}, {"redis_url": "localhost"}, "redis_url"),
        ({}, {"partition_cuont": 3}, "partition_cuont"),
        ({"STREAMKIT_METRICS_PORT": "65536"}, {}, "STREAMKIT_METRICS_PORT"),
        ({}, {"metrics_port": -1}, "metrics_port"),
        ({}, {"metrics_refresh_interval": 0}, "metrics_refresh_interval"),
    ],
)
def test_invalid_values_name_the_setting(
    env: dict[str, str], overrides: dict[str, object], named: str
) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env, **overrides)
    assert named in str(info.value)


def test_app_takes_settings_from_keywords(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMKIT_PARTITION_COUNT", "3")
    app = App("shop", redis_url="redis://example:6380", partition_size=10)
    assert app.settings.partition_count == 3
    assert app.settings.partition_size == 10
    assert app.settings.redis_url == "redis://example:6380"


def test_a_misspelt_setting_names_the_closest_known_one() -> None:
    with pytest.raises(ConfigError, match="did you mean partition_count"):
        Settings.from_env({}, partition_cuont=3)
    with pytest.raises(ConfigError, match=r"^batchsize: unknown setting.*did you mean batch_size"):
        App("shop", batchsize=5)
    with pytest.raises(ConfigError, match="did you mean batch_size"):
        App("shop", settings=Settings.from_env({}), batchsize=5)


def test_unknown_environment_variables_are_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {"STREAMKIT_PARTITON_COUNT": "3", "STREAMKIT_REDIS_URL": "redis://h:1"}
    with caplog.at_level(logging.WARNING, logger="streamkit.settings"):
        assert Settings.from_env(env).partition_count == 16
        Settings.from_env(env)
    [record] = caplog.records
    assert "STREAMKIT_PARTITON_COUNT" in record.message
    assert "did you mean STREAMKIT_PARTITION_COUNT" in record.message


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("127.0.0.1:6379", "write redis://127.0.0.1:6379"),
        ("localhost:6379", "write redis://localhost:6379"),
        ("redis://host/abc", "the path must be a database number"),
        ("redis://host:6379/0/extra", "the path must be a database number"),
        ("redis://host:port", "the port is not a number"),
        ("http://host", "expected redis://, rediss://, unix:// or redis+cluster://"),
        ("redis://:pa/ss@host:6379", "percent-encode it"),
    ],
)
def test_bad_urls_are_refused_with_what_to_write(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=r"^redis_url: ") as info:
        Settings.from_env({}, redis_url=url)
    assert says in str(info.value)
    assert "pa/ss" not in str(info.value)
    with pytest.raises(ConfigError, match=f"^STREAMKIT_REDIS_URL: .*{re.escape(says)}"):
        Settings.from_env({"STREAMKIT_REDIS_URL": url})


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379",
        "redis://127.0.0.1:6379/3",
        "redis://127.0.0.1/",
        "rediss://user:p%40ss@host:6380/0?ssl_cert_reqs=none",
        "redis://:secret@host",
        "unix:///tmp/redis.sock?db=1",
    ],
)
def test_good_urls_are_accepted(url: str) -> None:
    assert Settings.from_env({}, redis_url=url).redis_url == url


@pytest.mark.parametrize(
    "url", ["redis://:s3cret@h:1", "redis://user:s3cret@h:1", "redis://h:1?pass%77ord=s3cret"]
)
def test_the_redis_password_is_not_in_the_repr(url: str) -> None:
    settings = Settings(redis_url=url)
    assert "s3cret" not in repr(settings)
    assert "***" in repr(settings)
    assert settings.redis_url == url
