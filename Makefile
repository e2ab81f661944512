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

.PHONY: all venv proto tools lint test test-python test-hook demo crds bench clean e2e-build e2e-up e2e-down krew cuda13

all: test

# pip is quiet so the demo's output stays readable; these lines say what the wait is for. -qq on
# the editable install: setuptools prints an informational "Editable installation" notice at -q
# for a package whose folders are not named like its import packages (pyproject.toml).
$(STAMP): pyproject.toml setup.py constraints.txt
	@echo "==> creating $(VENV) and installing the Python dependencies (pip; about 30 s with a warm pip cache, 1-2 min cold)"
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -qq -c constraints.txt -e '.[dev]'
	touch $(STAMP)
	@echo "==> $(VENV) ready"

venv: $(STAMP) proto tools

# gRPC stubs are generated from the project's own .proto, never hand-edited.
proto: $(STAMP)
ifneq ($(PROTOS),)
	# -Ideviceplugin makes the stubs import each other as vgpu_deviceplugin.api.*
	$(PY) -m grpc_tools.protoc -Ideviceplugin --python_out=deviceplugin --pyi_out=deviceplugin \
		--grpc_python_out=deviceplugin $(PROTOS)
endif

# CUDA 13.0's headers, which the device plugin image builds libvgpu.so against
# (deviceplugin/Dockerfile), for the hook's build-cuda13 test: the pinned wheel, apart from the
# venv, whose 12.x cuda.h the hook's tests build against.
CUDA13_H := .tools/cuda13/nvidia/cu13/include/cuda.h
# CUDA 13.1's too, for the hook's abi-coverage test (13.1 names new ABIs of functions it wraps):
# pinned here, since constraints.txt pins the package at 13.0.
CUDA131_H := .tools/cuda131/nvidia/cu13/include/cuda.h
CUDA131 := nvidia-cuda-runtime==13.1.80

tools: $(STAMP)
	$(PY) tests/support/k8s_tools.py

cuda13: $(CUDA13_H) $(CUDA131_H)

$(CUDA13_H): constraints.txt | $(STAMP)
	rm -rf .tools/cuda13
	$(VENV)/bin/pip install -q --no-deps --target .tools/cuda13 -c constraints.txt nvidia-cuda-runtime

$(CUDA131_H): Makefile | $(STAMP)
	rm -rf .tools/cuda131
	$(VENV)/bin/pip install -q --no-deps --target .tools/cuda131 $(CUDA131)

crds: venv
	$(PY) -m vgpu_operator.crd --write

lint: venv
	$(VENV)/bin/ruff check operator deviceplugin tests bench e2e
	$(VENV)/bin/mypy

test-hook: venv cuda13
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
# e2e-build made every tool, so under `make test` a test that finds one missing fails, not skips.
test: export VGPU_REQUIRE_E2E = 1
test: lint test-hook e2e-build test-python

demo: venv
	@echo "==> building libvgpu.so and the fake CUDA driver (hook/; a few seconds)"
	-$(MAKE) -s -C hook all fakes >/dev/null 2>&1
	$(VENV)/bin/vgpuctl demo

bench: venv
	$(PY) -m bench

# The krew plugin archive and its manifest's sha256 (operator/vgpuctl/README.md#shell-completion-and-krew).
krew: venv
	$(PY) -m vgpuctl.krew

clean:
	-[ -x $(PY) ] && $(PY) -m e2e.controlplane down && $(PY) -m e2e.controlplane down --oldest
	rm -rf $(VENV) .tools .e2e .e2e-oldest build dist
	-$(MAKE) -C hook clean
