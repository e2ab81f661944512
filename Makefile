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
	$(PY) -m grpc_tools.protoc -I$(PROTO_DIR) --python_out=$(PROTO_DIR) --pyi_out=$(PROTO_DIR) \
		--grpc_python_out=$(PROTO_DIR) $(PROTOS)
	$(PY) deviceplugin/fix_stub_imports.py $(PROTO_DIR)
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
