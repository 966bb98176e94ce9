"""Which master the driver's Spark session gets (:mod:`consumer.spark.session`): the one given,
else spark-submit's, else ``$SPARK_MASTER``, else the default. Outside spark-submit: no Spark
session, no JVM."""
from consumer.spark import session
from consumer.spark.session import ENV_SPARK_MASTER, spark_master, under_spark_submit


def test_the_master_given_wins_then_the_environment_then_the_default(monkeypatch):
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.delenv(ENV_SPARK_MASTER, raising=False)
    assert not under_spark_submit() and session.submitted_master() is None
    assert spark_master() == ("local[2]", "local[2]")
    assert spark_master(default="local[4]") == ("local[4]", "local[4]")
    monkeypatch.setenv(ENV_SPARK_MASTER, "  spark://h:7077 ")
    assert spark_master() == ("spark://h:7077", "spark://h:7077")
    assert spark_master("local[1]") == ("local[1]", "local[1]")
    monkeypatch.setenv(ENV_SPARK_MASTER, " ")  # blank: not a master
    assert spark_master() == ("local[2]", "local[2]")


def test_under_spark_submit_its_master_is_taken_and_nothing_is_set_on_the_builder(monkeypatch):
    monkeypatch.setattr(session, "submitted_master", lambda: "yarn")
    monkeypatch.setenv(ENV_SPARK_MASTER, "spark://ignored:7077")
    assert spark_master() == (None, "yarn")
    assert spark_master("local[1]") == ("local[1]", "local[1]")  # the caller's still wins
