"""Typed records passed between the parts as files and rows: ``events.jsonl`` lines
(:mod:`~libreyolo_core.records.events`), the job spec ``job.json``
(:mod:`~libreyolo_core.records.job`), a tune's ``tune.json``
(:mod:`~libreyolo_core.records.tune`), a job's ``result``
(:mod:`~libreyolo_core.records.result`) and, in process, a training run's result
(:mod:`~libreyolo_core.records.train`).

Torch-free (pydantic only): the worker, the service and the SDK's contract test import them
without the engine. ``profile.json`` has its record beside its writer
(:mod:`libreyolo_core.profiler.record`).
"""
