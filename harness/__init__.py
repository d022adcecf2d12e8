"""What the tests and the benchmarks start for real: an S3 endpoint, Redis and PostgreSQL
servers and an Apache Kafka broker (``harness.servers``; the broker's jars by
``harness.kafka_install``), a Spark standalone cluster (``harness.cluster``) and the numbering
pipeline run on it (``harness.numbering``). Not part of the installed package."""
