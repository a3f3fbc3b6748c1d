"""The partitioned topology's stages as plain objects: messages in, messages out, state in
a KV. Nothing here knows Kafka; ``neardup.kafka`` carries the messages and commits."""
