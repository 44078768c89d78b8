"""llms.json resolution, without a network: env keys, overrides, discovery, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import config
from gateway.core.limits import KeyLimits
from gateway.core.settings import ConfigError
from providers.contract.spec import Retries, Timeouts

PATH = Path("/etc/llms/llms.json")


def parse(text: str, **env: str) -> config.Snapshot:
    return config.parse(text, PATH, env)


def test_providers_keep_file_order_and_routes_follow_it() -> None:
    snapshot = parse('{"providers": {'
                     '"z": {"type": "openai", "base_url": "http://z/v1", "models": {"m": "z-m"}},'
                     '"a": {"type": "openai", "base_url": "http://a/v1", '
                     '      "models": {"m": {"id": "a-m", "context_window": 8192}, "n": "n"}}}}')

    assert [p.name for p in snapshot.providers] == ["z", "a"]
    assert [(r.provider, r.upstream_model) for r in snapshot.routes["m"]] == [
        ("z", "z-m"), ("a", "a-m")]
    assert snapshot.providers[1].models["m"].context_window == 8192


def test_keys_come_from_the_environment_and_a_missing_key_disables_with_a_reason() -> None:
    text = ('{"providers": {'
            '"with": {"type": "openai", "base_url": "http://w/v1", "api_key": "$W_KEY",'
            '         "models": {"m": "m"}},'
            '"without": {"type": "openai", "base_url": "http://x/v1", "api_key": "${X_KEY}",'
            '            "models": {"m": "m"}}}}')

    snapshot = parse(text, W_KEY="secret-value")

    with_key, without = snapshot.providers
    assert with_key.enabled and with_key.api_key is not None
    assert with_key.api_key.reveal() == "secret-value"
    assert "secret-value" not in repr(with_key), "a key never shows in a repr or log"
    assert not without.enabled and without.disabled_reason == "X_KEY is not set"
    assert [r.provider for r in snapshot.routes["m"]] == ["with"]


def test_provider_overrides_merge_over_defaults() -> None:
    snapshot = parse('{"defaults": {"timeouts": {"connect": 3, "total": 100},'
                     '              "retries": {"attempts": 2}},'
                     ' "providers": {"p": {"type": "openai", "base_url": "http://p/v1",'
                     '   "timeouts": {"first_token": 9}, "models": {}}}}')

    spec = snapshot.providers[0]
    assert spec.timeouts == Timeouts(connect=3, first_token=9, idle=60, total=100)
    assert spec.retries == Retries(attempts=2)


def test_server_keys_resolve_and_unset_ones_are_dropped() -> None:
    snapshot = parse('{"server": {"api_keys": ["$K1", "$K2", "literal",'
                     ' {"key": "$K3", "id": "team-a", "requests_per_minute": 60}]},'
                     ' "providers": {}}', K1="sekrit-1", K3="three")

    assert [k.secret.reveal() for k in snapshot.keys] == ["sekrit-1", "literal", "three"]
    assert snapshot.keys[0].limits.key_id.startswith("key-")
    assert "sekrit" not in repr(snapshot.keys[0]), "the id and repr never carry the key"
    assert snapshot.keys[2].limits == KeyLimits("team-a", 60, None)


def test_a_keys_queue_settings_and_their_defaults() -> None:
    snapshot = parse('{"server": {"max_queue": 50, "queue_timeout": 20, "api_keys": ['
                     ' {"key": "a", "id": "chat", "priority": 5, "max_priority": 9,'
                     '  "timeout": 3, "weight": 2}, {"key": "b", "id": "batch"},'
                     ' {"key": "c", "id": "raised", "priority": 4}]}, "providers": {}}')

    assert (snapshot.server.max_queue, snapshot.server.queue_timeout) == (50, 20.0)
    assert [k.limits for k in snapshot.keys] == [
        KeyLimits("chat", priority=5, max_priority=9, timeout=3.0, weight=2),
        KeyLimits("batch"),
        KeyLimits("raised", priority=4, max_priority=4)]  # no higher than it was given
    assert (config.ServerConfig().max_queue, config.ServerConfig().queue_timeout) == (1000, 60)


@pytest.mark.parametrize(("text", "expected"), [
    ('{"providers": ', "not valid JSON at line 1 column 15"),
    ('{"providers": {"p": {"base_url": "x"}}}',
     "providers.p: Object missing required field `type`"),
    ('{"providers": {"p": {"type": "openai", "timeouts": {"connect": "x"}}}}',
     "providers.p.timeouts.connect: Expected `float`"),
    ('{"providers": {"p": {"type": "openai", "timeouts": {"conect": 1}}}}',
     "providers.p.timeouts: Object contains unknown field `conect`"),
    ('{"providers": {"p": {"type": "openai", "retries": {"attempts": 0}}}}',
     "providers.p.retries.attempts: must be greater than 0"),
    ('{"server": {"port": "eighty"}, "providers": {}}', "server.port: Expected `int`"),
    ('{"server": {"max_queue": -1}, "providers": {}}',
     "server.max_queue: Expected `int` >= 0"),
    ('{"server": {"api_keys": [{"key": "k", "priority": "high"}]}, "providers": {}}',
     "server.api_keys[0].priority: Expected `int`"),
    ('{"providers": {}, "extra": 1}', "unknown field `extra`"),
    ('{"providers": {"p": {"type": "openai", "models": {"m": 5}}}}', "providers.p.models"),
    ('{"providers": {"p": {"type": "openai", "base_url": "localhost:8000/v1?key=sk-1"}}}',
     "providers.p.base_url: must be an http:// or https:// URL"),
])
def test_errors_name_the_file_the_field_and_the_problem(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(text)

    assert str(caught.value).startswith(str(PATH))
    assert expected in str(caught.value)
    assert "sk-1" not in str(caught.value)


def test_yaml_is_read_like_json(tmp_path: Path) -> None:
    path = tmp_path / "llms.yaml"
    path.write_text("providers:\n  p:\n    type: openai\n    base_url: http://p/v1\n"
                    "    models:\n      m: upstream-m\n")

    snapshot = config.load(path, environ={})

    assert snapshot.routes["m"][0].upstream_model == "upstream-m"


def test_discovery_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".llms").mkdir(parents=True)
    work.mkdir()
    (home / ".llms" / "llms.json").write_text("{}")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    monkeypatch.delenv("LLMS_CONFIG", raising=False)

    assert config.discover() == home / ".llms" / "llms.json"
    (work / "llms.json").write_text("{}")
    assert config.discover() == work / "llms.json"
    env_file = tmp_path / "from-env.yaml"
    env_file.write_text("{}")
    monkeypatch.setenv("LLMS_CONFIG", str(env_file))
    assert config.discover() == env_file
    assert config.discover(str(work / "llms.json")) == work / "llms.json"
    with pytest.raises(ConfigError, match="config file not found"):
        config.discover(str(tmp_path / "missing.json"))


def test_shipped_config_is_valid_and_lists_the_remote_providers() -> None:
    root = Path(__file__).resolve().parent.parent
    snapshot = config.load(root / "llms.json", environ={})

    names = [p.name for p in snapshot.providers]
    for expected in ("openai", "groq", "openrouter", "together", "deepseek", "mistral", "lilac"):
        assert expected in names
    lilac = next(p for p in snapshot.providers if p.name == "lilac")
    assert lilac.base_url == "https://api.getlilac.com/v1"
    assert any(m.id == "moonshotai/kimi-k2.5" for m in lilac.models.values())
    remote = [p for p in snapshot.providers if p.api_key is not None or p.raw.get("api_key")]
    assert remote and all(not p.enabled and p.disabled_reason.endswith("is not set")
                          for p in remote if p.disabled_reason)
    assert all(not p.enabled for p in remote), "with no keys set, no remote provider is enabled"
