"""The Kafka worker: the engine's stages (``neardup.flow``) as partitioned tasks on an
exactly-once runtime over aiokafka.

``python -m neardup.kafka worker`` runs one worker with settings from NEARDUP_*
variables (``neardup.settings``). The topology is drawn in ``neardup.kafka.topology``.
"""
