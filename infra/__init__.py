"""Local infrastructure helpers: a Kafka cluster from Maven Central jars, run without Docker."""
