"""Configuration shared by every tool and the library (:mod:`coordinator.config`): a dataclass
built from a mapping with unknown keys and wrong types refused in one line (the closest key
named, another client's key answered with what to use instead), a TOML file read by its own
table or whole, a key taken by either spelling, librdkafka properties flattened. Pure: files
in a temporary directory, no server."""
from dataclasses import dataclass

import pytest

from coordinator import config
from coordinator.errors import InvalidConfig


@dataclass
class Settings:
    session_timeout_ms: int = 1000
    ratio: float = 0.5
    strategies: tuple = ("range",)
    name: str = "n"

    def validate(self):
        config.positive(self, "session_timeout_ms")


def test_a_mapping_builds_the_dataclass_with_dashes_ints_for_floats_and_lists_for_tuples():
    built = config.build(Settings, {"session-timeout-ms": 5, "ratio": 2, "strategies": ["sticky"]})
    assert built == Settings(5, 2.0, ("sticky",)) and isinstance(built.ratio, float)


@pytest.mark.parametrize("values, message", [
    ({"session_timeout": 5}, "config: unknown key 'session_timeout' (did you mean 'session_timeout_ms'?)"),
    ({"group-id": "g"}, "config: 'group-id' is not taken here: give the group to Consumer()"),
    ({"session_timeout_ms": True}, "config: session_timeout_ms must be int, got True"),
    ({"ratio": float("inf")}, "config: ratio must be a finite number, got inf"),
    ({"name": ["x" * 100]}, "config: name must be str, got ['xxx"),  # a value shown is cut short
    ({"session_timeout_ms": 0}, "session_timeout_ms must be > 0, got 0"),
])
def test_an_unknown_key_or_a_bad_value_is_refused_in_one_line(values, message):
    with pytest.raises(InvalidConfig) as e:
        config.build(Settings, values, hints={"group_id": "give the group to Consumer()"})
    assert str(e.value).startswith(message) and "\n" not in str(e.value) and len(str(e.value)) < 200


def test_a_toml_file_is_read_by_its_own_table_or_whole_and_every_problem_names_the_file(tmp_path):
    path = tmp_path / "zkgroups.toml"
    path.write_text('zk = "top"\n[consumer]\nzk = "mine"\n')
    assert config.load_toml(str(path), "consumer") == {"zk": "mine"}
    assert config.load_toml(str(path), "coordinatord")["zk"] == "top"
    path.write_text("zk = \n")
    with pytest.raises(InvalidConfig, match=f"config file {path} is not valid TOML"):
        config.load_toml(str(path))
    with pytest.raises(InvalidConfig, match=f"config file {tmp_path / 'absent.toml'} does not exist"):
        config.load_toml(str(tmp_path / "absent.toml"))
    with pytest.raises(InvalidConfig, match="is a directory"):
        config.load_toml(str(tmp_path))


def test_a_key_is_taken_by_either_spelling_once_and_with_its_type():
    values = {"check-interval-ms": 5, "other": 1}
    assert config.take(values, "check_interval_ms", int, "coordinatord") == 5 and values == {"other": 1}
    assert config.take(values, "absent", int, "coordinatord", default=7) == 7
    with pytest.raises(InvalidConfig, match="given twice"):
        config.take({"a_b": 1, "a-b": 2}, "a_b", int, "s")
    with pytest.raises(InvalidConfig, match="s: a_b must be a whole number, got True"):
        config.take({"a_b": True}, "a_b", int, "s")


def test_librdkafka_properties_are_flattened_and_their_values_never_shown():
    nested = {"security": {"protocol": "SSL"}, "acks": 1, "enable.idempotence": True}
    assert config.check_kafka_properties(nested, "kafka") == {"security.protocol": "SSL", "acks": 1,
                                                             "enable.idempotence": True}
    with pytest.raises(InvalidConfig) as e:
        config.check_kafka_properties({"sasl.password": ["s3cret"]}, "kafka")
    assert "s3cret" not in str(e.value) and "kafka: sasl.password must be a string, number or boolean" in str(e.value)
