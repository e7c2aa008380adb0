# CMT-AQR: the two commands of README.md.
#   make demo   set up the environment, then run the end-to-end synthetic demo
#               (MODEL=cmt for the baseline, MODEL=cmt_camera for the camera-only model,
#               MODEL=cmt_aqr_fused for CMT-AQR without its camera pass, MODEL=cmt_aqr_heading for
#               CMT-AQR with the heading aids,
#               DEMO_ARGS='--epochs 12' etc. for tools/demo.py)
#   make test   set up the environment, then run the test suite
#   make study  set up the environment, then run the robustness study CMT vs CMT-AQR vs a control
#               (tools/robustness_study.py; STUDY_ARGS='--quick', '--seeds 0 1 2' etc.; its report goes to
#               work_dirs/study/report, STUDY_ARGS='--out docs/robustness' regenerates the one docs/ ships)
SHELL := /bin/bash
CMT_AQR_HOME ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/cmt-aqr
CMT_AQR_VENV ?= $(CMT_AQR_HOME)/venv
PYTHON := $(CMT_AQR_VENV)/bin/python
PYTEST_ARGS ?=
MODEL ?= cmt_aqr
DEMO_ARGS ?=
STUDY_ARGS ?=
export CMT_AQR_HOME CMT_AQR_VENV

.PHONY: setup test demo study

setup:
	bash tools/setup_env.sh

test: setup
	bash tools/run_tests.sh $(PYTEST_ARGS)

demo: setup
	$(PYTHON) tools/demo.py --model $(MODEL) $(DEMO_ARGS)

study: setup
	$(PYTHON) tools/robustness_study.py $(STUDY_ARGS)
