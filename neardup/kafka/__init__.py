"""The Kafka worker: the engine as a partitioned faust-streaming application.

``python -m neardup.kafka worker`` runs one worker with settings from NEARDUP_*
variables (``neardup.settings``). The topology is drawn in ``neardup.kafka.app``.
"""
