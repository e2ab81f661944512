# Two commands do all set-up on a fresh machine:
#   make demo   - the main job: the whole chain on an embedded default, no cluster needed
#   make test   - every test: lint, types, hook C tests, all Python suites (the e2e suite on a
#                 real etcd + kube-apiserver + kube-controller-manager, built from pinned Go modules)
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PROTO_DIR := deviceplugin/vgpu_deviceplugin/api
PROTOS := $(wildcard $(PROTO_DIR)/*.proto)

.PHONY: all venv proto tools lint test test-python test-hook demo crds bench clean e2e-build e2e-up e2e-down

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP) proto tools

# gRPC stubs are generated from the project's own .proto, never hand-edited.
proto: $(STAMP)
ifneq ($(PROTOS),)
	# -Ideviceplugin makes the stubs import each other as vgpu_deviceplugin.api.*
	$(PY) -m grpc_tools.protoc -Ideviceplugin --python_out=deviceplugin --pyi_out=deviceplugin \
		--grpc_python_out=deviceplugin $(PROTOS)
endif

tools: $(STAMP)
	$(PY) tests/support/k8s_tools.py

crds: venv
	$(PY) -m vgpu_operator.crd --write

lint: venv
	$(VENV)/bin/ruff check operator deviceplugin tests bench e2e
	$(VENV)/bin/mypy

test-hook: venv
	$(MAKE) -C hook test

test-python: venv
	$(VENV)/bin/pytest -q

# The real control plane (e2e/README.md): built once per pin into ~/.cache/vgpu-operator/e2e.
e2e-build: venv
	$(PY) -m e2e.controlplane build

e2e-up: e2e-build
	$(PY) -m e2e.controlplane up

e2e-down: $(STAMP)
	$(PY) -m e2e.controlplane down

# e2e-build before pytest: a cold build takes minutes, longer than any one test may.
test: lint test-hook e2e-build test-python

demo: venv
	-$(MAKE) -s -C hook all fakes >/dev/null 2>&1
	$(VENV)/bin/vgpuctl demo

bench: venv
	$(PY) -m bench

clean:
	-[ -x $(PY) ] && $(PY) -m e2e.controlplane down && $(PY) -m e2e.controlplane down --oldest
	rm -rf $(VENV) .tools .e2e .e2e-oldest build dist
	-$(MAKE) -C hook clean
