"""Benchmarks and checks: how fast, how much memory, and whether a machine computes what it should.

The rule: a module belongs here when it measures or checks the library
rather than being part of what a user trains or tests with; its results go
to a table or a pass/fail report, never into a model.

* attention: ``attention_cases``, ``attention_benchmark``,
  ``attention_benchmark_tables`` (tools/benchmark_attention.py),
  ``kernel_registers`` (tools/kernel_registers.py);
* whole models: ``model_benchmark``, ``model_benchmark_tables``,
  ``part_timer``, ``optimizer_step``, ``synthetic_batch``
  (tools/benchmark_model.py), ``device_op_count`` (tools/count_device_ops.py),
  ``train_step_profile`` (tools/profile_train_step.py), ``process_memory``
  (peak memory in a fresh process);
* self-checks: ``gpu_check`` and ``training_check`` (tools/check_gpu.py),
  ``spconv_race_check`` (tools/check_spconv_race.py), ``precision_comparison``
  (tools/compare_attention_precision.py), ``gpu_run_stages`` and ``gpu_targets`` (tools/gpu_run.py).

Imports the library below it (``mmcv_custom``, ``models``, ``attention``,
``utils``, ...), never ``apis`` or ``experiments``.
"""
