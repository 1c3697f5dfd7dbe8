"""Typed records passed between the parts as files: ``events.jsonl`` lines
(:mod:`~libreyolo_core.records.events`) and the job spec ``job.json``
(:mod:`~libreyolo_core.records.job`).

Torch-free (pydantic only): the worker, the service and the SDK's contract test import them
without the engine. ``profile.json`` has its record beside its writer
(:mod:`libreyolo_core.profiler.record`).
"""
