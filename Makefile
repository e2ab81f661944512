# Two commands do all set-up on a fresh machine:
#   make demo   - the main job: the whole chain on an embedded default, no cluster needed
#   make test   - every test: lint, types, Python suites, hook C tests, chart tests
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PROTO_DIR := deviceplugin/vgpu_deviceplugin/api
PROTOS := $(wildcard $(PROTO_DIR)/*.proto)

.PHONY: all venv proto tools lint test test-python test-hook demo crds bench clean

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
	$(VENV)/bin/ruff check operator deviceplugin tests bench
	$(VENV)/bin/mypy

test-hook: venv
	$(MAKE) -C hook test

test-python: venv
	$(VENV)/bin/pytest -q

test: lint test-hook test-python

demo: venv
	-$(MAKE) -s -C hook all fakes >/dev/null 2>&1
	$(VENV)/bin/vgpuctl demo

bench: venv
	$(PY) -m bench

clean:
	rm -rf $(VENV) .tools build dist
	-$(MAKE) -C hook clean
