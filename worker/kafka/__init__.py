"""The Kafka worker: the engine as a partitioned faust-streaming application.

``python -m worker.kafka worker`` runs one worker with settings from NEARDUP_*
variables (``worker.settings``). The topology is drawn in ``worker.kafka.app``.
"""
