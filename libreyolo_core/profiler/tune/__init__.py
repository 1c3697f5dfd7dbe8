"""Tune: profile a configuration, try the levers its verdict names, recommend only real gains.

:func:`run_tune` (``libreyolo profile tune``, a service job of kind ``tune``):

1. **Baseline.** The configuration is profiled ``repeat`` times
   (:func:`~libreyolo_core.profiler.trial.run_trial`; the window is fitted into one epoch).
2. **Candidates.** The trials' verdicts name the levers (:func:`~.levers.candidate_levers`), only
   those that exist on the device: ``dataloader`` -> more ``workers``, ``cache=ram``, a
   lighter augmentation, a larger batch; ``compute`` -> ``amp``, bf16 on a GPU that has it;
   ``host/launch`` -> ``cuda_graph=True``, ``compile=True``, a larger batch; ``memory-pressure``
   -> a smaller batch (``compute`` also tries ``compile=True`` on a GPU). A CPU never tries
   AMP, bf16, CUDA graphs or compile: its verdict is ``dataloader`` (the
   loader levers and a larger batch) or ``compute`` (no lever exists on the device, as
   ``verdict.lever`` says: the answer is "no significant lever on this device").
   Levers that only change speed come first; those that change what is trained (the
   augmentation, the batch) after them. At most ``max_candidates`` are profiled.
3. **Each candidate** is profiled ``repeat`` times the same way and compared with the
   baseline by ``profile compare``
   (:func:`~libreyolo_core.profiler.report.compare_profiles`).
4. **The rule** (:func:`~.levers.judge`). A candidate is *recommendable* only when all hold:

   - ``compare`` calls it significant: ``|delta img/s| > 2 x SE``, ``SE = sqrt(sa^2/na +
     sb^2/nb)``, and the delta is a gain;
   - the gain is at least ``min_gain`` (default 5 %);
   - every candidate trial beat every baseline trial (with 3 trials a side, chance alone
     does that 1 time in 20);
   - the environment does not explain it: ``compare``'s environment note does not say the
     load may explain the delta, or, when it does, the load **cannot** have made the gain:
     a process gets at most the CPU that others leave, so a baseline trial that ran while
     other processes took a share ``f_b`` of the CPU would have run at most
     ``(1 - f_c) / (1 - f_b)`` times faster under the least loaded candidate trial's share
     ``f_c`` (:func:`~.levers.load_bound`); the slowest candidate trial must beat the fastest
     baseline trial so adjusted. The table says so in words whenever it applies.
5. **Combination.** When two or more speed-only levers are recommendable, their union is
   profiled too and recommended if it is recommendable and at least as fast as the best
   single one. The recommendation prefers speed-only levers; a faster lever that changes
   the training is named under ``also`` with what it changes (it is recommended only when
   no speed-only lever is).
6. **Result** (``tune.json``, the ``tune`` event): one row per configuration (img/s mean
   ± std over the trials, step ms, verdict, significant yes/no, gain, the reason), the
   recommended parameter set and the expected epoch time with it; or ``"no significant
   lever on this device"`` with why.

Bounded: ``budget_s`` (the next trial is not started when the mean trial so far would end
past it: the result then says ``status: budget``) and ``max_candidates``. SIGTERM (a
cancelled job) stops after the current step of the current trial (the trainer's own stop)
or before the next trial; ``tune.json`` keeps what was measured, and
:class:`TuneInterrupted` ends the command like an interrupted training run (exit 143). A
re-attempt in the same run directory reuses the trials already finished.

Files in the run directory: ``tune.json``, ``events.jsonl`` (``run_start``, ``progress``
with ``phase: "tuning"``, ``tune_candidate``, ``tune``, ``artifact``, ``run_end``), one
folder per trial under ``trials/`` (``profile.json``, ``timeline.html``; the trial's
printed lines in ``trials/<name>.log``) and ``trials/<configuration>/profile_repeat.json``.

The package's modules: :mod:`.levers` (the options, the levers a verdict names and the
rule), :mod:`.run` (the loop: trials, budget, SIGTERM, ``tune.json`` after each
configuration), :mod:`.record` (a configuration's row, the record of ``tune.json``, its
event and text table; the type is :class:`~libreyolo_core.records.tune.TuneRecord`) and
:mod:`.job` (the service job's entry).
"""

from __future__ import annotations

from libreyolo_core.profiler.tune.job import run_tune_job
from libreyolo_core.profiler.tune.levers import (
    TuneLever,
    TuneOptions,
    candidate_levers,
    judge,
    load_bound,
)
from libreyolo_core.profiler.tune.record import NO_LEVER, SCHEMA, TUNE_NAME, format_tune
from libreyolo_core.profiler.tune.run import TuneInterrupted, run_tune

__all__ = ["TuneOptions", "TuneLever", "TuneInterrupted", "candidate_levers", "judge",
           "load_bound", "run_tune", "run_tune_job", "format_tune", "SCHEMA", "TUNE_NAME",
           "NO_LEVER"]
