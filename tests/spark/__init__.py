"""Consumer groups on Spark: the sink, the data source and streams (needs pyspark and a Java runtime)."""
