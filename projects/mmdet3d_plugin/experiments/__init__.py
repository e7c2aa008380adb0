"""The demo and the robustness study: drivers that run the repository's tools in order and report.

The rule: a module belongs here when it sequences whole runs (make data,
train, evaluate, draw, write a report) by starting ``tools/*.py`` scripts;
it starts them only through :mod:`.tool_runner`, so the demo and the study
run a tool with the same command, environment and output. The lie probe is
the one study that runs a trained model in this process: it reads the
router's inputs and the decoding passes, which no tool prints.

* ``demo_pipeline``: ``make demo`` (tools/demo.py);
* ``robustness_study``, ``study_arms``, ``study_report``: ``make study``
  (tools/robustness_study.py);
* ``tool_runner``: how a tool is started (one process, or data-parallel
  training processes);
* ``lie_probe``, ``lie_probe_targets``, ``lie_probe_features``,
  ``lie_probe_run``, ``lie_probe_report``: can the router see a lie?
  (tools/probe_lie_router.py).

Imports ``datasets``, ``utils`` and, for the lie probe, ``apis`` and
``models`` (through the tools it starts, the demo and the study use ``apis``);
it never imports ``tools/``.
"""
